"""Two manual pages for the support signals' tests: a copied neighbour's answer ("R 4.1.3", given for 32-bit
Windows) sits on page 1, the entity asked about (macOS) on page 2."""

DOCUMENT = """[page 1]
3 Installing R under Windows
R 4.1.3 was the last version of R to support 32-bit Windows. Rtools uses GCC 10.3.0 there.
[page 2]
4 Installing R under macOS
The macOS build needs macOS 10.13 or later; Xcode provides clang.
Some other line.
"""
PAGE_1 = (DOCUMENT.index("3 Inst"), DOCUMENT.index("[page 2]"))  # character span of page 1's text
PAGE_2 = (DOCUMENT.index("4 Inst"), len(DOCUMENT))
