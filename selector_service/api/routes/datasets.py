"""Datasets: create, list, describe and delete them; read beliefs; upload metadata; export and import."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from fastapi import APIRouter, Depends, Path, Query, Request, Response

from selector_service.api.deps import DigitsOnly, EngineDep, NamePath, SettingsDep, require_token
from selector_service.api.errors import ERRORS
from selector_service.api.openapi import binary_body
from selector_service.contract.schemas import (
    BeliefsResponse,
    DatasetCreate,
    DatasetInfo,
    DatasetList,
    MetadataRequest,
    MetadataResponse,
)
from selector_service.core.beliefs import NO_SAMPLES
from selector_service.dataset.state import METADATA_HEAD_BYTES
from selector_service.errors import InvalidRequest, PayloadTooLarge

router = APIRouter(dependencies=[Depends(require_token)], responses=ERRORS, tags=["datasets"])


@router.post(
    "/datasets",
    response_model=DatasetInfo,
    status_code=201,
    responses={200: {"model": DatasetInfo, "description": "same spec already exists"}},
    summary="Create a dataset",
    operation_id="createDataset",
)
async def create_dataset(body: DatasetCreate, engine: EngineDep, response: Response) -> DatasetInfo:
    """Creates a dataset of `size` prompts (ids 0..size-1) with its belief model fixed once: K, the
    success threshold, the Beta prior, both decays, the reward mode and per-strategy selection defaults.

    201 when this call created it; 200 when a dataset of that name already exists with the same spec (a
    retried create is harmless); 409 when the name is taken with another spec. Defaults that a strategy
    does not accept are refused with 422.
    """
    created, stored = await engine.create_dataset_from(body)
    if not created:
        response.status_code = 200
    return DatasetInfo(**stored.public(), created=created)


@router.get("/datasets", response_model=DatasetList, summary="List datasets", operation_id="listDatasets")
async def list_datasets(engine: EngineDep) -> DatasetList:
    """The names of every dataset in the store (all replicas share them)."""
    return DatasetList(datasets=await engine.list_datasets())


@router.get(
    "/datasets/{name}", response_model=DatasetInfo, summary="Describe a dataset", operation_id="getDataset"
)
async def get_dataset(name: NamePath, engine: EngineDep) -> DatasetInfo:
    """The dataset's spec and a summary of its beliefs: open step, observations and rollouts applied,
    prompts ever observed, steps closed, the last closed step's share of partially solved prompts and
    the metadata coverage (prompts with a pass rate, with a group, groups in use)."""
    spec, summary = await engine.describe(name)
    return DatasetInfo(**spec.public(), summary=summary)


@router.delete(
    "/datasets/{name}",
    status_code=204,
    response_class=Response,
    summary="Delete a dataset",
    operation_id="deleteDataset",
)
async def delete_dataset(name: NamePath, engine: EngineDep) -> Response:
    """Deletes the dataset with its beliefs, log and snapshots; 404 when there is none of that name."""
    await engine.delete_dataset(name)
    return Response(status_code=204)


@router.get(
    "/datasets/{name}/export",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "zstd snapshot"}},
    summary="Export a dataset",
    operation_id="exportDataset",
)
async def export_dataset(name: NamePath, engine: EngineDep) -> Response:
    """The dataset's spec and beliefs as one compressed, checksummed file (backup; import elsewhere)."""
    blob = await engine.export_dataset(name)
    return Response(
        blob,
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{name}.rlvr"'},
    )


