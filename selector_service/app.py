"""FastAPI routes of the REST contract (shared/API.md). Thin: parse, call the engine, return a model.

Errors are always `{"detail": "<what was wrong and what to do>"}`; a client's mistake is a 4xx and
changes nothing; an unreachable store is a 503.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from selector_service import metrics
from selector_service.core.coldstart import prior_arrays as cold_betas
from selector_service.engine import Engine, check_ids
from selector_service.errors import InvalidRequest, NotFound, PayloadTooLarge, ServiceError
from selector_service.schemas import (
    Belief,
    BeliefsResponse,
    DatasetCreate,
    DatasetInfo,
    DatasetList,
    ErrorBody,
    Health,
    MetadataRequest,
    MetadataResponse,
    ObserveRequest,
    ObserveResponse,
    ScoreRequest,
    ScoreResponse,
    SelectRequest,
    SelectResponse,
)
from selector_service.settings import Settings
from selector_service.state import DatasetSpec
from selector_service.store import Store, connect

log = logging.getLogger("selector_service")
UNDECODABLE_BODY = (
    "body is not valid JSON: send a UTF-8 encoded JSON object (NaN and Infinity are not allowed)"
)

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text}
    for code, text in {
        401: "missing bearer token",
        403: "wrong bearer token",
        404: "unknown dataset",
        409: "conflict (name taken with another spec, or step already closed)",
        413: "request too large",
        422: "invalid request",
        503: "store unreachable",
    }.items()
}


class BodyLimit:
    """Refuses bodies over `limit` bytes with 413, by Content-Length or while streaming."""

    def __init__(self, app: ASGIApp, limit: int, import_limit: int) -> None:
        self.app, self.default_limit, self.import_limit = app, limit, import_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.import_limit if scope.get("path", "").endswith("/import") else self.default_limit
        for key, value in scope.get("headers", []):
            if key == b"content-length" and value.isdigit() and int(value) > limit:
                await _send_json(send, 413, f"request body over {limit} bytes; send smaller requests")
                return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise PayloadTooLarge(f"request body over {limit} bytes; send smaller requests")
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except PayloadTooLarge as exc:
            if not started:
                await _send_json(send, 413, exc.detail)


class InternalErrors:
    """Answers an unexpected exception with a 500 `{"detail"}` and keeps the connection usable.

    Starlette's own handler for `Exception` sends its response and then re-raises, and the server then
    drops the keep-alive connection without saying so: the client's next request on it (say, a valid
    observe) fails with a reset, an outcome it cannot tell from a lost write.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                raise
            log.exception("unhandled error")
            await _send_json(send, 500, f"internal error ({type(exc).__name__}); see the service log")


