"""Streaming snapshots: chunked writer, chunk-by-chunk loader, and the engine's use of both on real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import numpy as np
import pytest

from selector_service.dataset.state import DatasetSpec, DatasetState
from selector_service.errors import Unavailable
from selector_service.replication.engine import Engine
from selector_service.settings import Settings
from selector_service.storage.snapshot import (
    V5_FIELDS,
    V5_HISTORY,
    V5_SHARED,
    deserialize_snapshot,
    iter_snapshot_chunks,
    load_snapshot_chunks,
    serialize_snapshot,
)
from selector_service.storage.store import Store, StoreError, connect


def _busy_state(size: int = 3000, seed: int = 0) -> DatasetState:
    """A state whose arrays hold varied values (so the body does not compress to a few bytes)."""
    state = DatasetState(DatasetSpec(name="snap", size=size, uid="u1", hmm_decay=0.6))
    rng = np.random.default_rng(seed)
    for step in range(4):
        ids = rng.choice(size, size // 3, replace=False).astype(np.int64)
        trials = np.full(len(ids), 8.0)
        succ = rng.integers(0, 9, len(ids)).astype(np.float64)
        states = np.where(succ == 0, 1, np.where(succ == 8, 3, 2)).astype(np.int8)  # unsolved/partial/solved
        state.close_until(step)
        state.apply_outcomes(ids, succ, trials, states)
    state.cursor = "17-3"
    return state


def _same_beliefs(a: DatasetState, b: DatasetState) -> bool:
    left, right = a.arrays.arrays(), b.arrays.arrays()
    return left.keys() == right.keys() and all(
        left[k].dtype == right[k].dtype and np.array_equal(left[k], right[k], equal_nan=True) for k in left
    )


def _chunks(state: DatasetState, chunk_bytes: int) -> list[bytes]:
    header, arrays = state.copy_for_snapshot()
    return [bytes(c) for c in iter_snapshot_chunks(header, arrays, chunk_bytes)]


@pytest.mark.parametrize("chunk_bytes", [16, 1024, 10**7])
def test_chunked_round_trip_restores_identical_state(chunk_bytes):
    state = _busy_state()
    chunks = _chunks(state, chunk_bytes)
    assert all(len(c) == chunk_bytes for c in chunks[:-1]) and 0 < len(chunks[-1]) <= chunk_bytes
    back = load_snapshot_chunks(iter(chunks))
    assert _same_beliefs(back, state)
    assert (back.cursor, back.open_step, back.results, back.steps_closed) == (
        state.cursor,
        state.open_step,
        state.results,
        state.steps_closed,
    )
    assert back.rollouts == state.rollouts and back.last_close == state.last_close
    assert back.spec == state.spec


def test_chunked_and_whole_blob_formats_read_each_other():
    state = _busy_state(seed=1)
    joined = b"".join(_chunks(state, 1024))
    assert _same_beliefs(deserialize_snapshot(joined), state)
    blob = serialize_snapshot(*state.copy_for_snapshot())
    pieces = [blob[i : i + 700] for i in range(0, len(blob), 700)]
    assert _same_beliefs(load_snapshot_chunks(pieces), state)


@pytest.mark.parametrize("feed_bytes", [7, 36 * 5, 4 * 2**20])
def test_column_major_observed_set_writes_and_loads_row_major_bytes(monkeypatch, feed_bytes):
    """The observed set is held column-major (core/beliefs.py COLUMN_FIELDS) and written from the live
    arrays in row blocks: the body is byte for byte that of row-major copies, whatever the block size,
    and loads back (through one reused row block per array) into column-major arrays."""
    import selector_service.storage.snapshot as snapshot

    state = _busy_state(seed=2)
    header, live = state.snapshot_header(), state.snapshot_arrays()
    assert not live["obs_d"].flags.c_contiguous  # a view of the live rows of the column-major set
    row_major = {k: np.ascontiguousarray(v) for k, v in live.items()}
    want = b"".join(bytes(c) for c in iter_snapshot_chunks(header, row_major, 1000))
    monkeypatch.setattr(snapshot, "_COMPRESS_FEED_BYTES", feed_bytes)
    got = b"".join(bytes(c) for c in iter_snapshot_chunks(header, live, 1000))
    assert got == want
    back = load_snapshot_chunks([got[i : i + 333] for i in range(0, len(got), 333)])
    assert _same_beliefs(back, state)
    for name in ("obs_d", "obs_prior", "obs_prev"):
        assert getattr(back.arrays, name).flags.f_contiguous


def test_truncated_snapshot_raises():
    chunks = _chunks(_busy_state(), 1024)
    assert len(chunks) > 5
    with pytest.raises(ValueError, match="truncated"):
        load_snapshot_chunks(chunks[:-1])
    with pytest.raises(ValueError, match="truncated"):
        load_snapshot_chunks([*chunks[:-1], chunks[-1][:-4]])  # the checksum is cut off
    with pytest.raises(ValueError):
        load_snapshot_chunks(chunks[:1])  # stops inside the body
    with pytest.raises(ValueError, match="truncated"):
        load_snapshot_chunks([chunks[0][:20]])  # stops inside the header


def test_corrupted_chunk_raises():
    chunks = _chunks(_busy_state(), 1024)
    middle = len(chunks) // 2
    damaged = bytearray(chunks[middle])
    damaged[len(damaged) // 2] ^= 0x40
    with pytest.raises(ValueError, match="corrupt"):
        load_snapshot_chunks([*chunks[:middle], bytes(damaged), *chunks[middle + 1 :]])
    last = bytearray(chunks[-1])
    last[-1] ^= 0x01  # inside the zstd content checksum: only the checksum can catch it
    with pytest.raises(ValueError, match="corrupt"):
        load_snapshot_chunks([*chunks[:-1], bytes(last)])
    with pytest.raises(ValueError, match="magic"):
        load_snapshot_chunks([b"NOTASNAP" + chunks[0][8:], *chunks[1:]])


def test_header_checks_run_before_inflating():
    state = _busy_state()
    chunks = _chunks(state, 1024)
    with pytest.raises(ValueError, match="limit is 100"):
        load_snapshot_chunks(chunks, max_prompts=100)
    # A header that claims a smaller dataset than the body holds is refused on the body's declared size.
    header, arrays = state.copy_for_snapshot()
    small = {k: v[:10] for k, v in arrays.items()}
    lying = _chunks_of(dict(header, spec=dict(header["spec"], size=10)), small, arrays)
    with pytest.raises(ValueError, match="declares"):
        load_snapshot_chunks(lying)


def _chunks_of(header: dict, layout_arrays: dict, body_arrays: dict) -> list[bytes]:
    """Chunks whose header describes `layout_arrays` but whose body holds `body_arrays`."""
    real = b"".join(bytes(c) for c in iter_snapshot_chunks(header, body_arrays, 1024))
    fake = b"".join(bytes(c) for c in iter_snapshot_chunks(header, layout_arrays, 1024))
    head_len = 12 + int.from_bytes(fake[8:12], "little") + 16  # with the header's digest
    real_head_len = 12 + int.from_bytes(real[8:12], "little") + 16
    return [fake[:head_len] + real[real_head_len:]]


def test_an_empty_observed_set_round_trips():
    state = DatasetState(DatasetSpec(name="fresh", size=10, uid="u"))
    back = deserialize_snapshot(serialize_snapshot(*state.copy_for_snapshot()))
    assert back.arrays.observed == 0 and _same_beliefs(back, state)


@pytest.mark.parametrize("version", [6, 3, None, "5", 5.0])
def test_another_version_is_refused_with_a_clear_error(version):
    """Version 4 is the first format and 5 the current one: a newer one, an unreleased older one, none,
    or a version that is not a JSON integer is refused, never read as if it were 4 or 5."""
    state = _busy_state(size=50)
    header, arrays = state.copy_for_snapshot()
    blob = serialize_snapshot(dict(header, version=version), arrays)
    with pytest.raises(
        ValueError, match=rf"version {version!r} is not supported \(this service reads versions 4, 5;"
    ):
        deserialize_snapshot(blob)


def _as_version_4(state: DatasetState) -> bytes:
    """The snapshot a version 4 service wrote of `state` (which holds no sample counts): without the
    arrays, shared scalars and history columns version 5 added."""
    header, arrays = state.copy_for_snapshot()
    for name in V5_FIELDS:
        assert name in arrays
        del arrays[name]
    for name in V5_HISTORY:
        del arrays["history." + name]
    for name in V5_SHARED:
        del header["shared"][name]
    return serialize_snapshot(dict(header, version=4), arrays)


def test_a_version_4_snapshot_is_read_as_version_5():
    """Migration: no sample counts, nothing profiled, and each history row's running total of rollouts
    rebuilt from the rows after it, equal to what the state wrote at each close."""
    state = _busy_state(size=300)
    state.close_until(9)  # empty steps too
    state.apply_outcomes(np.array([3, 4], np.int64), np.array([1.0, 0.0]), np.array([8.0, 8.0]),
                         np.array([2, 1], np.int8))  # fmt: skip  # results of the open step
    back = deserialize_snapshot(_as_version_4(state))
    assert _same_beliefs(back, state)
    assert back.history.rows(0, 100) == state.history.rows(0, 100)
    assert [r["total_rollouts"] for r in back.history.rows(0, 100)[0]][-1] == state.rollouts - 16
    assert back.summary() == state.summary() and back.profile_rollouts() == 0
    # Written again, it is a version 5 snapshot of the same state.
    again = deserialize_snapshot(serialize_snapshot(*back.copy_for_snapshot()))
    assert _same_beliefs(again, state) and again.history.rows(0, 100) == state.history.rows(0, 100)


def test_a_version_4_snapshot_naming_version_5_arrays_is_refused():
    state = _busy_state(size=50)
    header, arrays = state.copy_for_snapshot()
    for name in V5_HISTORY:
        del arrays["history." + name]
    with pytest.raises(ValueError, match="a version 4 snapshot holds arrays of version 5"):
        deserialize_snapshot(serialize_snapshot(dict(header, version=4), arrays))


def test_every_single_bit_flip_of_the_header_is_refused():
    """The header (spec, counters, layout) is covered by a digest: a flip there used to import silently
    with another success threshold, open step or observation count."""
    state = _busy_state(size=40)
    blob = serialize_snapshot(*state.copy_for_snapshot())
    (hlen,) = np.frombuffer(blob[8:12], dtype="<u4")
    for byte in range(12 + int(hlen) + 16):
        for bit in range(8):
            flipped = bytearray(blob)
            flipped[byte] ^= 1 << bit
            with pytest.raises(ValueError):
                deserialize_snapshot(bytes(flipped))


def test_a_snapshot_whose_observed_set_is_inconsistent_is_refused():
    state = _busy_state(size=60)
    arrays = {k: v.copy() for k, v in state.snapshot_arrays().items()}
    arrays["hmm_slot"][arrays["obs_ids"][0]] = 1  # two prompts claim slot 1
    with pytest.raises(ValueError, match="observed set"):
        deserialize_snapshot(serialize_snapshot(state.snapshot_header(), arrays))
    arrays = {k: v.copy() for k, v in state.snapshot_arrays().items()}
    arrays["obs_d"] = arrays["obs_d"][:-1]  # fewer rows than the observed set
    with pytest.raises(ValueError, match="obs_d"):
        deserialize_snapshot(serialize_snapshot(state.snapshot_header(), arrays))


def test_errors_of_the_chunk_source_pass_through():
    chunks = _chunks(_busy_state(), 1024)

    def failing():
        yield from chunks[:3]
        raise StoreError("chunk 3 is missing")

    with pytest.raises(StoreError, match="chunk 3 is missing"):
        load_snapshot_chunks(failing())


# ---- the engine on a real Redis -----------------------------------------------------------------------


async def _engine(redis_url: str, prefix: str, **overrides) -> tuple[Engine, Store]:
    settings = Settings(redis_url=redis_url, key_prefix=prefix, **overrides)
    client = await connect(settings.redis_url, settings.store_timeout_s)
    store = Store(client, prefix, settings.request_id_ttl_s)
    return Engine(store, settings), store


async def _observe_steps(engine: Engine, name: str, steps: range, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for step in steps:
        ids = rng.choice(500, 40, replace=False).tolist()
        results = [
            SimpleNamespace(prompt_id=int(p), rewards=None, successes=int(rng.integers(0, 9)), trials=8)
            for p in ids
        ]
        await engine.observe(name, step=step, request_id=f"r{step}", results=results)


async def _drop_prefix(store: Store, prefix: str) -> None:
    keys = [k async for k in store.r.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await store.r.delete(*keys)
    await store.close()


def test_engine_streams_many_chunks_and_restores_exactly(redis_url):
    prefix = f"test-snap-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        writer, store = await _engine(redis_url, prefix, snapshot_chunk_bytes=1024)
        try:
            await writer.create_dataset(DatasetSpec(name="ds", size=500, hmm_decay=0.5))
            await _observe_steps(writer, "ds", range(6), seed=3)
            await writer.snapshot_now("ds")
            meta = await store.read_meta("ds")
            assert int(meta["snap_chunks"]) >= 4
            before = await writer.read("ds", lambda st: st)
            reader, other = await _engine(redis_url, prefix)
            try:
                restored = await reader.read("ds", lambda st: st)
                assert restored is not before and _same_beliefs(restored, before)
                assert restored.cursor == before.cursor and restored.open_step == before.open_step
                # A damaged chunk makes the load fail loudly instead of starting from the priors.
                key = store.keys.snap_chunk("ds", meta["snap"], int(meta["snap_chunks"]) // 2)
                raw = bytearray(await store.r.get(key))
                raw[100] ^= 0xFF
                await store.r.set(key, bytes(raw))
                fresh, third = await _engine(redis_url, prefix)
                with pytest.raises(Unavailable, match="cannot be read"):
                    await fresh.read("ds", lambda st: st)
                await third.close()
            finally:
                await other.close()
        finally:
            await _drop_prefix(store, prefix)

    asyncio.run(scenario())


def test_engine_paces_automatic_snapshots(redis_url):
    prefix = f"test-snap-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        engine, store = await _engine(redis_url, prefix, snapshot_every_records=1)
        try:
            await engine.create_dataset(DatasetSpec(name="ds", size=500))
            await _observe_steps(engine, "ds", range(2), seed=4)
            await engine.read("ds", lambda st: None)
            await engine.flush_snapshots()
            first = (await store.read_meta("ds")).get("snap")
            assert first, "the record trigger did not write a snapshot"
            # As if that snapshot had taken long: the next one must wait although the trigger fires.
            engine.replica.snapshot_not_before["ds"] = time.monotonic() + 3600
            await _observe_steps(engine, "ds", range(2, 4), seed=5)
            await engine.read("ds", lambda st: None)
            await engine.flush_snapshots()
            assert (await store.read_meta("ds")).get("snap") == first
            engine.replica.snapshot_not_before["ds"] = 0.0
            await engine.read("ds", lambda st: None)
            await engine.flush_snapshots()
            assert (await store.read_meta("ds")).get("snap") != first
        finally:
            await engine.close()
            await _drop_prefix(store, prefix)

    asyncio.run(scenario())
