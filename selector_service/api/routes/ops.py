"""Operations: liveness, readiness and Prometheus metrics. Open even when a token is configured, so
that probes and scrapers need no secret; they reveal no beliefs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from selector_service.api.deps import EngineDep
from selector_service.contract.schemas import Health

router = APIRouter(tags=["ops"])


@router.get("/healthz", response_model=Health, summary="Liveness", operation_id="healthz")
async def healthz() -> Health:
    """200 while the process serves HTTP; it does not ask the store (see /readyz)."""
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Health,
    responses={503: {"model": Health}},
    summary="Readiness",
    operation_id="readyz",
)
async def readyz(engine: EngineDep) -> Any:
    """200 when the belief store answers a ping within the store timeout, 503 when it does not."""
    if await engine.ready():
        return Health(status="ready")
    return JSONResponse({"status": "not ready", "detail": "the belief store is unreachable"}, status_code=503)


@router.get("/metrics", response_class=Response, summary="Prometheus metrics", operation_id="metrics")
async def prometheus_metrics(request: Request, engine: EngineDep) -> Response:
    """Prometheus text format. Dataset gauges come from a catch-up with the store that may take at
    most SELECTOR_METRICS_WAIT_S; a slower one (a frozen store, a long replay) goes on in the
    background and this scrape reports the last complete figures."""
    body = await request.app.state.scrape.render(engine)
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
