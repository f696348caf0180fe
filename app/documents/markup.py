"""HTML to text: the page's main content, headings as ``#`` lines, tables as ``a | b`` rows.

Navigation bars, sidebars, page headers and footers, scripts and styles are dropped: in a
manual split into one HTML file per chapter they repeat on every page and say nothing.
"""

from __future__ import annotations

import warnings

from bs4 import BeautifulSoup, Tag, XMLParsedAsHTMLWarning

# Block-level elements end a line; inline ones (<b>, <a>, <span>) must not, or get_text("\n")
# would break sentences apart at every bold word.
_BLOCK_TAGS = (
    "p", "div", "br", "li", "ul", "ol", "table", "section", "article", "header",
    "footer", "blockquote", "pre", "hr", "dd", "dt", "figcaption", "title", "main",
)  # fmt: skip
_INVISIBLE_TAGS = ("script", "style", "noscript", "template", "svg", "button", "form", "iframe")
_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")

# Boilerplate by element, ARIA role and the class names of the common generators
# (DocBook's navheader/navfooter, Sphinx's related/sphinxsidebar/headerlink, blogs' navbars).
_BOILERPLATE_TAGS = ("nav", "aside")
_BOILERPLATE_ROLES = frozenset({"navigation", "banner", "contentinfo", "search", "complementary"})
_BOILERPLATE_CLASSES = frozenset({
    "navheader", "navfooter", "sphinxsidebar", "related", "headerlink", "footer", "header",
    "sidebar", "navbar", "breadcrumb", "breadcrumbs", "menu", "skip-link", "cookie-banner",
})  # fmt: skip


def html_to_text(markup: bytes | str) -> str:
    """The readable text of one HTML page (bytes keep the page's own ``<meta charset>``)."""
    with warnings.catch_warnings():
        # XHTML (EPUB chapters) reads fine with the HTML parser, which also forgives the broken
        # markup common in real e-books where the strict XML parser would drop text.
        warnings.simplefilter("ignore", XMLParsedAsHTMLWarning)
        soup = BeautifulSoup(markup, "lxml")
    # One traversal of the tree; every step below filters this list (each find_all walks it all).
    tags = soup.find_all(True)
    root = _main_content(tags) or soup.body or soup
    tags = _drop_boilerplate(tags, root)
    for heading in (tag for tag in tags if tag.name in _HEADINGS):
        title = " ".join(heading.get_text(" ").split())
        level = int(heading.name[1])
        heading.replace_with(f"\n\n{'#' * level} {title}\n\n" if title else "")
    for tag in tags:
        if tag.name in _BLOCK_TAGS:
            tag.insert_after("\n")
        if tag.name == "table":
            tag.insert_before("\n")
    for row in (tag for tag in tags if tag.name == "tr"):
        # Paragraphs inside a cell end with the line breaks inserted above: spaces in the row.
        cells = [" ".join(cell.get_text().split()) for cell in row.find_all(("td", "th"))]
        row.replace_with(" | ".join(cell for cell in cells if cell) + "\n")
    text = root.get_text()
    # Source indentation is meaningless in HTML; drop it per line.
    return "\n".join(line.strip() for line in text.splitlines())


def _main_content(tags: list[Tag]) -> Tag | None:
    """``<main>`` or ``role="main"`` when the page marks exactly one, else its one ``<article>``."""
    for candidates in ([tag for tag in tags if tag.name == "main" or tag.get("role") == "main"],
                       [tag for tag in tags if tag.name == "article"]):
        if len(candidates) == 1:
            return candidates[0]
    return None


def _drop_boilerplate(tags: list[Tag], root: Tag | BeautifulSoup) -> list[Tag]:
    """Decompose invisible and boilerplate elements (never ``root`` or its ancestors); the rest of ``tags``."""
    protected = {id(root), *(id(parent) for parent in root.parents)}
    dropped: set[int] = set()
    for tag in tags:
        if id(tag) in dropped or id(tag) in protected:
            continue
        if tag.name in _INVISIBLE_TAGS or _is_boilerplate(tag):
            dropped.add(id(tag))
            dropped.update(id(inner) for inner in tag.find_all(True))
            tag.decompose()
    return [tag for tag in tags if id(tag) not in dropped]


def _is_boilerplate(tag: Tag) -> bool:
    if tag.name in _BOILERPLATE_TAGS:
        return True
    if tag.get("role") in _BOILERPLATE_ROLES:
        return True
    if _BOILERPLATE_CLASSES.intersection(tag.get("class") or ()):
        return True
    # A page-level <header>/<footer> is site chrome; one inside an article holds its title or byline.
    return tag.name in ("header", "footer") and tag.find_parent(("article", "main", "section")) is None
