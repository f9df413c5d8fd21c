"""The snapshot codec: one dataset's state as a checksummed, zstd-compressed file, and back.

A snapshot is what the store keeps so that a restarted or new replica does not replay the whole log
(store.py), and what GET /datasets/{name}/export hands to a user. Its layout:

    magic "RLVRSNAP" | u32 header length | header JSON | header digest | zstd body

The header holds the format's version (`SNAPSHOT_VERSION`), the spec, the log position the beliefs reflect (cursor, seq), the counters, the shared
state's scalars and each array's name, dtype and shape; the body is the arrays' bytes, one after
another, in one zstd frame with its content size and checksum. Decoding trusts nothing: the header is
checked before anything is allocated, the body's declared size before anything is inflated.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import zstandard

from rlvr_selector_client.contract import MAX_GROUPS, MAX_STEP
from selector_service.core.belief_domain import check_beliefs
from selector_service.core.beliefs import COLUMN_FIELDS, FIELDS, METADATA_FIELDS, BeliefArrays
from selector_service.core.domain import BELIEF_MAX
from selector_service.core.dps import CloseStats
from selector_service.core.shared import SharedState
from selector_service.core.strategies import ParamError
from selector_service.dataset.history import HISTORY_PREFIX, LAG_LABELS, ROW_COLUMNS, Bounds, StepHistory
from selector_service.dataset.state import SHARED_PREFIX, DatasetSpec, DatasetState

SNAPSHOT_MAGIC = b"RLVRSNAP"
#: The snapshot format's version, in every header. Version 4 is the first format (1 to 3 were never
#: released, and are not read): a change bumps it and migrates, i.e. the reader goes on reading every
#: released version before it. A header that names any other version is refused (`_header_version`).
#: 5: the sample counts behind pass rates and the profiling they cost (per-prompt arrays V5_FIELDS, the
#: shared scalars V5_SHARED, the history columns V5_HISTORY); a version 4 snapshot is read with none of
#: them (`_migrate_v4`: no counts, nothing profiled, the history's running totals rebuilt from its rows).
SNAPSHOT_VERSION = 5
READABLE_VERSIONS = (4, 5)
V5_FIELDS = ("pass_samples", "profiled", "prior_n")
V5_SHARED = ("pass_samples_known", "profile_rollouts")
V5_HISTORY = ("profile_rollouts", "total_rollouts")
_HEADER_DIGEST_BYTES = 16
_MAX_HEADER_BYTES = 16 * 2**20  # a real header is a few hundred bytes
_COMPRESS_FEED_BYTES = 4 * 2**20  # input slice handed to the compressor at a time
_EXPORT_PIECE_BYTES = 16 * 2**20  # how much serialize_snapshot copies into its buffer at a time
_ZSTD_FRAME_HEADER_MAX = 18  # bytes; enough for frame_content_size
_INFLATE_STEP_BYTES = 32 * 2**20  # about how much one decompression call may produce (see _inflate_into)
_COUNTER_MAX = 2**63 - 1  # record numbers and result counts
_CURSOR = re.compile(r"|[0-9]{1,20}-[0-9]{1,20}")  # "" (no record applied) or a log record id
_OTHER_PREFIXES = (SHARED_PREFIX, HISTORY_PREFIX)  # snapshot arrays that are not per-prompt beliefs
#: A header this codec writes nests 4 levels (spec -> defaults -> strategy -> parameter); deeper is forged.
_MAX_HEADER_DEPTH = 16
#: What a forged header's values (any JSON in any place) raise when read as the fields they stand for.
_MALFORMED = (KeyError, TypeError, IndexError, AttributeError, OverflowError, ArithmeticError, ParamError)
#: Each array's name, dtype and shape, in the order the body holds them (the header's "arrays").
Layout = list[tuple[str, np.dtype, tuple[int, ...]]]


def _snapshot_prefix(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """Magic, header length, header JSON (with each array's dtype and shape) and the header's digest:
    what precedes the body. The body carries zstd's own checksum; the digest covers everything before
    it, so a flipped bit in the spec or the counters is refused like one in the beliefs. The header
    carries the current format version unless it names another one itself."""
    layout = [[k, v.dtype.str, list(v.shape)] for k, v in arrays.items()]
    header = {"version": SNAPSHOT_VERSION, **header, "arrays": layout}
    head = json.dumps(header).encode()
    prefix = SNAPSHOT_MAGIC + struct.pack("<I", len(head)) + head
    return prefix + _header_digest(prefix)


def _header_digest(prefix: bytes) -> bytes:
    return hashlib.blake2b(prefix, digest_size=_HEADER_DIGEST_BYTES).digest()


def _compressor() -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=1, threads=-1, write_checksum=True, write_content_size=True)


def serialize_snapshot(header: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """Header JSON (with each array's dtype and shape) + zstd of the arrays' bytes, checksummed.

    The whole-blob form of `iter_snapshot_chunks`, for exports (a user file).
    """
    # Chunks go into one buffer and getvalue() hands it over without a copy: joining a list of chunks
    # instead copies the whole snapshot while holding the GIL (0.7-3 s at 10^7 prompts).
    out = io.BytesIO()
    for chunk in iter_snapshot_chunks(header, arrays, _EXPORT_PIECE_BYTES):
        out.write(chunk)
    return out.getvalue()


def iter_snapshot_chunks(
    header: dict[str, Any], arrays: dict[str, np.ndarray], chunk_bytes: int
) -> Iterator[memoryview]:
    """The snapshot of `serialize_snapshot`, compressed as a stream and cut into chunks of `chunk_bytes`.

    Every chunk but the last has exactly `chunk_bytes` bytes; their concatenation is a valid snapshot
    (same header, same checksummed zstd frame with its content size). Each chunk is a fresh buffer that
    the generator never touches again once yielded, and the arrays are fed to the compressor in small
    slices, so writing a snapshot costs the arrays plus about one chunk, not plus the compressed blob.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    total = sum(arr.nbytes for arr in arrays.values())
    compressor = _compressor().compressobj(size=total)

    def pieces() -> Iterator[bytes]:
        yield _snapshot_prefix(header, arrays)
        for arr in arrays.values():
            for block in _row_major_blocks(arr):
                view = block.data.cast("B")
                for offset in range(0, len(view), _COMPRESS_FEED_BYTES):
                    yield compressor.compress(view[offset : offset + _COMPRESS_FEED_BYTES])
        yield compressor.flush()

    chunk, fill = bytearray(chunk_bytes), 0
    for piece in pieces():
        data = memoryview(piece)
        while data:
            take = min(len(data), chunk_bytes - fill)
            chunk[fill : fill + take] = data[:take]
            fill += take
            data = data[take:]
            if fill == chunk_bytes:
                yield memoryview(chunk)
                chunk, fill = bytearray(chunk_bytes), 0
    if fill:
        yield memoryview(chunk)[:fill]


def _block_rows(arr: np.ndarray) -> int:
    """Rows of `arr` per block of about _COMPRESS_FEED_BYTES (at least one)."""
    row = arr.nbytes // arr.shape[0] if arr.shape and arr.shape[0] else arr.nbytes
    return max(1, _COMPRESS_FEED_BYTES // max(row, 1))


def _row_major_blocks(arr: np.ndarray) -> Iterator[np.ndarray]:
    """`arr`'s bytes in row-major (C) order, as C-contiguous pieces: the array itself when it is
    C-contiguous, else row blocks of about _COMPRESS_FEED_BYTES, each copied (the observed set is held
    column-major, core/beliefs.py COLUMN_FIELDS; its snapshot bytes are row-major as always, and writing
    them costs one block, not a copy of the array). Zero-size arrays give nothing (memoryview cannot
    cast a zero shape)."""
    if arr.nbytes == 0:
        return
    if arr.flags.c_contiguous:
        yield arr
        return
    step = _block_rows(arr)
    for lo in range(0, arr.shape[0], step):
        yield np.ascontiguousarray(arr[lo : lo + step])


def _fill_targets(arrays: dict[str, np.ndarray]) -> Iterator[memoryview]:
    """The byte views a snapshot body inflates into, one after another, in `arrays`' order. A C-contiguous
    array is filled in place; one that is not (the column-major observed set) is filled through one
    reused row-major block of about _COMPRESS_FEED_BYTES, copied into its rows as each block completes
    (the caller asks for the next view only once the previous one is full)."""
    for arr in arrays.values():
        if arr.nbytes == 0:
            continue
        if arr.flags.c_contiguous:
            yield arr.data.cast("B")
            continue
        step = _block_rows(arr)
        block = np.empty((min(step, arr.shape[0]), *arr.shape[1:]), dtype=arr.dtype)
        for lo in range(0, arr.shape[0], step):
            part = block[: min(step, arr.shape[0] - lo)]
            yield part.data.cast("B")
            arr[lo : lo + part.shape[0]] = part


class _ChunkSource:
    """A read()-able view of an iterator of byte chunks, pulling one chunk at a time."""

    def __init__(self, chunks: Iterable[bytes | memoryview]) -> None:
        self._chunks = iter(chunks)
        self._buf = memoryview(b"")
        self._pushed_back = b""

    def read(self, size: int = -1) -> bytes:
        """Up to `size` bytes (fewer only at a chunk boundary); b"" once the chunks are exhausted."""
        if self._pushed_back:
            out, self._pushed_back = self._pushed_back, b""
            return out
        while not self._buf:
            nxt = next(self._chunks, None)
            if nxt is None:
                return b""
            self._buf = memoryview(nxt).cast("B")
        take = len(self._buf) if size is None or size < 0 else min(size, len(self._buf))
        out, self._buf = self._buf[:take].tobytes(), self._buf[take:]
        return out

    def read_exact(self, size: int, what: str) -> bytes:
        """Exactly `size` bytes; ValueError naming `what` when the stream ends first."""
        out = bytearray()
        while len(out) < size:
            part = self.read(size - len(out))
            if not part:
                raise ValueError(f"snapshot is truncated in its {what}")
            out += part
        return bytes(out)

    def unread(self, data: bytes) -> None:
        """Puts bytes back in front of the stream (used to peek at the zstd frame header)."""
        self._pushed_back = data + self._pushed_back


def _header_json(head: bytes) -> dict[str, Any]:
    """The header's JSON object, read before anything else of it is trusted: not JSON, not an object, or
    nested deeper than any header this codec writes (_MAX_HEADER_DEPTH) is a ValueError."""
    try:
        header = json.loads(head)
    except RecursionError:  # the decoder's own stack: thousands of levels
        raise ValueError(
            f"snapshot header nests deeper than {_MAX_HEADER_DEPTH} levels; not an export of this service"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"snapshot header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise ValueError("snapshot header is not a JSON object")
    if _depth(header) > _MAX_HEADER_DEPTH:
        # Below the decoder's limit but still far deeper than a real header: copying or printing such a
        # value (the spec is copied into every answer) recurses once per level.
        raise ValueError(
            f"snapshot header nests deeper than {_MAX_HEADER_DEPTH} levels; not an export of this service"
        )
    return header


def _depth(doc: object) -> int:
    """How deeply lists and objects nest in a decoded JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level > _MAX_HEADER_DEPTH:
            return level
        stack.extend((child, level + 1) for child in children)
    return deepest


def _header_version(header: dict[str, Any]) -> int:
    """The version a header names, read before anything else of it is trusted: one of READABLE_VERSIONS,
    or a ValueError that names them (never a guess at another layout)."""
    version = header.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version not in READABLE_VERSIONS:
        raise ValueError(
            f"snapshot version {version!r} is not supported (this service reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}; a newer service wrote it?)"
        )
    return int(version)


def _with_v5_arrays(layout: Layout, size: int) -> Layout:
    """A version 4 layout with the arrays version 5 added, as `_migrate_v4` makes them (for the checks
    made before anything is allocated); ValueError when it already names one of them."""
    names = {name for name, _, _ in layout}
    added = [name for name in V5_FIELDS if name in names]
    added += [HISTORY_PREFIX + name for name in V5_HISTORY if HISTORY_PREFIX + name in names]
    if added:
        raise ValueError(f"a version 4 snapshot holds arrays of version 5: {sorted(added)}")
    rows = next((shape for name, _, shape in layout if name == HISTORY_PREFIX + "step"), (0,))
    out = list(layout)
    out += [(name, FIELDS[name][0], (size,)) for name in V5_FIELDS]
    out += [(HISTORY_PREFIX + name, ROW_COLUMNS[name][0], tuple(rows)) for name in V5_HISTORY]
    return out


def _migrate_v4(header: dict[str, Any], arrays: dict[str, np.ndarray], size: int) -> None:
    """Turns a version 4 snapshot's header and arrays into version 5's, in place: no pass rate has a
    sample count and nothing was profiled (version 4 had neither), and each history row's running total
    of rollouts is rebuilt from the rows after it: the rollouts applied when the snapshot was taken, less
    those of the open step and of every later row (exact: each row holds what was applied while its
    step was open)."""
    for name in V5_FIELDS:
        arrays[name] = np.full(size, METADATA_FIELDS[name], dtype=FIELDS[name][0])
    shared = header.get("shared")
    if isinstance(shared, dict):
        shared.update(dict.fromkeys(V5_SHARED, 0))
    rollouts = np.asarray(arrays[HISTORY_PREFIX + "rollouts"], dtype=np.float64)
    arrays[HISTORY_PREFIX + "profile_rollouts"] = np.zeros(rollouts.size, dtype=np.int64)
    try:
        before = float(header["rollouts"]) - float(header["shared"]["step_counts"][4])
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
        raise ValueError(f"snapshot header is incomplete or malformed: {exc!r}") from exc
    later = np.concatenate([np.cumsum(rollouts[::-1])[::-1][1:], [0.0]]) if rollouts.size else rollouts
    arrays[HISTORY_PREFIX + "total_rollouts"] = np.maximum(before - later, 0.0)


def _parse_header(
    header: dict[str, Any], max_prompts: int | None
) -> tuple[DatasetSpec, dict[str, Any], Layout, int]:
    """Checks a snapshot header before any allocation; returns (spec, header, layout of the body, body
    bytes)."""
    version = _header_version(header)
    try:
        spec = DatasetSpec.from_doc(header["spec"])
        layout = [
            (str(name), np.dtype(dtype), tuple(int(d) for d in shape))
            for name, dtype, shape in header["arrays"]
        ]
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, SyntaxError) as exc:
        # A forged header can put any JSON anywhere: a list where the spec's object goes (AttributeError),
        # 1e400 as a number (OverflowError), a dtype string numpy cannot parse (SyntaxError).
        raise ValueError(f"snapshot header is incomplete or malformed: {exc!r}") from exc
    if spec.size < 1:
        raise ValueError(f"snapshot spec has size {spec.size}; a dataset has at least one prompt")
    if max_prompts is not None and spec.size > max_prompts:
        raise ValueError(f"the snapshot holds {spec.size} prompts; this service's limit is {max_prompts}")
    names = [name for name, _, _ in layout]
    if any(not shape or min(shape) < 0 for _, _, shape in layout) or len(set(names)) != len(names):
        raise ValueError(f"snapshot arrays do not match the dataset size {spec.size}")
    body_layout = layout
    if version == 4:
        layout = _with_v5_arrays(layout, spec.size)
    per_group = [shape for name, _, shape in layout if name.startswith(SHARED_PREFIX)]
    if any(len(shape) != 1 or not 0 <= shape[0] <= MAX_GROUPS for shape in per_group):
        raise ValueError(f"snapshot group arrays must be 1-d with at most {MAX_GROUPS} entries")
    # Dense arrays have one row per prompt, the observed set's one row per observed prompt: checked
    # before anything is allocated.
    BeliefArrays.check_layout(
        {name: (dt, shape) for name, dt, shape in layout if not name.startswith(_OTHER_PREFIXES)}, spec.size
    )
    StepHistory.check_layout(
        {
            name[len(HISTORY_PREFIX) :]: (dt, shape)
            for name, dt, shape in layout
            if name.startswith(HISTORY_PREFIX)
        }
    )
    expected = sum(math.prod(shape) * dt.itemsize for _, dt, shape in body_layout)
    return spec, header, body_layout, expected


def _beliefs_from(spec: DatasetSpec, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> BeliefArrays:
    """Per-prompt arrays and shared state (the header's "shared" and the "shared.*" arrays) from a
    snapshot."""
    group_arrays = {k[len(SHARED_PREFIX) :]: v for k, v in arrays.items() if k.startswith(SHARED_PREFIX)}
    prompt_arrays = {k: v for k, v in arrays.items() if not k.startswith(_OTHER_PREFIXES)}
    shared = SharedState.from_parts(spec.rules(), header["shared"], group_arrays)
    return BeliefArrays.from_arrays(prompt_arrays, shared=shared)


def _count(header: dict[str, Any], key: str, high: int, field: str = "") -> int:
    """Header field `key` (named `field` in errors, default `key`) as an int in [0, high]; ValueError
    naming it otherwise (a float, a bool, a string or an out-of-range number is refused, never truncated)."""
    value = header[key]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise ValueError(
            f"snapshot header field {field or repr(key)} = {value!r} is not an integer in [0, {high}]"
        )
    return value


def _state_from(spec: DatasetSpec, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> DatasetState:
    problem = spec.problems()
    if problem:  # before the beliefs: their domain depends on the spec (its Beta prior, its size)
        raise ValueError(f"the snapshot's dataset spec is invalid: {problem}")
    beliefs = _beliefs_from(spec, header, arrays)
    # The checksums only say these are the bytes the writer wrote: an export made with this codec can
    # carry any values. Every field must be one this service could have produced (core/belief_domain.py).
    check_beliefs(beliefs)
    state = DatasetState(spec, beliefs)
    try:
        state.open_step = _count(header, "open_step", MAX_STEP)
        state.steps_closed = _count(header, "steps_closed", MAX_STEP)
        cursor = header["cursor"]
        if not isinstance(cursor, str) or not _CURSOR.fullmatch(cursor):
            raise ValueError(f"snapshot header field 'cursor' = {cursor!r} is not a log position")
        state.cursor = cursor
        state.seq = _count(header, "seq", _COUNTER_MAX)
        state.results = _count(header, "results", _COUNTER_MAX)
        lags = header["results_by_lag"]
        if not isinstance(lags, dict):
            raise ValueError(f"snapshot header field 'results_by_lag' = {lags!r} is not an object")
        state.results_by_lag = {
            int(k): _count(lags, k, state.results, field=f"'results_by_lag'[{k!r}]") for k in lags
        }
        if any(not 0 <= lag <= LAG_LABELS for lag in state.results_by_lag) or (
            sum(state.results_by_lag.values()) > state.results
        ):
            raise ValueError(
                f"snapshot header field 'results_by_lag' = {lags!r}: lags 0..{LAG_LABELS}, "
                f"counting at most the {state.results} results"
            )
        rollouts = header["rollouts"]
        if (
            isinstance(rollouts, bool)
            or not isinstance(rollouts, int | float)
            or not (0 <= rollouts <= BELIEF_MAX)
        ):
            raise ValueError(f"snapshot header field 'rollouts' = {rollouts!r} is not finite and >= 0")
        state.rollouts = float(rollouts)
        last = header["last_close"]
        if last:
            if not isinstance(last, list) or len(last) != len(CloseStats._fields):
                raise ValueError(f"snapshot header field 'last_close' = {last!r} is not a list of 6 counts")
            named = dict(zip(CloseStats._fields, last, strict=True))
            close = CloseStats(
                *(_count(named, f, spec.size, field=f"'last_close'.{f}") for f in CloseStats._fields)
            )
            if close.partial > close.observed or close.correct > close.observed:
                raise ValueError(f"snapshot header field 'last_close' = {last!r} counts more than observed")
            state.last_close = close
        else:
            state.last_close = None
        state.history = _history_from(header, arrays, state)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"snapshot header is incomplete or malformed: {exc!r}") from exc
    except ValueError as exc:
        raise ValueError(f"snapshot header is incomplete or malformed: {exc}") from exc
    return state


def _history_from(header: dict[str, Any], arrays: dict[str, np.ndarray], state: DatasetState) -> StepHistory:
    """The snapshot's step history (the header's "history" and the "history.*" arrays)."""
    parts = {k[len(HISTORY_PREFIX) :]: v for k, v in arrays.items() if k.startswith(HISTORY_PREFIX)}
    counts = state.arrays.shared.step_counts
    bounds = Bounds(
        size=state.spec.size,
        steps_closed=state.steps_closed,
        prompts_observed=state.arrays.observed,
        results=state.results,
        rollouts=state.rollouts,
        open_results=float(counts[0]),
        open_rollouts=float(counts[4]),
    )
    return StepHistory.from_parts(
        header["history"], parts, state.open_step, state.arrays.shared.n_groups, bounds
    )


def deserialize_snapshot(blob: bytes, max_prompts: int | None = None) -> DatasetState:
    """Rebuilds a DatasetState from a whole export; raises ValueError on any corruption.

    Exports come back from outside (POST /datasets/{name}/import); `load_snapshot_chunks` checks the
    header before any allocation, bounds the size by `max_prompts`, and refuses a body whose declared
    size differs from what the header implies before inflating anything.
    """
    return load_snapshot_chunks((blob,), max_prompts)


def _inflate_into(source: _ChunkSource, views: Iterable[memoryview]) -> None:
    """Inflates the zstd frame read from `source` into `views`, one after another, and checks that the
    frame ends exactly where the source does: complete (with its checksum verified) and nothing after it.

    A decompression object, not a stream reader: the stream reader returns the content without an error
    when the frame's last bytes (its checksum) are cut off. Input is fed in slices sized so that one
    slice inflates to about _INFLATE_STEP_BYTES: a freshly created dataset compresses a thousand-fold
    and more, and a large slice of it would inflate to gigabytes at once.
    """
    inflater = zstandard.ZstdDecompressor().decompressobj()
    targets = iter(views)
    view = next(targets, None)
    filled = 0
    feed = 4096
    pending = b""
    while True:
        if not pending:
            pending = source.read(feed)
            if not pending:
                break
        piece, pending = pending[:feed], pending[feed:]
        out = memoryview(inflater.decompress(piece))
        feed = int(min(max(_INFLATE_STEP_BYTES * len(piece) / max(len(out), 1), 1024), 4 * 2**20))
        while out:
            if view is None:
                raise ValueError("snapshot body inflates to more bytes than its header implies")
            take = min(len(out), len(view) - filled)
            view[filled : filled + take] = out[:take]
            filled += take
            out = out[take:]
            if filled == len(view):
                view, filled = next(targets, None), 0
        if inflater.eof:
            if pending or inflater.unused_data or source.read(1):
                raise ValueError("snapshot has trailing bytes after its body")
            break
    while view is not None and len(view) == 0:  # zero-length arrays need no bytes
        view = next(targets, None)
    if view is not None or not inflater.eof:
        raise ValueError("snapshot body is truncated")


def load_snapshot_chunks(
    chunks: Iterable[bytes | memoryview],
    max_prompts: int | None = None,
    admit: Callable[[DatasetSpec, Layout], None] | None = None,
) -> DatasetState:
    """Rebuilds a DatasetState from a snapshot's chunks, inflating them as a stream into the arrays.

    The checks: header before allocation (the arrays must match the spec's size, since kernels index
    them by prompt id without bounds checks; `max_prompts` bounds that size), the declared body size
    before inflating (a small body that inflates to gigabytes is refused), the zstd content checksum.
    It never joins the chunks: each array is allocated once
    and filled straight from the decompressor, so a load costs the arrays plus about one chunk. Raises
    ValueError on any corruption or truncation (never a silent reset); errors raised by the chunk
    iterator itself (a missing chunk, an unreachable store) pass through unchanged, and so do those of
    `admit(spec, layout)`, called once the header is checked and before any array is allocated (the
    engine's memory admission).
    """
    source = _ChunkSource(chunks)
    if source.read_exact(len(SNAPSHOT_MAGIC), "magic") != SNAPSHOT_MAGIC:
        raise ValueError("not an rlvr-selector snapshot (bad magic or truncated)")
    raw_len = source.read_exact(4, "header length")
    (hlen,) = struct.unpack("<I", raw_len)
    if hlen > _MAX_HEADER_BYTES:
        raise ValueError(f"snapshot header claims {hlen} bytes; at most {_MAX_HEADER_BYTES} are accepted")
    head = source.read_exact(hlen, "header")
    header = _header_json(head)
    version = _header_version(header)
    digest = source.read_exact(_HEADER_DIGEST_BYTES, "header digest")
    if digest != _header_digest(SNAPSHOT_MAGIC + raw_len + head):
        raise ValueError("snapshot header is corrupt (its digest does not match)")
    spec, header, layout, expected = _parse_header(header, max_prompts)
    if admit is not None:
        admit(spec, layout)
    frame_head = bytearray()
    while len(frame_head) < _ZSTD_FRAME_HEADER_MAX and (part := source.read(_ZSTD_FRAME_HEADER_MAX)):
        frame_head += part
    source.unread(bytes(frame_head))
    try:
        declared = zstandard.frame_content_size(bytes(frame_head))
        if declared != expected:
            raise ValueError(f"snapshot body declares {declared} bytes, its header implies {expected}")
        # The observed set's column-major fields are allocated so (BeliefArrays.from_arrays keeps them).
        arrays = {
            name: np.empty(shape, dtype=dt, order="F" if name in COLUMN_FIELDS else "C")
            for name, dt, shape in layout
        }
        _inflate_into(source, _fill_targets(arrays))
    except zstandard.ZstdError as exc:
        raise ValueError(f"snapshot body is corrupt: {exc}") from exc
    if version == 4:
        _migrate_v4(header, arrays, spec.size)
    try:
        return _state_from(spec, header, arrays)
    except _MALFORMED as exc:
        # The shared state and the counters come from the header too: any JSON may stand there.
        raise ValueError(f"snapshot header is incomplete or malformed: {exc!r}") from exc