class RequestMetrics:
    """Counts and times every request by its route template (bounded label values)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = {"code": 500}

        async def wrapped(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, wrapped)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            metrics.REQUESTS.labels(endpoint, method, str(status["code"])).inc()
            metrics.LATENCY.labels(endpoint, method).observe(time.perf_counter() - t0)


async def _send_json(send: Send, status: int, detail: str) -> None:
    body = JSONResponse({"detail": detail}).body
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p not in ("body",))
        msg = err.get("msg", "invalid")
        if err.get("type") == "extra_forbidden":
            msg = "unknown field (check the spelling against /openapi.json)"
        elif err.get("type") == "json_invalid":
            reason = (err.get("ctx") or {}).get("error", "")
            msg = f"body is not valid JSON ({reason}): send UTF-8 JSON; NaN and Infinity are not allowed"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts[:10]) + (f" (and {len(parts) - 10} more)" if len(parts) > 10 else "")


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI request body of a route that validates its JSON body itself (see _document_models)."""
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def _document_models(app: FastAPI, models: tuple[type[BaseModel], ...]) -> None:
    """Adds the JSON schemas of self-validated request bodies to the served OpenAPI document."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = original()
        schemas = doc.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in js.pop("$defs", {}).items():
                schemas.setdefault(name, sub)
            schemas[model.__name__] = js
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


async def engine_of(request: Request) -> Engine:
    # async: FastAPI runs plain `def` dependencies in its thread pool, a thread hop per request.
    return request.app.state.engine


EngineDep = Annotated[Engine, Depends(engine_of)]
NamePath = Annotated[str, Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", description="dataset name")]


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    collector = metrics.DatasetCollector(settings.max_group_labels)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if settings.redis_url is None:
            raise RuntimeError(
                "no store configured: set SELECTOR_REDIS_URL or start with `selector-service serve`"
            )
        client = await connect(settings.redis_url, settings.store_timeout_s)
        store = Store(client, settings.key_prefix, settings.request_id_ttl_s, settings.max_step_gap)
        engine = Engine(store, settings)
        engine.catchup_observer = metrics.CATCHUP.observe
        app.state.engine = engine
        try:
            yield
        finally:
            if refresh["task"] is not None:
                refresh["task"].cancel()
            await engine.close()
            await store.close()

    app = FastAPI(
        title="rlvr-selector",
        version="0.1.0",
        summary="Which prompts should the next RL step train on? Per-prompt Bayesian beliefs over REST.",
        lifespan=lifespan,
    )
    token = settings.api_token.get_secret_value().encode() if settings.api_token else None

    async def require_token(request: Request) -> None:
        if token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "bearer" or not value:
            raise StarletteHTTPException(
                401,
                "missing bearer token: send 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(value.strip().encode(), token):
            raise StarletteHTTPException(403, "wrong bearer token")

    api = APIRouter(dependencies=[Depends(require_token)], responses=ERRORS)

    @api.post(
        "/datasets",
        response_model=DatasetInfo,
        status_code=201,
        responses={200: {"model": DatasetInfo, "description": "same spec already exists"}},
    )
    async def create_dataset(body: DatasetCreate, engine: EngineDep, response: Response) -> DatasetInfo:
        spec = DatasetSpec(
            name=body.name,
            size=body.size,
            rollouts_per_prompt=body.rollouts_per_prompt,
            success_threshold=body.success_threshold + 0.0,  # -0.0 is the same threshold as 0.0
            beta_prior=tuple(body.beta_prior),
            beta_decay=body.beta_decay,
            hmm_decay=body.hmm_decay,
            reward_mode=body.reward_mode,
            defaults=body.defaults,
            max_lag=body.max_lag,
            prior_strength=body.prior_strength,
            group_decay=body.group_decay,
        )
        for strategy in body.defaults:
            Engine.resolve_params(spec, strategy, {})
        created, stored = await engine.create_dataset(spec)
        if not created:
            response.status_code = 200
        return DatasetInfo(**stored.public(), created=created)

    @api.get("/datasets", response_model=DatasetList)
    async def list_datasets(engine: EngineDep) -> DatasetList:
        return DatasetList(datasets=await engine.list_datasets())

    @api.get("/datasets/{name}", response_model=DatasetInfo)
    async def get_dataset(name: NamePath, engine: EngineDep) -> DatasetInfo:
        summary = await engine.read(name, lambda st: (st.spec, st.summary()))
        return DatasetInfo(**summary[0].public(), summary=summary[1])

    @api.delete("/datasets/{name}", status_code=204, response_class=Response)
    async def delete_dataset(name: NamePath, engine: EngineDep) -> Response:
        await engine.delete_dataset(name)
        return Response(status_code=204)

    @api.get(
        "/datasets/{name}/export",
        response_class=Response,
        responses={200: {"content": {"application/octet-stream": {}}, "description": "zstd snapshot"}},
    )
    async def export_dataset(name: NamePath, engine: EngineDep) -> Response:
        """The dataset's spec and beliefs as one compressed, checksummed file (backup; import elsewhere)."""
        blob = await engine.export_dataset(name)
        return Response(
            blob,
            media_type="application/octet-stream",
            headers={"Content-Disposition": f'attachment; filename="{name}.rlvr.zst"'},
        )

    @api.post(
        "/datasets/{name}/import",
        response_model=DatasetInfo,
        status_code=201,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            }
        },
    )
    async def import_dataset(
        name: NamePath,
        request: Request,
        engine: EngineDep,
        replace: Annotated[bool, Query(description="Replace an existing dataset of that name.")] = False,
    ) -> DatasetInfo:
        """Creates `name` from a file made by GET /datasets/{name}/export (same spec and beliefs)."""
        blob = await request.body()
        if not blob:
            raise InvalidRequest("the body is empty: send the bytes of a dataset export")
        spec = await engine.import_dataset(name, blob, replace=replace)
        return DatasetInfo(**spec.public(), created=True)

    @api.post("/select", response_model=SelectResponse)
    async def select(body: SelectRequest, engine: EngineDep) -> SelectResponse:
        if body.batch_size > settings.max_batch_size:
            raise PayloadTooLarge(
                f"batch_size {body.batch_size} is over this service's limit of {settings.max_batch_size}"
            )
        ids, scores, step = await engine.select(
            body.dataset,
            step=body.step,
            batch_size=body.batch_size,
            strategy=body.strategy,
            params=body.params or {},
            seed=body.seed,
        )
        return SelectResponse(
            dataset=body.dataset,
            step=step,
            strategy=body.strategy,
            prompt_ids=ids.tolist(),
            scores=scores.tolist() if body.return_scores and scores is not None else None,
        )

    @api.post("/observe", response_model=ObserveResponse, openapi_extra=_json_body(ObserveRequest))
    async def observe(request: Request, engine: EngineDep) -> ObserveResponse:
        """Report rollout results for a step; idempotent by request_id, applied whole or not at all."""
        # The hot write path: parse and validate the bytes in one pass (pydantic's JSON mode), which is
        # several times faster than FastAPI's json.loads + model validation for 256 results x K rewards.
        try:
            body = ObserveRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None
        applied, duplicate, lag = await engine.observe(
            body.dataset, step=body.step, request_id=body.request_id, results=body.results
        )
        return ObserveResponse(applied=applied, duplicate=duplicate, lag=lag)

    @api.get("/datasets/{name}/beliefs", response_model=BeliefsResponse)
    async def beliefs(
        request: Request,
        name: NamePath,
        engine: EngineDep,
        ids: Annotated[
            str,
            Query(
                description="Comma-separated prompt ids (decimal digits), e.g. 1,2,3",
                max_length=16_000_000,
                pattern=r"^[0-9]+(,[0-9]+)*$",
            ),
        ],
    ) -> BeliefsResponse:
        if len(request.query_params.getlist("ids")) > 1:
            raise InvalidRequest("pass the ids once, comma-separated: ?ids=1,2,3 (not ?ids=1&ids=2)")
        try:  # ASCII digits only (the pattern): no signs, underscores or other scripts' digits
            arr = np.array([int(x) for x in ids.split(",")], dtype=np.int64)
        except OverflowError:
            raise InvalidRequest("a prompt id is out of range: ids must be in 0..size-1") from None
        if arr.size > settings.max_ids_per_request:
            raise PayloadTooLarge(
                f"{arr.size} ids in one request; the limit is {settings.max_ids_per_request}"
            )
        spec = await engine.spec(name)
        check_ids(arr, spec.size)

        def read(st):
            a = st.arrays
            al, be, p0 = cold_betas(a, arr)  # a never-observed prompt reports its cold prior
            pri = a.hmm_prior_of(arr).astype(np.float64)  # never-observed: (1/3, 1/3, 1/3)
            rows = zip(arr, al, be, a.n_obs[arr], pri, a.group[arr], p0, strict=True)
            return st.open_step, [
                Belief(
                    prompt_id=int(i),
                    alpha=float(x),
                    beta=float(y),
                    mean=float(x / (x + y)),
                    observations=int(o),
                    hmm_prior=p.tolist(),
                    group=int(g),
                    prior_pass_rate=None if np.isnan(r) else float(r),
                )
                for i, x, y, o, p, g, r in rows
            ]

        open_step, rows = await engine.read(name, read)
        return BeliefsResponse(open_step=open_step, beliefs=rows)

    metadata_doc = (
        "Per-prompt prior pass rates and groups for prompts offset .. offset + len - 1 (METHODS 6). A log "
        "record like an observation: every replica applies it, exports carry it. Out-of-range values or "
        "lengths: 422, nothing applied."
    )

    @api.put("/datasets/{name}/metadata", response_model=MetadataResponse, description=metadata_doc)
    async def put_metadata(name: NamePath, body: MetadataRequest, engine: EngineDep) -> MetadataResponse:
        count = len(body.pass_rate if body.pass_rate is not None else body.group or [])
        if count > settings.max_ids_per_request:
            raise PayloadTooLarge(
                f"{count} prompts in one request; the limit is {settings.max_ids_per_request}: "
                "send several requests with offsets"
            )
        rates = None
        if body.pass_rate is not None:
            rates = np.array([np.nan if r is None else r for r in body.pass_rate], dtype=np.float64)
        groups = None if body.group is None else np.asarray(body.group, dtype=np.int64)
        answer = await engine.upload_metadata(name, offset=body.offset, pass_rate=rates, group=groups)
        return MetadataResponse(**answer)

    @api.put(
        "/datasets/{name}/metadata/{field}",
        response_model=MetadataResponse,
        description="The same upload as raw little-endian arrays, for very large datasets: pass_rate as "
        "float32 (NaN = unknown), group as int32 (-1 = none).",
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            }
        },
    )
    async def put_metadata_raw(
        name: NamePath,
        field: Annotated[Literal["pass_rate", "group"], Path(description="which array the body holds")],
        request: Request,
        engine: EngineDep,
        offset: Annotated[int, Query(ge=0, le=2**62, description="Prompt id of the first value.")] = 0,
    ) -> MetadataResponse:
        raw = await request.body()
        if not raw or len(raw) % 4:
            raise InvalidRequest(
                f"the body has {len(raw)} bytes: send 4 bytes per prompt (little-endian "
                f"{'float32' if field == 'pass_rate' else 'int32'}); nothing was applied"
            )
        if len(raw) // 4 > settings.max_ids_per_request:
            raise PayloadTooLarge(
                f"{len(raw) // 4} prompts in one request; the limit is {settings.max_ids_per_request}: "
                "send several requests with offsets"
            )
        values = np.frombuffer(raw, dtype="<f4" if field == "pass_rate" else "<i4")
        kwargs = (
            {"pass_rate": values, "group": None}
            if field == "pass_rate"
            else {"pass_rate": None, "group": values}
        )
        answer = await engine.upload_metadata(name, offset=offset, **kwargs)
        return MetadataResponse(**answer)

    @api.post("/score", response_model=ScoreResponse)
    async def score(body: ScoreRequest, engine: EngineDep) -> ScoreResponse:
        if len(body.prompt_ids) > settings.max_ids_per_request:
            raise PayloadTooLarge(f"{len(body.prompt_ids)} ids; the limit is {settings.max_ids_per_request}")
        scores, open_step = await engine.score(
            body.dataset,
            strategy=body.strategy,
            params=body.params or {},
            ids=np.asarray(body.prompt_ids, dtype=np.int64),
            seed=body.seed,
        )
        return ScoreResponse(open_step=open_step, scores=scores.tolist())

    app.include_router(api)

    @app.get("/healthz", response_model=Health)
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, responses={503: {"model": Health}})
    async def readyz(engine: EngineDep) -> Any:
        if await engine.ready():
            return Health(status="ready")
        return JSONResponse(
            {"status": "not ready", "detail": "the belief store is unreachable"}, status_code=503
        )

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics(engine: EngineDep) -> Response:
        """Prometheus text format. Dataset gauges come from a catch-up with the store that may take at
        most SELECTOR_METRICS_WAIT_S; a slower one (a frozen store, a long replay) goes on in the
        background and this scrape reports the last complete figures."""
        task = refresh["task"]
        if task is None or task.done():
            task = refresh["task"] = asyncio.get_running_loop().create_task(refresh_rows(engine))
        await asyncio.wait({task}, timeout=settings.metrics_wait_s)
        return Response(metrics.render(collector), media_type="text/plain; version=0.0.4; charset=utf-8")

    refresh: dict[str, asyncio.Task | None] = {"task": None}

    async def refresh_rows(engine: Engine) -> None:
        try:
            names = await engine.list_datasets()
            rows = {}
            for name in names:
                try:
                    rows[name] = await engine.read(name, collector.row)
                except NotFound:
                    continue
            collector.update(rows, {n: s.records for n, s in engine.sync_stats.items()})
        except ServiceError as exc:
            log.warning("metrics keep their last dataset gauges: %s", exc.detail)

    @app.exception_handler(ServiceError)
    async def service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_message(exc)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 400:
            # FastAPI turns any error while it reads and parses a JSON body into a 400: a streamed body
            # that BodyLimit cut off (-> 413), or bytes that are not UTF-8 (-> 422, like invalid JSON).
            if isinstance(exc.__cause__, PayloadTooLarge):
                return JSONResponse({"detail": exc.__cause__.detail}, status_code=413)
            return JSONResponse({"detail": UNDECODABLE_BODY}, status_code=422)
        return JSONResponse({"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    _document_models(app, (ObserveRequest,))
    app.add_middleware(InternalErrors)  # innermost: its 500 is counted by RequestMetrics
    app.add_middleware(RequestMetrics)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes, import_limit=settings.max_import_bytes)
    return app
