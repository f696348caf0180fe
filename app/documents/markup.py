"""HTML to text: the page's main content, headings as ``#`` lines, tables as ``a | b`` rows.

Navigation bars, sidebars, page headers and footers, scripts and styles are dropped: in a
manual split into one HTML file per chapter they repeat on every page and say nothing.

The tree is lxml's own (faster to build than BeautifulSoup's: docs/benchmarks/extraction.md); BeautifulSoup's
``UnicodeDammit`` only picks the encoding.
"""

from __future__ import annotations

import re

import lxml.html
from bs4 import UnicodeDammit
from lxml import etree

# Block-level elements end a line; inline ones (<b>, <a>, <span>) must not, or the text would
# break sentences apart at every bold word.
_BLOCK_TAGS = frozenset({
    "p", "div", "br", "li", "ul", "ol", "table", "section", "article", "header",
    "footer", "blockquote", "pre", "hr", "dd", "dt", "figcaption", "title", "main",
})  # fmt: skip
_INVISIBLE_TAGS = frozenset({"script", "style", "noscript", "template", "svg", "button", "form", "iframe"})
_HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6"})

# Boilerplate by element, ARIA role and the class names of the common generators
# (DocBook's navheader/navfooter, Sphinx's related/sphinxsidebar/headerlink, blogs' navbars).
_BOILERPLATE_TAGS = frozenset({"nav", "aside"})
_BOILERPLATE_ROLES = frozenset({"navigation", "banner", "contentinfo", "search", "complementary"})
_BOILERPLATE_CLASSES = frozenset({
    "navheader", "navfooter", "sphinxsidebar", "related", "headerlink", "footer", "header",
    "sidebar", "navbar", "breadcrumb", "breadcrumbs", "menu", "skip-link", "cookie-banner",
})  # fmt: skip
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>")


def html_to_text(markup: bytes | str) -> str:
    """The readable text of one HTML page (bytes keep the page's own ``<meta charset>``)."""
    if isinstance(markup, bytes):
        markup = UnicodeDammit(markup, is_html=True).unicode_markup or ""
    # XHTML (EPUB chapters) reads fine with the HTML parser, which also forgives the broken
    # markup common in real e-books where a strict XML parser would drop text.
    markup = _XML_DECLARATION.sub("", markup, count=1)  # lxml refuses it in a str
    if not markup.strip():
        return ""
    try:
        document = lxml.html.document_fromstring(markup)
    except (etree.ParserError, ValueError):
        return ""
    root = _main_content(document)
    _drop_boilerplate(document, root)
    elements = [element for element in root.iter() if isinstance(element.tag, str)]
    for element in elements:
        if element.tag in _BLOCK_TAGS:
            element.tail = "\n" + (element.tail or "")
        if element.tag == "table":
            element.text = "\n" + (element.text or "")
    for heading in (element for element in elements if element.tag in _HEADINGS):
        # As rendered: "Sto<i>rm</i>" is one word, a <br> inside a heading a space.
        title = " ".join(heading.text_content().split())
        _replace_content(heading, f"\n\n{'#' * int(heading.tag[1])} {title}\n\n" if title else "")
    for row in (element for element in elements if element.tag == "tr"):
        # Paragraphs inside a cell end with the line breaks added above: spaces in the row.
        cells = [" ".join(cell.text_content().split()) for cell in row.iter("td", "th")]
        _replace_content(row, " | ".join(cell for cell in cells if cell) + "\n")
    # Source indentation is meaningless in HTML; drop it per line.
    return "\n".join(line.strip() for line in root.text_content().splitlines())


def _main_content(document: lxml.html.HtmlElement) -> lxml.html.HtmlElement:
    """``<main>`` or ``role="main"`` when the page marks exactly one, else its one ``<article>``, else ``<body>``."""
    for candidates in (document.xpath("//main | //*[@role='main']"), document.xpath("//article")):
        if len(candidates) == 1:
            return candidates[0]
    body = document.find("body")
    return body if body is not None else document


def _drop_boilerplate(document: lxml.html.HtmlElement, root: lxml.html.HtmlElement) -> None:
    """Remove invisible and boilerplate elements (never ``root`` or its ancestors); their tails stay."""
    protected = {root, *root.iterancestors()}
    doomed = [element for element in document.iter()
              if not isinstance(element.tag, str)  # comments, processing instructions
              or (element not in protected and (element.tag in _INVISIBLE_TAGS or _is_boilerplate(element)))]
    for element in doomed:
        if element.getparent() is not None:
            element.drop_tree()


def _is_boilerplate(element: lxml.html.HtmlElement) -> bool:
    if element.tag in _BOILERPLATE_TAGS:
        return True
    if element.get("role") in _BOILERPLATE_ROLES:
        return True
    if _BOILERPLATE_CLASSES.intersection((element.get("class") or "").split()):
        return True
    # A page-level <header>/<footer> is site chrome; one inside an article holds its title or byline.
    return element.tag in ("header", "footer") and not any(
        ancestor.tag in ("article", "main", "section") for ancestor in element.iterancestors())


def _replace_content(element: lxml.html.HtmlElement, text: str) -> None:
    for child in list(element):
        element.remove(child)
    element.text = text
