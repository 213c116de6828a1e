"""The Studio's stylesheet: files shipped in ``steerflow/studio/static`` (no CDN, works offline).

The served sheet is modern-normalize (MIT, vendored with its license beside it) followed
by the Studio's own theme, as one file: one request per page. Pages link it with a
content hash (``?v=``), so the browser may keep it for a year and an upgrade still loads
the new sheet (a different URL).
"""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = ["CACHE_FOREVER", "STYLESHEET", "STYLESHEET_HREF", "STYLESHEET_VERSION"]

#: Files of ``static/`` concatenated, in order: the base first, the theme over it.
_PARTS = ("modern-normalize.css", "studio.css")


def _read(name: str) -> str:
    return resources.files("steerflow.studio").joinpath("static", name).read_text("utf-8")


STYLESHEET: bytes = "\n".join(_read(name) for name in _PARTS).encode("utf-8")
STYLESHEET_VERSION: str = hashlib.sha256(STYLESHEET).hexdigest()[:12]
STYLESHEET_HREF: str = f"/static/studio.css?v={STYLESHEET_VERSION}"
#: The versioned sheet never changes under its URL. ``private``: it is served behind the
#: session cookie, so no shared cache should keep it.
CACHE_FOREVER = "private, max-age=31536000, immutable"
