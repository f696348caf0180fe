"""The one way the app puts data into HTML: file names, page labels, document text, model names, error messages,
anything a document, a file name, a visitor or a model controls.

Every panel, toast and chat line built in ``app/`` escapes through here (``tests/app/test_render_escaping.py`` fails
on any other ``html.escape`` in ``app/``), so a ``<img onerror=…>`` in a name or a page is shown as text wherever it
lands. Both functions escape quotes too, so the same value is safe inside an attribute.
"""

from __future__ import annotations

import html as _html


def text(value: object) -> str:
    """``value`` as HTML text (element content or a quoted attribute value): ``& < > " '`` escaped."""
    return _html.escape(str(value), quote=True)


def attr(value: object) -> str:
    """``value`` as a quoted attribute value; the same escaping as ``text``, named so the call site says where it
    goes."""
    return text(value)