@router.post(
    "/datasets/{name}/import",
    response_model=DatasetInfo,
    status_code=201,
    openapi_extra=binary_body(),
    summary="Import a dataset",
    operation_id="importDataset",
)
async def import_dataset(
    name: NamePath,
    request: Request,
    engine: EngineDep,
    replace: Annotated[bool, Query(description="Replace an existing dataset of that name.")] = False,
) -> DatasetInfo:
    """Creates `name` from a file made by GET /datasets/{name}/export (same spec and beliefs); 507 when
    it does not fit in the service's memory budget."""
    try:  # decoded as it arrives: a body that is not an export is refused after its first megabyte
        spec = await engine.import_dataset(name, request.stream(), replace=replace)
    except InvalidRequest as exc:
        if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            # curl -d (form data) drops the file's CR and LF bytes: the likely cause, not a bad export.
            raise InvalidRequest(
                f"{exc.detail}. The body came as form data (curl -d), which drops newline bytes from the "
                "file: send it unchanged with curl --data-binary @FILE -H 'Content-Type: "
                "application/octet-stream'"
            ) from None
        raise
    return DatasetInfo(**spec.public(), created=True)


@router.get(
    "/datasets/{name}/beliefs",
    response_model=BeliefsResponse,
    summary="Read beliefs",
    operation_id="getBeliefs",
)
async def beliefs(
    request: Request,
    name: NamePath,
    engine: EngineDep,
    settings: SettingsDep,
    ids: Annotated[
        str,
        Query(
            description="Comma-separated prompt ids (decimal digits), e.g. 1,2,3",
            max_length=16_000_000,
            pattern=r"^[0-9]+(,[0-9]+)*$",
        ),
    ],
) -> BeliefsResponse:
    """The beliefs about the prompts asked for, in that order, and the open step they reflect: each
    prompt's Beta posterior (alpha, beta, mean), results received, DPS belief for the open step over
    (unsolved, partially solved, solved), group and prior pass rate (docs/methods.md). A never-observed
    prompt reports its cold prior."""
    if len(request.query_params.getlist("ids")) > 1:
        raise InvalidRequest("pass the ids once, comma-separated: ?ids=1,2,3 (not ?ids=1&ids=2)")
    try:  # ASCII digits only (the pattern): no signs, underscores or other scripts' digits
        arr = np.array([int(x) for x in ids.split(",")], dtype=np.int64)
    except OverflowError:
        raise InvalidRequest("a prompt id is out of range: ids must be in 0..size-1") from None
    if arr.size > settings.max_ids_per_request:
        raise PayloadTooLarge(f"{arr.size} ids in one request; the limit is {settings.max_ids_per_request}")
    open_step, rows = await engine.beliefs(name, arr)
    return BeliefsResponse(open_step=open_step, beliefs=rows)


@router.put(
    "/datasets/{name}/metadata",
    response_model=MetadataResponse,
    summary="Upload metadata",
    operation_id="putMetadata",
)
async def put_metadata(
    name: NamePath, body: MetadataRequest, engine: EngineDep, settings: SettingsDep
) -> MetadataResponse:
    """Per-prompt prior pass rates, the samples each was measured from (and whether they were rolled out
    for this run: profiling rollouts) and groups for prompts offset .. offset + len - 1 (docs/methods.md,
    cold start). A log record like an observation: every replica applies it, exports carry it.
    Out-of-range values or lengths: 422 naming the array and index, nothing applied."""
    count = max(len(v) for v in (body.pass_rate, body.pass_samples, body.group) if v is not None)
    if count > settings.max_ids_per_request:
        raise PayloadTooLarge(
            f"{count} prompts in one request; the limit is {settings.max_ids_per_request}: "
            "send several requests with offsets"
        )
    rates = None
    if body.pass_rate is not None:
        rates = np.array([np.nan if r is None else r for r in body.pass_rate], dtype=np.float64)
    samples = None
    if body.pass_samples is not None:
        samples = np.array([NO_SAMPLES if n is None else n for n in body.pass_samples], dtype=np.int64)
    groups = None if body.group is None else np.asarray(body.group, dtype=np.int64)
    answer = await engine.upload_metadata(
        name, offset=body.offset, pass_rate=rates, group=groups, pass_samples=samples, profile=body.profile
    )
    return MetadataResponse(**answer)


