"""The console's files, read from the package (no CDN: the console works offline).

Shared by the local server and the signing proxy, so both serve the same bytes with the same headers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Final

#: Where the console lives on the server.
PREFIX: Final = "/console"

_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
_FILES: Final = {
    "/": "index.html",
    "": "index.html",
    "/console.js": "console.js",
    "/console.css": "console.css",
}

#: The pages load only their own files and talk only to their own origin; nothing may frame them.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self';"
        " base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True, slots=True)
class Asset:
    content_type: str
    body: bytes

    def headers(self) -> dict[str, str]:
        return {"Content-Type": self.content_type, **SECURITY_HEADERS}


def is_console_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


@cache
def _read(name: str) -> bytes:
    return resources.files("querator.console").joinpath("static").joinpath(name).read_bytes()


def find(path: str) -> Asset | None:
    """The file served at ``path`` (``/console``, ``/console/``, ``/console/console.js``…), or ``None``."""
    if not is_console_path(path):
        return None
    name = _FILES.get(path[len(PREFIX) :])
    if name is None:
        return None
    return Asset(_TYPES[name[name.rindex(".") :]], _read(name))


def config(*, read_only: bool, target: str, refresh_ms: int = 5000) -> Asset:
    """``/console/config.json``: what the pages need to know about where they run."""
    body = json.dumps({"read_only": read_only, "target": target, "refresh_ms": refresh_ms}).encode()
    return Asset("application/json", body)


def total_size() -> int:
    """Bytes of every console file: the page's whole weight before API calls (docs/console.md)."""
    return sum(len(_read(name)) for name in set(_FILES.values()) | {"console.js", "console.css"})
