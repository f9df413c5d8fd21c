"""The API's own description: the OpenAPI document, Swagger UI and ReDoc.

FastAPI serves these itself, open to anyone. The contract (docs/api.md) opens only /healthz, /readyz and
/metrics when SELECTOR_API_TOKEN is set, so they are served here instead, behind the same token check
as every data endpoint; without a token they answer exactly as FastAPI's own would. A browser sends no
bearer token by itself: with a token set, read the document with a client that sends the header.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, JSONResponse

from selector_service.api.deps import require_token

OPENAPI_URL = "/openapi.json"
DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
REDOC_URL = "/redoc"

router = APIRouter(dependencies=[Depends(require_token)], include_in_schema=False)
METHODS = ["GET", "HEAD"]


def _root_path(request: Request) -> str:
    return request.scope.get("root_path", "").rstrip("/")


@router.api_route(OPENAPI_URL, methods=METHODS)
async def openapi(request: Request) -> JSONResponse:
    """The OpenAPI document; behind a proxy's root path, that path is listed first among its servers."""
    app, root_path = request.app, _root_path(request)
    schema = app.openapi()
    if root_path and app.root_path_in_servers:
        server_urls = {s.get("url") for s in schema.get("servers", [])}
        if root_path not in server_urls:
            schema = dict(schema, servers=[{"url": root_path}, *schema.get("servers", [])])
    return JSONResponse(schema)


@router.api_route(DOCS_URL, methods=METHODS)
async def swagger_ui(request: Request) -> HTMLResponse:
    app, root_path = request.app, _root_path(request)
    return get_swagger_ui_html(
        openapi_url=root_path + OPENAPI_URL,
        title=f"{app.title} - Swagger UI",
        oauth2_redirect_url=root_path + OAUTH2_REDIRECT_URL,
        init_oauth=app.swagger_ui_init_oauth,
        swagger_ui_parameters=app.swagger_ui_parameters,
    )


@router.api_route(OAUTH2_REDIRECT_URL, methods=METHODS)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.api_route(REDOC_URL, methods=METHODS)
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url=_root_path(request) + OPENAPI_URL, title=f"{request.app.title} - ReDoc")
