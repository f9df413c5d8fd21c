"""An export's contents must lie in the domain the service itself can produce (core/belief_domain.py).

Hostile exports are built with the project's own codec, so their checksums and header digest are valid:
only the values are out of range. Each must be refused with a 422 naming the field, and an import with
replace=true must leave the existing dataset exactly as it was. Genuine exports of datasets after random
traffic (every strategy's shared state, metadata, fractional rewards, never-observed prompts) must always
import: a check that refuses what the service wrote is as wrong as one that lets a bad value in.
"""

from __future__ import annotations

import copy
import json
import math
import struct

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from selector_service.core.coldstart import apply_metadata
from selector_service.core.outcomes import outcomes_from_counts
from selector_service.dataset.history import LAG_LABELS
from selector_service.dataset.state import DatasetSpec, DatasetState
from selector_service.storage.snapshot import deserialize_snapshot, load_snapshot_chunks, serialize_snapshot
from tests.service.test_history import run_schedule

N = 200
STRATEGIES = ("insight", "learnability", "adarft", "greso", "sec", "mopps", "dps", "uniform")


def decode(blob: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """(header without its layout, arrays) of an export, read without the service's checks."""
    (hlen,) = struct.unpack("<I", blob[8:12])
    header = json.loads(blob[12 : 12 + hlen])
    raw = zstandard.ZstdDecompressor().decompress(blob[12 + hlen + 16 :])
    arrays, offset = {}, 0
    for name, dtype, shape in header.pop("arrays"):
        dt = np.dtype(dtype)
        size = math.prod(shape) * dt.itemsize
        arrays[name] = np.frombuffer(raw[offset : offset + size], dtype=dt).reshape(shape).copy()
        offset += size
    header.pop("version")
    return header, arrays


def encode(header: dict, arrays: dict[str, np.ndarray]) -> bytes:
    """An export with valid digests over whatever `header` and `arrays` hold (the service's own codec)."""
    return serialize_snapshot(header, arrays)


@pytest.fixture(scope="module")
def source(service) -> bytes:
    """The export of a dataset with metadata, groups and traffic of every strategy at several steps."""
    import httpx

    name = f"dom-src-{id(service)}"
    with httpx.Client(base_url=service.url, timeout=60) as http:
        http.delete(f"/datasets/{name}")
        r = http.post("/datasets", json={"name": name, "size": N, "reward_mode": "binary"})
        assert r.status_code == 201, r.text
        rates = [None if i % 4 == 0 else round((i % 10) / 10, 2) for i in range(N)]
        groups = [i % 5 if i % 7 else -1 for i in range(N)]
        samples = [None if i % 3 == 0 else 4 + i % 13 for i in range(N)]  # prompt 0 has no count
        body = {"pass_rate": rates, "group": groups, "pass_samples": samples, "profile": True}
        assert http.put(f"/datasets/{name}/metadata", json=body).status_code == 200
        rng = np.random.default_rng(0)
        for step in range(5):
            for strategy in STRATEGIES:
                r = http.post(
                    "/select", json={"dataset": name, "step": step, "batch_size": 8, "strategy": strategy}
                )
                assert r.status_code == 200, (strategy, r.text)
                results = [{"prompt_id": i, "successes": int(rng.integers(0, 9)), "trials": 8}
                           for i in r.json()["prompt_ids"]]  # fmt: skip
                ack = http.post("/observe", json={"dataset": name, "step": step, "request_id": f"{name}-{step}-{strategy}",
                                                  "results": results})  # fmt: skip
                assert ack.status_code == 200, ack.text
        blob = http.get(f"/datasets/{name}/export").content
        http.delete(f"/datasets/{name}")
    header, arrays = decode(blob)
    assert header["shared"]["greso_pos"] > 0 and arrays["shared.sec_pos"].any(), "the walks never moved"
    assert 0 < header["shared"]["adarft_t"] < 100 and len(arrays["obs_ids"]) < N
    assert header["shared"]["profile_rollouts"] > 0 and (arrays["prior_n"] >= 1).any()
    return blob


def _set_header(path: str, value):
    def mutate(header, arrays):
        *parents, leaf = path.split(".")
        node = header
        for key in parents:
            node = node[key]
        node[leaf] = value

    return mutate


def _set_array(name: str, value, index=0):
    def mutate(header, arrays):
        arrays[name][index] = value

    return mutate


def _duplicate_observed_id(header, arrays):
    arrays["obs_ids"][1] = arrays["obs_ids"][0]


def _slot_of_unobserved(header, arrays):
    unseen = int(np.flatnonzero(arrays["hmm_slot"] < 0)[0])
    seen = int(np.flatnonzero(arrays["hmm_slot"] >= 0)[0])
    arrays["hmm_slot"][unseen], arrays["hmm_slot"][seen] = arrays["hmm_slot"][seen], -1


def _observed_without_results(header, arrays):
    seen = int(np.flatnonzero(arrays["n_obs"] > 0)[0])
    arrays["n_obs"][seen] = 0


def _frozen_count_of_an_unobserved_prompt(header, arrays):
    arrays["prior_n"][int(np.flatnonzero(arrays["n_obs"] == 0)[0])] = 8


def _successes_over_trials(header, arrays):
    arrays["shared.group_successes"][0] = arrays["shared.group_trials"][0] + 1


HOSTILE = {
    "open_step 10^15": (_set_header("open_step", 10**15), "open_step"),
    "open_step -5": (_set_header("open_step", -5), "open_step"),
    "open_step float": (_set_header("open_step", 5.5), "open_step"),
    "results -1": (_set_header("results", -1), "results"),
    "steps_closed -7": (_set_header("steps_closed", -7), "steps_closed"),
    "seq 2^70": (_set_header("seq", 2**70), "seq"),
    "rollouts inf": (_set_header("rollouts", math.inf), "rollouts"),
    "rollouts -1": (_set_header("rollouts", -1.0), "rollouts"),
    "cursor": (_set_header("cursor", "zzz"), "cursor"),
    "last_close arity": (_set_header("last_close", [1, 2]), "last_close"),
    "last_close negative": (_set_header("last_close", [1, 0, -1, 0, 0, 0]), "last_close"),
    "results_by_lag": (_set_header("results_by_lag", {"99": 1}), "results_by_lag"),
    "alpha -1": (_set_array("alpha", -1.0), "alpha"),
    "alpha NaN": (_set_array("alpha", math.nan), "alpha"),
    "alpha inf": (_set_array("alpha", math.inf), "alpha"),
    "alpha below the prior": (_set_array("alpha", 1e-320), "alpha"),
    "beta -1": (_set_array("beta", -1.0), "beta"),
    "pass_rate -1": (_set_array("pass_rate", -1.0, 1), "pass_rate"),
    "pass_rate inf": (_set_array("pass_rate", math.inf, 1), "pass_rate"),
    "prior_p0 2": (_set_array("prior_p0", 2.0), "prior_p0"),
    "n_obs -5": (_set_array("n_obs", -5), "n_obs"),
    "last_state 7": (_set_array("last_state", 7), "last_state"),
    "streak -32768": (_set_array("streak", -32768), "streak"),
    "group -5": (_set_array("group", -5), "group"),
    "group past the shared state": (_set_array("group", 60000), "group"),
    "obs_prior NaN": (_set_array("obs_prior", math.nan), "obs_prior"),
    "obs_prior not summing to 1": (_set_array("obs_prior", [0.9, 0.9, 0.9]), "obs_prior"),
    "obs_prev -1": (_set_array("obs_prev", [-1.0, 1.0, 1.0]), "obs_prev"),
    "obs_d 0": (_set_array("obs_d", 0.0), "obs_d"),
    "obs_d NaN": (_set_array("obs_d", math.nan), "obs_d"),
    "obs_state 9": (_set_array("obs_state", 9), "obs_state"),
    "obs_ids duplicated": (_duplicate_observed_id, "observed set"),
    "hmm_slot inconsistent": (_slot_of_unobserved, "observed"),
    "n_obs without a slot": (_observed_without_results, "observed"),
    "group_size -5": (_set_array("shared.group_size", -5), "group_size"),
    "group_size huge": (_set_array("shared.group_size", 2**62), "group_size"),
    "sec_pos -5": (_set_array("shared.sec_pos", -5), "sec_pos"),
    "sec_q NaN": (_set_array("shared.sec_q", math.nan), "sec_q"),
    "group_trials -1": (_set_array("shared.group_trials", -1.0), "group_trials"),
    "group_successes over trials": (_successes_over_trials, "group_successes"),
    "step_adv -1": (_set_array("shared.step_adv", -1.0), "step_adv"),
    "step_adv_n -1": (_set_array("shared.step_adv_n", -1), "step_adv_n"),
    "greso_pos -1": (_set_header("shared.greso_pos", -1), "greso_pos"),
    "p_easy 2": (_set_header("shared.p_easy", 2.0), "p_easy"),
    "p_hard NaN": (_set_header("shared.p_hard", math.nan), "p_hard"),
    "adarft_t -1": (_set_header("shared.adarft_t", -1.0), "adarft_t"),
    "pass_rate_known": (_set_header("shared.pass_rate_known", 10**6), "pass_rate_known"),
    "grouped -1": (_set_header("shared.grouped", -1), "grouped"),
    "step_counts -1": (_set_header("shared.step_counts", [-1.0, 0, 0, 0, 0]), "step_counts"),
    "step_counts easy > results": (_set_header("shared.step_counts", [1.0, 2.0, 0, 0, 0]), "step_counts"),
    # The step history (history.py): every row bounded by the dataset, its own figures and the header.
    "history observed 10^6": (_set_array("history.observed", 10**6), "observed"),
    "history prompts_observed 10^9": (_set_array("history.prompts_observed", 10**9, -1), "prompts_observed"),
    "steps_closed below the rows": (_set_header("steps_closed", 2), "steps_closed"),
    "history selected past the size": (_set_array("history.selected", 10**6), "selected"),
    "history rollouts 10^12": (_set_array("history.rollouts", 1e12), "rollouts"),
    "history late before step 0": (_set_array("history.late", [0, 0, 8, 0, 0, 0, 0, 0, 0], 1), "late"),
    "history group past the dataset's": (_set_array("history.group", 4000), "groups"),
    "history open fresh 10^6": (_set_header("history.open.fresh", 10**6), "fresh"),
    # Sample counts, profiling and what they froze (docs/api.md section 2).
    "pass_samples 0": (_set_array("pass_samples", 0, 1), "pass_samples"),
    "pass_samples 2e6": (_set_array("pass_samples", 2_000_000, 1), "pass_samples"),
    "profiled 2": (_set_array("profiled", 2, 1), "profiled"),
    "profiled without a count": (_set_array("profiled", 1, 0), "profiled"),
    "prior_n -7": (_set_array("prior_n", -7), "prior_n"),
    "prior_n of an unobserved prompt": (_frozen_count_of_an_unobserved_prompt, "prior_n"),
    "pass_samples_known": (_set_header("shared.pass_samples_known", 3), "pass_samples_known"),
    "profile_rollouts": (_set_header("shared.profile_rollouts", 10**9), "profile_rollouts"),
    "history profile_rollouts -1": (_set_array("history.profile_rollouts", -1), "profile_rollouts"),
    "history total_rollouts 10^15": (_set_array("history.total_rollouts", 1e15, -1), "total_rollouts"),
    "history total_rollouts NaN": (_set_array("history.total_rollouts", math.nan), "total_rollouts"),
}


def _hostile(source: bytes, case: str) -> bytes:
    header, arrays = decode(source)
    header, arrays = copy.deepcopy(header), {k: v.copy() for k, v in arrays.items()}
    mutate, _ = HOSTILE[case]
    mutate(header, arrays)
    return encode(header, arrays)


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_export_is_422_naming_the_field_and_changes_nothing(http, dsname, source, case):
    assert http.post(f"/datasets/{dsname}/import", content=source).status_code == 201
    before = http.get(f"/datasets/{dsname}/export").content
    summary = http.get(f"/datasets/{dsname}").json()
    step = summary["summary"]["open_step"]
    r = http.post(f"/datasets/{dsname}/import", params={"replace": "true"}, content=_hostile(source, case))
    assert r.status_code == 422, f"{case}: {r.status_code} {r.text}"
    detail = r.json()["detail"]
    assert detail.startswith("not a valid dataset export") and HOSTILE[case][1] in detail, detail
    assert http.get(f"/datasets/{dsname}").json() == summary
    assert http.get(f"/datasets/{dsname}/export").content == before
    assert http.post("/select", json={"dataset": dsname, "step": step, "batch_size": 4,
                                      "strategy": "insight"}).status_code == 200  # fmt: skip
    http.delete(f"/datasets/{dsname}")


@pytest.mark.parametrize("case", ["alpha NaN", "sec_pos -5", "open_step 10^15", "group_size -5"])
def test_a_hostile_snapshot_from_the_store_is_corrupt(source, case):
    """The store's snapshots go through the same loader: a value out of domain is a corrupt snapshot
    (ValueError, which the engine reports as an unreadable snapshot, never a silent reset)."""
    blob = _hostile(source, case)
    with pytest.raises(ValueError, match=HOSTILE[case][1]):
        load_snapshot_chunks([blob[i : i + 1000] for i in range(0, len(blob), 1000)])


def test_the_genuine_export_imports_and_serves(http, dsname, source):
    assert http.post(f"/datasets/{dsname}/import", content=source).status_code == 201
    open_step = http.get(f"/datasets/{dsname}").json()["summary"]["open_step"]
    for strategy in STRATEGIES:
        r = http.post(
            "/select", json={"dataset": dsname, "step": open_step, "batch_size": 8, "strategy": strategy}
        )
        assert r.status_code == 200, (strategy, r.text)
    http.delete(f"/datasets/{dsname}")


# ---- no false refusals -----------------------------------------------------------------------------


def _random_state(
    seed: int, size: int, fractional: bool, metadata: int, steps: int, decay: float
) -> DatasetState:
    """A state after random traffic: results (fractional or whole successes, late ones included), step
    closes that move the GRESO / SEC walks and AdaRFT's target, metadata uploads and re-uploads."""
    rng = np.random.default_rng(seed)
    spec = DatasetSpec(
        name=f"prop-{seed}",
        size=size,
        uid="u",
        beta_prior=(float(rng.choice([1e-3, 0.5, 1.0, 1e6])), float(rng.choice([1e-3, 2.0, 1e6]))),
        beta_decay=decay,
        hmm_decay=float(rng.choice([1.0, 0.7, 1e-3])),
        reward_mode="fractional" if fractional else "binary",
        prior_strength=float(rng.choice([0.0, 2.0, 1e6])),
        group_decay=float(rng.choice([1.0, 0.5])),
    )
    state = DatasetState(spec)
    for step in range(steps):
        state.close_until(step)
        if metadata and rng.random() < 0.4:
            lo = int(rng.integers(0, size))
            count = int(rng.integers(1, size - lo + 1))
            rate = np.where(rng.random(count) < 0.3, np.nan, rng.random(count)).astype(np.float32)
            group = rng.integers(-1, metadata, count).astype(np.int32)
            samples = np.where(rng.random(count) < 0.3, -1, rng.choice([1, 8, 10**6], count)).astype(np.int32)
            counted = rng.random() < 0.5
            apply_metadata(state.arrays, lo, rate if rng.random() < 0.7 else None, group,
                           samples if counted else None, counted and bool(rng.random() < 0.5))  # fmt: skip
        m = int(rng.integers(0, size // 2 + 1))
        if m == 0:
            continue
        ids = rng.integers(0, size, m).astype(np.int64)
        trials = rng.integers(1, 9, m).astype(np.float64)
        if rng.random() < 0.1:
            trials[:] = 1e9
        succ = rng.random(m) * trials if fractional else np.floor(rng.random(m) * (trials + 1))
        succ = np.where(rng.random(m) < 0.2, trials, np.where(rng.random(m) < 0.2, 0.0, succ))
        state.apply_outcomes(ids, succ, trials, outcomes_from_counts(succ, trials))
    return state


@settings(max_examples=40, deadline=None, database=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    size=st.integers(1, 300),
    fractional=st.booleans(),
    metadata=st.sampled_from([0, 1, 6, 300]),
    steps=st.integers(0, 12),
    decay=st.sampled_from([1.0, 0.9, 1e-3]),
)
def test_a_genuine_snapshot_of_any_reachable_state_loads(seed, size, fractional, metadata, steps, decay):
    state = _random_state(seed, size, fractional, metadata, steps, decay)
    blob = serialize_snapshot(*state.copy_for_snapshot())
    back = deserialize_snapshot(blob)
    assert np.array_equal(back.arrays.alpha, state.arrays.alpha)
    assert back.arrays.shared.greso_pos == state.arrays.shared.greso_pos


def test_a_never_observed_dataset_round_trips():
    for spec in (DatasetSpec(name="fresh", size=5, uid="u"), DatasetSpec(name="f", size=1, uid="u",
                                                                          beta_prior=(1e-3, 1e6))):  # fmt: skip
        state = DatasetState(spec)
        assert deserialize_snapshot(serialize_snapshot(*state.copy_for_snapshot())).arrays.observed == 0


def test_the_engine_reports_a_store_snapshot_out_of_domain_as_unreadable(redis_url):
    """A snapshot in the store whose digests are valid but whose values are not: every replica that loads
    it refuses it (503, naming the field) instead of serving from it or falling back to the priors."""
    import asyncio
    import uuid

    from selector_service.errors import Unavailable
    from tests.service.test_snapshots import _drop_prefix, _engine, _observe_steps

    prefix = f"test-dom-{uuid.uuid4().hex[:8]}"

    async def scenario() -> None:
        writer, store = await _engine(redis_url, prefix, snapshot_chunk_bytes=2**24)
        try:
            await writer.create_dataset(DatasetSpec(name="ds", size=500))
            await _observe_steps(writer, "ds", range(4), seed=5)
            await writer.snapshot_now("ds")
            meta = await store.read_meta("ds")
            assert int(meta["snap_chunks"]) == 1
            key = store.keys.snap_chunk("ds", meta["snap"], 0)
            header, arrays = decode(await store.r.get(key))
            arrays["alpha"][int(arrays["obs_ids"][0])] = math.nan
            await store.r.set(key, encode(header, arrays))
            reader, other = await _engine(redis_url, prefix)
            try:
                with pytest.raises(Unavailable, match=r"cannot be read.*'alpha'"):
                    await reader.read("ds", lambda st: st)
            finally:
                await other.close()
        finally:
            await _drop_prefix(store, prefix)

    asyncio.run(scenario())


# ---- the step history, fuzzed -----------------------------------------------------------------------


def _possible_rows(state: DatasetState) -> list[str]:
    """What a served history must never say, read from the rows as /history serves them and the
    dataset's summary (docs/api.md, "Step history"), apart from how history.py checks them."""
    spec, summary = state.spec, state.summary()
    rows, _ = state.history.rows(0, 10**9)
    size, problems = spec.size, []
    if len(rows) > summary["steps_closed"]:
        problems.append(f"{len(rows)} rows, {summary['steps_closed']} steps closed")
    if sum(r["results"] for r in rows) > summary["observations"]:
        problems.append("rows hold more results than the dataset applied")
    seen = 0
    for r in rows:
        at = f"step {r['step']}: "
        if not 0 <= r["observed"] <= min(r["results"], size, r["prompts_observed"]):
            problems.append(at + "observed")
        if not seen <= r["prompts_observed"] <= summary["prompts_observed"] <= size:
            problems.append(at + "prompts_observed")
        seen = r["prompts_observed"]
        if (
            not r["selects"] <= r["selected"] <= r["selects"] * size
            or sum(r["strategies"].values()) != r["selects"]
        ):
            problems.append(at + "selected")
        if not r["results"] <= r["rollouts"] <= r["results"] * 10**9:
            problems.append(at + "rollouts")
        late = {int(k.rstrip("+")): v for k, v in r["late"].items()}
        if sum(late.values()) > r["results"] or any(lag > r["step"] for lag in late):
            problems.append(at + "late")
        if (r["dps_predicted"] is None) != (r["observed"] == 0) or (
            r["dps_predicted"] is not None and abs(sum(r["dps_predicted"]) - 1) > 1e-5
        ):
            problems.append(at + "dps_predicted")
        groups = r.get("groups") or {}
        if (
            len(groups) > 8
            or sum(g["results"] for g in groups.values()) > r["results"]
            or any(int(g) >= state.arrays.shared.n_groups for g in groups)
        ):
            problems.append(at + "groups")
    return problems


def _history_mutation(draw, header: dict, arrays: dict[str, np.ndarray]) -> str:
    """Changes one history figure of the export (a column's cell, or a header count) to a drawn value."""
    cells = sorted(k for k, v in arrays.items() if k.startswith("history.") and v.size)
    target = draw(st.sampled_from([*cells, "steps_closed", "open.fresh", "open.selected", "open.late"]))
    ints = [-1, 0, 1, 2, 7, 8, 9, 60, 61, 199, 200, 201, 10**6, 10**9, 2**56 + 1, 2**62, 2**63 - 1]
    if target in ("steps_closed", "open.fresh", "open.selected"):
        value = draw(st.sampled_from(ints))
        node = header if target == "steps_closed" else header["history"]["open"]
        node[target.rpartition(".")[2]] = value
        return f"{target} = {value}"
    if target == "open.late":
        lag, value = draw(st.integers(0, LAG_LABELS)), draw(st.sampled_from(ints))
        header["history"]["open"]["late"][lag] = value
        return f"open.late[{lag}] = {value}"
    arr = arrays[target]
    index = tuple(draw(st.integers(0, n - 1)) for n in arr.shape)
    old = arr[index]
    if arr.dtype.kind == "f":
        value = draw(st.sampled_from([math.nan, math.inf, -1.0, 0.0, 0.5, 1.0, 1.5, 3.0, 1e9, 1e12, 1e300]))
        value = draw(st.sampled_from([value, float(old) * 2, float(old) + 1]))
    else:
        value = draw(st.sampled_from([*ints, int(old) + 1, int(old) - 1]))
        value = int(np.clip(value, np.iinfo(arr.dtype).min, np.iinfo(arr.dtype).max))
    arr[index] = value
    return f"{target}{list(index)} = {value} (was {old})"


_GENUINE = {seed: serialize_snapshot(*run_schedule(seed)[0].copy_for_snapshot()) for seed in (0, 5, 10, 11)}


@settings(max_examples=300, deadline=None, database=None)
@given(seed=st.sampled_from(sorted(_GENUINE)), data=st.data())
def test_a_forged_history_is_refused_or_possible(seed, data):
    """One history figure of a genuine export (late results, groups, several strategies) changed to a
    drawn value, the checksums made again: the export is refused naming a history field, or what it
    would serve is a history some dataset of that size, max_lag and totals could have."""
    header, arrays = decode(_GENUINE[seed])
    what = _history_mutation(data.draw, header, arrays)
    try:
        state = deserialize_snapshot(encode(header, arrays))
    except ValueError as exc:
        assert "history" in str(exc) or "steps_closed" in str(exc), f"seed {seed}, {what}: {exc}"
        return
    assert not _possible_rows(state), f"seed {seed}, {what}: {_possible_rows(state)}"


def test_the_genuine_histories_are_possible():
    for seed, blob in _GENUINE.items():
        state = deserialize_snapshot(blob)
        assert state.history.n and not _possible_rows(state), seed
