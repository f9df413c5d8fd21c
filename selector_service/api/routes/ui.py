"""The dashboard page: `GET /ui` (every dataset) and `GET /ui/{dataset}` (one dataset's spec, summary and
history as plots), and the files it loads (`GET /ui/assets/{file}`).

The HTML and the scripts are a shell that holds no data, so they are served without the bearer token
(a browser sends none when it opens a page); the page reads every figure from the token-checked API
(`/datasets`, `/datasets/{name}`, `/datasets/{name}/history`, `/datasets/{name}/beliefs`). With
SELECTOR_API_TOKEN set it asks for the token once, keeps it in the tab's sessionStorage and sends it as
`Authorization: Bearer`; without a token it shows nothing but the form. Plots are drawn by plotly.js
from the installed `plotly` package, and the page's Content-Security-Policy lets it load nothing from
anywhere but this service.
"""

from __future__ import annotations

import html

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from selector_service.api.deps import NamePath
from selector_service.api.static import asset_response, page_headers

router = APIRouter(include_in_schema=False)
METHODS = ["GET", "HEAD"]

TOKEN_FORM = """<div id="gate" class="gate" hidden>
  <form>
    <p data-role="message">This service asks for its API token.</p>
    <input type="password" name="token" autocomplete="off" spellcheck="false" aria-label="API token"
           placeholder="SELECTOR_API_TOKEN">
    <button type="submit">Continue</button>
    <p class="hint">Kept in this browser tab only (sessionStorage) and sent as
      <code>Authorization: Bearer</code> to this service.</p>
  </form>
</div>"""


def root_path(request: Request) -> str:
    root: str = request.scope.get("root_path", "")  # the ASGI scope's root_path is a string
    return root.rstrip("/")


def _page(request: Request, dataset: str) -> HTMLResponse:
    root = html.escape(root_path(request), quote=True)
    title = f"{dataset} - rlvr-selector" if dataset else "rlvr-selector"
    plotly = f'<script src="{root}/ui/assets/plotly.min.js"></script>\n' if dataset else ""
    body = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="{root}/ui/assets/style.css">
</head>
<body data-root="{root}" data-dataset="{html.escape(dataset, quote=True)}">
<header class="bar">
  <a class="brand" href="{root}/ui">rlvr-selector</a>
  <nav id="crumbs"></nav>
  <span id="status" class="status"></span>
  <button id="pause" type="button" hidden>pause</button>
  <button id="forget" type="button" hidden>forget token</button>
  <a class="docs" href="{root}/docs">API docs</a>
</header>
{TOKEN_FORM}
<main id="main"></main>
{plotly}<script src="{root}/ui/assets/auth.js"></script>
<script src="{root}/ui/assets/ui.js"></script>
</body>
</html>
"""
    return HTMLResponse(body, headers=page_headers())


@router.api_route("/ui", methods=METHODS)
async def ui_index(request: Request) -> HTMLResponse:
    return _page(request, "")


@router.api_route("/ui/{name}", methods=METHODS)
async def ui_dataset(request: Request, name: NamePath) -> HTMLResponse:
    return _page(request, name)


@router.api_route("/ui/assets/{file}", methods=METHODS)
async def ui_asset(request: Request, file: str) -> Response:
    return await asset_response(request, file)
