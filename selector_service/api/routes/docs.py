"""The API's own description: the OpenAPI document, Swagger UI and ReDoc, all served by the service.

FastAPI's own pages load Swagger UI and ReDoc from a CDN (a blank page on an offline cluster) and read
the document without a token. Here the pages load the bundles the `fastapi-offline` package ships,
through this service (api/static.py), and the document stays behind the token check when
SELECTOR_API_TOKEN is set (the contract, docs/api.md, opens only /healthz, /readyz and /metrics). The
pages' HTML holds no data, so it is served without the token: its script (ui/docs.js) fetches
/openapi.json with the token the page asks for (ui/auth.js: once per browser tab, the same one /ui
uses), hands the document to Swagger UI or ReDoc, and authorizes Swagger UI with it, so that "Try it
out" sends it and the Authorize button shows it (and can change it). Without a token set, both pages
open at once.
"""

from __future__ import annotations

import html
import json
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse

from selector_service.api.deps import require_token
from selector_service.api.routes.ui import TOKEN_FORM, root_path
from selector_service.api.static import page_headers

OPENAPI_URL = "/openapi.json"
DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
REDOC_URL = "/redoc"

router = APIRouter(include_in_schema=False)
METHODS = ["GET", "HEAD"]


@router.api_route(OPENAPI_URL, methods=METHODS, dependencies=[Depends(require_token)])
async def openapi(request: Request) -> JSONResponse:
    """The OpenAPI document; behind a proxy's root path, that path is listed first among its servers."""
    app, root = request.app, root_path(request)
    schema = app.openapi()
    if root and app.root_path_in_servers:
        server_urls = {s.get("url") for s in schema.get("servers", [])}
        if root not in server_urls:
            schema = dict(schema, servers=[{"url": root}, *schema.get("servers", [])])
    return JSONResponse(schema)


def _page(request: Request, kind: str, title: str, assets: str, config: dict[str, Any]) -> HTMLResponse:
    root = html.escape(root_path(request), quote=True)
    body = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<link rel="icon" type="image/png" href="{root}/ui/assets/favicon.png">
<link rel="stylesheet" href="{root}/ui/assets/style.css">
{assets}
</head>
<body data-root="{root}" data-kind="{kind}" data-openapi="{root}{OPENAPI_URL}"
      data-config="{html.escape(json.dumps(config), quote=True)}">
{TOKEN_FORM}
<div id="docs"></div>
<script src="{root}/ui/assets/auth.js"></script>
<script src="{root}/ui/assets/docs.js"></script>
</body>
</html>
"""
    return HTMLResponse(body, headers=page_headers())


@router.api_route(DOCS_URL, methods=METHODS)
async def swagger_ui(request: Request) -> HTMLResponse:
    app, root = request.app, html.escape(root_path(request), quote=True)
    assets = (
        f'<link rel="stylesheet" href="{root}/ui/assets/swagger-ui.css">\n'
        f'<script src="{root}/ui/assets/swagger-ui-bundle.js"></script>'
    )
    config = {
        "oauth2RedirectUrl": root_path(request) + OAUTH2_REDIRECT_URL,
        "parameters": app.swagger_ui_parameters or {},
        "initOAuth": app.swagger_ui_init_oauth,
    }
    return _page(request, "swagger", f"{app.title} - Swagger UI", assets, config)


@router.api_route(OAUTH2_REDIRECT_URL, methods=METHODS)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.api_route(REDOC_URL, methods=METHODS)
async def redoc(request: Request) -> HTMLResponse:
    root = html.escape(root_path(request), quote=True)
    assets = f'<script src="{root}/ui/assets/redoc.standalone.js"></script>'
    return _page(request, "redoc", f"{request.app.title} - ReDoc", assets, {})
