"""Files the service's pages load, served by the service itself so that the pages work offline.

Three sources, each an installed package: the page's own files (selector_service/api/ui), plotly.js as the
`plotly` package ships it (plotly/package_data/plotly.min.js) and Swagger UI's and ReDoc's bundles as
the `fastapi-offline` package ships them (fastapi_offline/static). Nothing is copied into this
repository. Each file is named in an allowlist (no path from the request reaches the file system), sent
with its ETag (a browser revalidates instead of fetching it again) and, when the browser accepts it,
gzip-compressed once and kept in memory (plotly.min.js: 4.8 MB, 1.4 MB compressed).

These files hold no data: they are served without the bearer token, like the pages' HTML, and every
figure the pages show comes through the token-checked API.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from fastapi import Request, Response

from selector_service.errors import NotFound, Unavailable

UI_DIR = Path(__file__).resolve().parent / "ui"
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".html": "text/html; charset=utf-8",
}
_COMPRESS_MIN = 1024  # bytes; smaller files go as they are


def package_file(package: str, *parts: str) -> Path:
    """A file inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable(
            f"the Python package {package!r} that ships this page's scripts is not installed; "
            "reinstall rlvr-selector with its dependencies"
        )
    return Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)


#: URL name -> (package or "" for selector_service/api/ui, path inside it).
ASSETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ui.js": ("", ("ui.js",)),
    "auth.js": ("", ("auth.js",)),
    "docs.js": ("", ("docs.js",)),
    "style.css": ("", ("style.css",)),
    "plotly.min.js": ("plotly", ("package_data", "plotly.min.js")),
    "swagger-ui-bundle.js": ("fastapi_offline", ("static", "swagger-ui-bundle.js")),
    "swagger-ui.css": ("fastapi_offline", ("static", "swagger-ui.css")),
    "redoc.standalone.js": ("fastapi_offline", ("static", "redoc.standalone.js")),
    "favicon.png": ("fastapi_offline", ("static", "favicon.png")),
}


@dataclass(frozen=True)
class _Asset:
    body: bytes
    gzipped: bytes | None
    etag: str
    media_type: str


def _path(name: str) -> Path:
    package, parts = ASSETS[name]
    return UI_DIR.joinpath(*parts) if not package else package_file(package, *parts)


@cache
def _load(name: str) -> _Asset:
    body = _path(name).read_bytes()
    etag = '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
    packed = gzip.compress(body, compresslevel=6, mtime=0) if len(body) >= _COMPRESS_MIN else None
    return _Asset(body, packed, etag, _TYPES.get(Path(name).suffix, "application/octet-stream"))


async def asset_response(request: Request, name: str) -> Response:
    """The asset `name` (a key of ASSETS), 304 when the browser holds this version; 404 otherwise."""
    if name not in ASSETS:
        raise NotFound(f"no file {name!r} here")
    try:
        asset = await asyncio.to_thread(_load, name)
    except FileNotFoundError as exc:
        raise Unavailable(
            f"{_path(name)} is missing from its installed package; reinstall rlvr-selector's dependencies"
        ) from exc
    headers = {"ETag": asset.etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
    if asset.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    accepts = request.headers.get("accept-encoding", "")
    if asset.gzipped is not None and "gzip" in accepts:
        headers["Content-Encoding"] = "gzip"
        return Response(asset.gzipped, media_type=asset.media_type, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


#: What the pages may load: their own origin only (no CDN, nothing else). Plotly and ReDoc add inline
#: styles; ReDoc and Swagger UI draw some icons as data: URLs and ReDoc starts a worker from a blob.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
    "font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'self'"
)


def page_headers() -> dict[str, str]:
    return {
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "Cache-Control": "no-cache",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
