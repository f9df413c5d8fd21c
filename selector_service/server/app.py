"""The service's FastAPI app: settings, store and engine wired to the routers of the REST contract.
`create_app` builds it; `worker_app` is the factory each worker of `serve --workers N` loads.

The HTTP layer lives in `selector_service.api`: dependencies (deps.py), one router per resource
(routes/), the ASGI middlewares (middleware.py) and the error handlers (errors.py). Routes parse, call
one engine function and return a model; errors are always `{"detail": "<what was wrong and what to
do>"}`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from redis.exceptions import RedisError

from selector_service import __version__
from selector_service.api import metrics
from selector_service.api.errors import add_error_handlers
from selector_service.api.middleware import BodyLimit, ContractVersion, InternalErrors, RequestMetrics
from selector_service.api.openapi import document_models
from selector_service.api.routes import datasets, docs, history, ops, selection, ui
from selector_service.contract.schemas import ObserveRequest
from selector_service.replication.engine import Engine
from selector_service.replication.memory import human
from selector_service.server.lifetime import EXIT_ORPHANED, die_with_parent
from selector_service.server.startup import store_lost
from selector_service.settings import Settings
from selector_service.storage.store import Store, connect, durability_problems

log = logging.getLogger("selector_service")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Connects to the store and starts the engine; at shutdown stops a metrics refresh still running,
    the engine's background work and the store connection."""
    settings: Settings = app.state.settings
    if settings.redis_url is None:
        raise RuntimeError(
            "no store configured: set SELECTOR_REDIS_URL or start with `selector-service serve`"
        )
    try:
        client = await connect(settings.redis_url, settings.store_timeout_s)
    except (RedisError, OSError) as exc:  # serve's check passed a moment ago: exit 2, one line (startup.py)
        raise store_lost(settings.redis_url, exc) from None
    for problem in await durability_problems(client):
        log.warning("%s (docs/operations.md)", problem)
    store = Store(client, settings.key_prefix, settings.request_id_ttl_s, settings.max_step_gap)
    engine = Engine(store, settings)
    engine.catchup_observer = metrics.CATCHUP.observe
    log.info(
        "memory budget for datasets: %s (SELECTOR_MEMORY_BUDGET_BYTES%s)",
        human(engine.memory_budget),
        "" if settings.memory_budget_bytes else ", automatic",
    )
    app.state.engine = engine
    try:
        yield
    finally:
        app.state.scrape.cancel()
        await engine.close()
        await store.close()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(
        title="rlvr-selector",
        version=__version__,
        summary="Which prompts should the next RL step train on? Per-prompt Bayesian beliefs over REST.",
        lifespan=lifespan,
        # Served by routes/docs.py: the document behind the token when one is configured, the pages
        # with their assets from the service itself (offline).
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.scrape = metrics.Scrape(
        settings.max_group_labels, settings.metrics_wait_s, settings.metrics_max_datasets
    )
    app.include_router(datasets.router)
    app.include_router(history.router)
    app.include_router(selection.router)
    app.include_router(ops.router)
    app.include_router(docs.router)
    app.include_router(ui.router)
    add_error_handlers(app)
    document_models(app, (ObserveRequest,))
    app.add_middleware(InternalErrors)  # innermost: its 500 is counted by RequestMetrics
    app.add_middleware(RequestMetrics)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, import_limit=settings.max_import_bytes)
    app.add_middleware(ContractVersion)  # outermost: every answer names the contract's version
    return app


def worker_app() -> FastAPI:
    """The app factory of a `serve --workers N` worker (a multiprocessing child of serve).

    It asks for SIGTERM when serve dies (the worker then shuts down like on any SIGTERM), then checks
    that serve is still its parent: one killed before the request took effect has left the worker to
    init, and no signal will ever come, so the worker exits at once. Settings come from the environment
    serve prepared."""
    parent = multiprocessing.parent_process()
    if parent is not None:
        die_with_parent(signal.SIGTERM)
        if os.getppid() != parent.pid:
            os._exit(EXIT_ORPHANED)  # nothing started yet; serve is gone, with whoever reads our output
    return create_app()
