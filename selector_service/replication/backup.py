"""Backup and restore: a dataset exported as one blob (its snapshot), and a dataset created from one.

An export is the snapshot codec's file (snapshot.py): spec, beliefs, step history, checksummed. An
import checks it the way the service checks its own input (read_export), admits it against the memory
budget before allocating its arrays, writes it to the store as a new incarnation's snapshot (a fresh
uid, an empty log) and commits it in one step.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator

from selector_service.dataset.state import DatasetSpec, DatasetState
from selector_service.errors import Conflict, InvalidRequest, Unavailable
from selector_service.replication.memory import Admit
from selector_service.replication.payloads import resolve_params
from selector_service.replication.replica import Replica
from selector_service.storage.snapshot import iter_snapshot_chunks, load_snapshot_chunks, serialize_snapshot

IMPORTED_CURSOR = "0-1"  # an imported dataset's snapshot covers "everything before its first log entry"
# An import's body is handed from the event loop to the decoding thread in pieces of about this size.
IMPORT_PIECE_BYTES = 1 << 20


async def export_dataset(replica: Replica, name: str) -> bytes:
    """The dataset's spec and beliefs as one compressed, checksummed blob (a snapshot)."""
    header, arrays = await replica.read(name, lambda st: st.copy_for_snapshot())
    return await asyncio.to_thread(serialize_snapshot, header, arrays)


async def import_dataset(
    replica: Replica, name: str, body: bytes | AsyncIterable[bytes], replace: bool = False
) -> DatasetSpec:
    """Creates dataset `name` from an export: same spec and beliefs, a fresh log and uid.

    `body` is the export, whole or as the request's stream: it is decoded as it arrives (read_export:
    the header is checked first, so a body that is not an export is refused after its first piece,
    and the dataset is admitted against the memory budget before its arrays are allocated), then
    compressed again chunk by chunk into the store, and committed in one step (with `replace`, the
    dataset of that name is deleted only once the new chunks are in the store). Peak memory: the
    dataset's arrays plus about one store chunk and one body piece.
    """
    memory, store, settings = replica.memory, replica.store, replica.settings
    if isinstance(body, bytes | bytearray | memoryview):
        chunks: Iterable[bytes] = [bytes(body)]
    else:
        chunks = _pull_pieces(body, asyncio.get_running_loop(), IMPORT_PIECE_BYTES)
    # admit() runs in the decoding thread, before the export's arrays are allocated.
    with memory.admitting(name, "import", replacing=name if replace else None) as admit:
        try:
            state = await asyncio.to_thread(read_export, chunks, settings.max_dataset_size, admit)
        except MemoryError:
            raise memory.out_of_memory(name, "import") from None
        spec = DatasetSpec.from_doc(dict(state.spec.public(), name=name, uid=uuid.uuid4().hex))
        state.spec = spec
        state.cursor = IMPORTED_CURSOR
        state.seq = 0  # the new incarnation's log starts empty: its first record is number 1
        # The state is not shared yet: its arrays are compressed in place, no copy, one chunk at a
        # time in a worker thread, each written to the store before the next is made.
        pieces = iter_snapshot_chunks(
            state.snapshot_header(), state.snapshot_arrays(), settings.snapshot_chunk_bytes
        )

        async def compressed() -> AsyncIterator[memoryview]:
            while (chunk := await asyncio.to_thread(next, pieces, None)) is not None:
                yield chunk
                del chunk

        try:
            snap_id, count = await store.write_import_chunks(name, compressed())
        except MemoryError:
            raise memory.out_of_memory(name, "import") from None
        committed = False
        try:
            async with replica.lock(name):
                ok = await store.commit_import(
                    name,
                    spec.public(),
                    spec.fingerprint(),
                    spec.uid,
                    IMPORTED_CURSOR,
                    state.open_step,
                    snap_id,
                    count,
                    replace=replace,
                )
                committed = True
                if replace:
                    replica.states.pop(name, None)
                if not ok:
                    raise Conflict(
                        f"dataset {name!r} already exists; import under another name or pass replace=true"
                    )
                replica.states[name] = state
        finally:
            if not committed:
                with contextlib.suppress(Unavailable, OSError):
                    await store.discard_chunks(name, snap_id, count)
    return spec


def read_export(
    chunks: Iterable[bytes],
    max_prompts: int | None,
    admit: Admit | None = None,
) -> DatasetState:
    """Decodes an export (POST /datasets/{name}/import) and checks it the way an import does; anything
    that is not an intact export of a valid dataset is InvalidRequest (422), naming what is wrong.

    The codec checks the header before it allocates anything (then `admit(spec, layout)` may refuse),
    the declared body size before it inflates, every checksum, and every value against the domain the
    service itself produces; the spec and its strategy defaults are then checked like a create's.
    Errors of `chunks` itself (a body too large, a client gone) and of `admit` pass through unchanged.
    """
    try:
        state = load_snapshot_chunks(chunks, max_prompts, admit)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"not a valid dataset export: {exc}") from exc
    spec = state.spec
    problem = spec.problems()
    if problem:
        raise InvalidRequest(f"the export's dataset spec is invalid: {problem}")
    for strategy, params in spec.defaults.items():
        if not isinstance(params, dict):
            raise InvalidRequest(
                f"the export's dataset spec is invalid: defaults[{strategy!r}] is not an object of parameters"
            )
        resolve_params(spec, strategy, params)
    return state


def _pull_pieces(
    source: AsyncIterable[bytes], loop: asyncio.AbstractEventLoop, piece: int
) -> Iterator[bytes]:
    """The bytes of `source` (an async iterable on `loop`), for a worker thread: each next() runs on the
    loop until about `piece` bytes arrived (or the source ended) and hands them over. InvalidRequest when
    the source is empty; its own errors (a body over the limit, a client gone) are raised here."""
    stream = aiter(source)

    async def gather() -> bytes:
        parts, size = [], 0
        while size < piece:
            try:
                part = await anext(stream)
            except StopAsyncIteration:
                break
            parts.append(part)
            size += len(part)
        return b"".join(parts)

    first = True
    while True:
        data = asyncio.run_coroutine_threadsafe(gather(), loop).result()
        if not data:
            if first:
                raise InvalidRequest("the body is empty: send the bytes of a dataset export")
            return
        first = False
        yield data