#: The raw arrays: name -> (little-endian dtype, what a value means).
RAW_FIELDS = {
    "pass_rate": ("<f4", "float32, NaN = unknown"),
    "group": ("<i4", "int32, -1 = none"),
    "pass_samples": ("<i4", "int32, -1 = unknown"),
}


@router.put(
    "/datasets/{name}/metadata/{field}",
    response_model=MetadataResponse,
    openapi_extra=binary_body(),
    summary="Upload metadata as a raw array",
    operation_id="putMetadataArray",
)
async def put_metadata_raw(
    name: NamePath,
    field: Annotated[
        Literal["pass_rate", "group", "pass_samples"], Path(description="which array the body holds")
    ],
    request: Request,
    engine: EngineDep,
    settings: SettingsDep,
    offset: Annotated[
        int, DigitsOnly, Query(ge=0, le=2**62, description="Prompt id of the first value.")
    ] = 0,
    profile: Annotated[
        bool,
        Query(description="pass_samples only: the counts were rolled out for this run (profiling rollouts)."),
    ] = False,
) -> MetadataResponse:
    """The same upload as raw little-endian arrays, for very large datasets: pass_rate as float32
    (NaN = unknown), group as int32 (-1 = none), pass_samples as int32 (-1 = unknown; with
    `profile=true` they count as profiling rollouts); 4 bytes per prompt from `offset` on. The body is
    read as it arrives into the log record it becomes (one copy of it in memory)."""
    dtype, meaning = RAW_FIELDS[field]
    if request.headers.get("content-type", "").split(";")[0].strip().lower() == "application/json":
        # JSON text read as float32 is a row of tiny numbers inside [0, 1]: it would be applied as pass rates.
        raise InvalidRequest(
            "this route takes raw little-endian bytes (Content-Type: application/octet-stream); JSON "
            f"metadata goes to PUT /datasets/{name}/metadata. Nothing was applied"
        )
    if profile and field != "pass_samples":
        raise InvalidRequest(
            f"profile=true counts sample counts as profiling rollouts: send it with PUT "
            f"/datasets/{name}/metadata/pass_samples, not with {field}. Nothing was applied"
        )
    record = await _read_record(request, settings.max_ids_per_request, dtype, meaning)
    values = np.frombuffer(record, dtype=dtype, offset=METADATA_HEAD_BYTES)
    arrays = {"pass_rate": None, "group": None, "pass_samples": None, field: values}
    start, count = await engine.append_metadata(name, offset=offset, profile=profile, record=record, **arrays)
    del values, arrays, record  # the store holds the record now: the answer reads it back from the log
    return MetadataResponse(**await engine.metadata_answer(name, start, count))


async def _read_record(request: Request, max_values: int, dtype: str, meaning: str) -> bytearray:
    """The raw body read into a buffer laid out as the metadata record it becomes (METADATA_HEAD_BYTES of
    room for the head, then the body), allocated once from Content-Length when the request gives one
    (the service's body limit bounds it): 422 for a body that is not whole 4-byte values, 413 beyond
    `max_values`."""

    def too_many(values: int) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"{values} prompts in one request; the limit is {max_values}: send several requests with offsets"
        )

    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isdigit() else None
    if size is not None and size // 4 > max_values:
        raise too_many(size // 4)
    record = bytearray(METADATA_HEAD_BYTES + (size or 0))
    at = METADATA_HEAD_BYTES
    async for chunk in request.stream():
        end = at + len(chunk)
        if end > len(record):  # no (or a wrong) Content-Length: grow as it arrives
            if (end - METADATA_HEAD_BYTES) // 4 > max_values:
                raise too_many((end - METADATA_HEAD_BYTES) // 4)
            record.extend(bytes(end - len(record)))
        record[at:end] = chunk
        at = end
    del record[at:]
    body = at - METADATA_HEAD_BYTES
    if not body or body % 4:
        raise InvalidRequest(
            f"the body has {body} bytes: send 4 bytes per prompt (little-endian {meaning}); nothing was applied"
        )
    return record
