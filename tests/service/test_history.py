"""The step history (selector_service/dataset/history.py) against a reference model, by search: random seeded
schedules of log records (selects, retried selects, observes on time and late, several results of one
prompt, group metadata, steps skipped) applied to a DatasetState; each row is checked against figures
the model computes from the records alone, and from the beliefs read just before each close (the DPS
prediction), not from the history's own tallies. A state restored from a snapshot at random points goes
on to write the same rows bit for bit. Also: the bound, and snapshot headers that no history could
have."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pytest

from selector_service.core.coldstart import Metadata
from selector_service.dataset import history as history_mod
from selector_service.dataset.history import LAG_LABELS, ROW_GROUPS, StepHistory, lag_label, select_note
from selector_service.dataset.state import DatasetSpec, DatasetState, pack_metadata, pack_results
from selector_service.storage.snapshot import (
    SNAPSHOT_MAGIC,
    _header_digest,
    deserialize_snapshot,
    serialize_snapshot,
)

SIZE = 60
STRATEGIES = ("insight", "dps", "uniform", "mopps")


@dataclass
class Step:
    digests: set = field(default_factory=set)
    selected: int = 0
    selects: int = 0
    strategies: dict = field(default_factory=lambda: defaultdict(int))
    results: list = field(default_factory=list)  # (prompt, successes, trials, lag, group)


class Model:
    """What each row must say, from the records applied (and the DPS priors read before each close)."""

    def __init__(self) -> None:
        self.open = 0
        self.step = Step()
        self.rows: list[dict] = []
        self.ever: set[int] = set()
        self.group = np.full(SIZE, -1)
        self.samples = np.full(SIZE, -1)  # each prompt's sample count (-1: none) and whether profiled
        self.profiled = np.zeros(SIZE, dtype=bool)
        self.applied = 0.0  # trials of every result applied

    def profiling(self) -> int:
        return int(self.samples[self.profiled & (self.samples >= 1)].sum())

    def close(self, state: DatasetState) -> None:
        st = self.step
        results = len(st.results)
        trials = sum(r[2] for r in st.results)
        succ = sum(r[1] for r in st.results)
        solved = sum(1 for r in st.results if r[1] == r[2])
        failed = sum(1 for r in st.results if r[1] == 0)
        pooled: dict[int, int] = {}
        for p, s, t, _, _ in st.results:
            code = 1 if s == 0 else 3 if s == t else 2
            pooled[p] = code if pooled.get(p, code) == code else 2
        prompts = sorted(pooled)
        self.ever |= set(prompts)
        pred = acc = None
        if prompts:
            prior = state.arrays.hmm_prior_of(np.array(prompts)).astype(np.float64)
            pred = list(prior.mean(axis=0))
            right = sum(int(np.argmax(prior[i]) == pooled[p] - 1) for i, p in enumerate(prompts))
            acc = right / len(prompts)
        late: dict[str, int] = defaultdict(int)
        groups: dict[int, list] = defaultdict(lambda: [0, 0.0, 0.0])
        for _, s, t, lag, g in st.results:
            if lag:
                late[lag_label(min(lag, LAG_LABELS))] += 1
            if g >= 0:
                groups[g][0] += 1
                groups[g][1] += s
                groups[g][2] += t
        top = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
        row = {
            "step": self.open,
            "selected": st.selected,
            "selects": st.selects,
            "observed": len(prompts),
            "results": results,
            "rollouts": trials,
            "mean_reward": succ / trials if trials else None,
            "all_solved": solved / results if results else None,
            "mixed": (results - solved - failed) / results if results else None,
            "none_solved": failed / results if results else None,
            "dps_predicted": pred,
            "dps_accuracy": acc,
            "late": dict(late),
            "strategies": dict(st.strategies),
            "prompts_observed": len(self.ever),
            "profile_rollouts": self.profiling(),
            "total_rollouts": self.applied + self.profiling(),
        }
        if groups:
            row["groups"] = {
                str(g): {"results": f[0], "mean_reward": f[1] / f[2]} for g, f in top[:ROW_GROUPS]
            }
            row["groups_omitted"] = max(0, len(top) - ROW_GROUPS)
        self.rows.append(row)
        self.open += 1
        self.step = Step()


class Log:
    """Applies records to one or more states (and the model), numbering them like the store."""

    def __init__(self, state: DatasetState, model: Model) -> None:
        self.n = 0
        self.state = state
        self.model = model

    def apply(self, kind: str, step: int, **fields: bytes | str) -> None:
        # The record first closes the steps below it, all in one close as the service does (a gap's
        # steps after the first hold no results, so the model reads no belief for them).
        while self.model.open < step:
            self.model.close(self.state)
        self.state.close_until(step)
        self.n += 1
        rec = {"n": str(self.n).encode(), "k": kind.encode(), "s": str(step).encode()}
        rec.update({k: v.encode() if isinstance(v, str) else v for k, v in fields.items()})
        self.state.apply_record(f"1-{self.n}", rec)


def run_schedule(seed: int, snapshot_every: float = 0.0) -> tuple[DatasetState, Model, DatasetState | None]:
    """A random schedule; with `snapshot_every`, a second state is restored from a snapshot of the
    first at random points and applies the same records (it must end equal)."""
    rng = random.Random(seed)
    spec = DatasetSpec(name=f"h{seed}", size=SIZE, rollouts_per_prompt=4, max_lag=rng.choice([0, 2, 9]))
    state, model = DatasetState(spec), Model()
    log = Log(state, model)
    twin = DatasetState(spec) if snapshot_every else None
    applied: list[tuple] = []

    def emit(kind: str, step: int, **fields) -> None:
        log.apply(kind, step, **fields)
        applied.append((kind, step, fields))
        nonlocal twin
        if twin is not None:
            number = str(log.n).encode()
            rec = {"n": number, "k": kind.encode(), "s": str(step).encode()}
            rec.update({k: v.encode() if isinstance(v, str) else v for k, v in fields.items()})
            twin.apply_record(f"1-{log.n}", rec)
            if rng.random() < snapshot_every:
                twin = deserialize_snapshot(serialize_snapshot(*twin.copy_for_snapshot()))

    if rng.random() < 0.5:  # groups for some prompts, some of them more than ROW_GROUPS groups
        groups = np.array([rng.randrange(-1, 12) for _ in range(SIZE)], dtype=np.int32)
        emit("m", 0, p=pack_metadata(Metadata(0, None, groups)))
        model.group = groups
    for _ in range(rng.randrange(5, 40)):
        step = model.open + (rng.random() < 0.8) + (rng.random() < 0.1) * rng.randrange(1, 4)
        for _ in range(rng.randrange(0, 4)):  # selects, some sent again
            strategy = rng.choice(STRATEGIES)
            batch = rng.randrange(1, 9)
            digest = f"{rng.randrange(3):x}{strategy}{batch}".encode().hex()[:24]
            emit("a", step, q=select_note(strategy, batch, digest))
            if step == model.open and digest not in model.step.digests:
                model.step.digests.add(digest)
                model.step.selects += 1
                model.step.selected += batch
                model.step.strategies[strategy] += 1
            step = model.open
        if rng.random() < 0.2:  # sample counts of a range of prompts, a profiling pass's or shipped ones
            lo = rng.randrange(SIZE)
            counts = np.array([rng.choice([-1, 1, 8, 16]) for _ in range(rng.randrange(1, SIZE - lo + 1))])
            profile = rng.random() < 0.6
            emit("m", model.open, p=pack_metadata(Metadata(lo, None, None, counts.astype(np.int32), profile)))
            model.samples[lo : lo + counts.size] = counts
            model.profiled[lo : lo + counts.size] = profile
        for _ in range(rng.randrange(0, 3)):  # observes: on time, or late when the dataset accepts it
            lag = rng.randrange(0, spec.max_lag + 1) if spec.max_lag and rng.random() < 0.4 else 0
            at = max(0, max(model.open, step) - lag)
            m = rng.randrange(1, 7)
            ids = np.array([rng.randrange(SIZE) for _ in range(m)], dtype=np.int64)  # repeats too
            trials = np.full(m, 4.0)
            succ = np.array([rng.choice([0, 0, 1, 2, 4, 4]) for _ in range(m)], dtype=np.float64)
            states = np.where(succ == 0, 1, np.where(succ == trials, 3, 2)).astype(np.int8)
            emit("o", at, p=pack_results(ids, succ, trials, states))
            now = max(model.open, at)
            model.applied += float(trials.sum())
            for p, s in zip(ids, succ, strict=True):
                model.step.results.append((int(p), float(s), 4.0, now - at, int(model.group[p])))
            step = model.open
    return state, model, twin


def compare(rows: list[dict], expected: list[dict], seed: int) -> None:
    assert len(rows) == len(expected), f"seed {seed}: {len(rows)} rows, expected {len(expected)}"
    for got, want in zip(rows, expected, strict=True):
        for key, value in want.items():
            if key in ("dps_predicted",) and value is not None:
                assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), (
                    f"seed {seed} step {want['step']}"
                )
            elif key == "groups":
                assert got[key].keys() == value.keys(), f"seed {seed} step {want['step']}: groups"
                for g, f in value.items():
                    assert got[key][g]["results"] == f["results"], f"seed {seed} step {want['step']}"
                    assert got[key][g]["mean_reward"] == pytest.approx(f["mean_reward"], rel=1e-12)
            elif isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-12), f"seed {seed} step {want['step']}: {key}"
            else:
                assert got[key] == value, f"seed {seed} step {want['step']}: {key} {got[key]!r} != {value!r}"
        if "groups" not in want:
            assert "groups" not in got, f"seed {seed} step {want['step']}: groups without group results"


@pytest.mark.parametrize("seed", range(40))
def test_rows_match_the_reference_model(seed):
    state, model, _ = run_schedule(seed)
    rows, after = state.history.rows(0, 10**6)
    compare(rows, model.rows, seed)
    assert after == (rows[-1]["step"] + 1 if rows else 0)
    # The close's own count of observed prompts agrees with the history's count at observe time.
    for row in rows:
        assert row["observed"] <= row["results"]


@pytest.mark.parametrize("seed", range(25))
def test_a_state_restored_from_snapshots_writes_the_same_rows(seed):
    state, _, twin = run_schedule(1000 + seed, snapshot_every=0.3)
    assert twin is not None
    twin = deserialize_snapshot(serialize_snapshot(*twin.copy_for_snapshot()))
    assert twin.history.rows(0, 10**6) == state.history.rows(0, 10**6), f"seed {1000 + seed}"
    assert twin.history.header() == state.history.header(), f"seed {1000 + seed}"
    for name, arr in state.history.arrays().items():
        np.testing.assert_array_equal(twin.history.arrays()[name], arr, err_msg=f"seed {1000 + seed} {name}")


def test_since_and_limit_page_through_the_rows():
    state, _, _ = run_schedule(7)
    rows, _ = state.history.rows(0, 10**6)
    paged, since = [], 0
    while True:
        page, since = state.history.rows(since, 3)
        if not page:
            break
        paged += page
    assert paged == rows
    assert state.history.rows(10**9, 5) == ([], 10**9)
    middle = rows[len(rows) // 2]["step"]
    assert state.history.rows(middle, 1)[0] == [rows[len(rows) // 2]]


def test_the_newest_steps_are_kept_and_the_bound_depends_on_the_closes_alone(monkeypatch):
    monkeypatch.setattr(history_mod, "HISTORY_STEPS", 50)
    monkeypatch.setattr(history_mod, "SLACK", 6)
    spec = DatasetSpec(name="bound", size=20)
    state = DatasetState(spec)
    groups = np.arange(20, dtype=np.int32) % 3
    state.apply_record(
        "1-1", {"n": b"1", "k": b"m", "s": b"0", "p": pack_metadata(Metadata(0, None, groups))}
    )
    held = []
    for step in range(200):
        ids = np.array([step % 20, (step + 1) % 20], dtype=np.int64)
        succ, trials = np.array([1.0, 2.0]), np.array([2.0, 2.0])
        payload = pack_results(ids, succ, trials, np.array([2, 3], dtype=np.int8))
        n = str(step + 2).encode()
        state.apply_record(f"1-{step + 2}", {"n": n, "k": b"o", "s": str(step).encode(), "p": payload})
        held.append(state.history.n)
        rows, _ = state.history.rows(0, 10**6)
        assert len(rows) == min(step, 50)  # the newest 50 closed steps, whatever is held
        if rows:
            assert [r["step"] for r in rows] == list(range(max(0, step - 50), step))
            figures: dict[str, list[float]] = {}
            for prompt, s in (((step - 1) % 20, 1.0), (step % 20, 2.0)):  # the last row's results
                f = figures.setdefault(str(prompt % 3), [0, 0.0, 0.0])
                f[0], f[1], f[2] = f[0] + 1, f[1] + s, f[2] + 2.0
            assert rows[-1]["groups"] == {
                g: {"results": f[0], "mean_reward": f[1] / f[2]} for g, f in figures.items()
            }
    assert max(held) <= 56 and min(held[100:]) >= 50
    # A state restored from a snapshot holds what the uninterrupted one holds.
    restored = deserialize_snapshot(serialize_snapshot(*state.copy_for_snapshot()))
    assert restored.history.n == state.history.n
    assert restored.history.rows(0, 10**6) == state.history.rows(0, 10**6)


def _rewrite(blob: bytes, edit) -> bytes:
    """The snapshot `blob` with its header JSON changed by `edit` (digest recomputed)."""
    hlen = int.from_bytes(blob[8:12], "little")
    header = json.loads(blob[12 : 12 + hlen])
    edit(header)
    head = json.dumps(header).encode()
    prefix = SNAPSHOT_MAGIC + len(head).to_bytes(4, "little") + head
    return prefix + _header_digest(prefix) + blob[12 + hlen + 16 :]


@pytest.mark.parametrize(
    "edit",
    [
        lambda h: h["history"]["open"].update(selected=-1),
        lambda h: h["history"]["open"].update(selects=True),
        lambda h: h["history"]["open"].update(digests=["not hex"]),
        lambda h: h["history"]["open"].update(late=[0] * 3),
        lambda h: h["history"]["open"].update(pred=[float("inf"), 0, 0]),
        lambda h: h["history"].update(strategies=["insight", "insight"]),
        lambda h: h["history"].pop("open"),
        lambda h: h.pop("history"),
    ],
)
def test_a_snapshot_whose_history_no_service_could_write_is_refused(edit):
    state, _, _ = run_schedule(5)
    state.history.select("insight", 4, "ab")
    blob = serialize_snapshot(*state.copy_for_snapshot())
    assert deserialize_snapshot(blob).history.rows(0, 100) == state.history.rows(0, 100)
    with pytest.raises(ValueError):
        deserialize_snapshot(_rewrite(blob, edit))


@pytest.mark.parametrize("column", ["step", "results", "late", "group_at", "dps_predicted", "rollouts"])
def test_history_arrays_that_no_step_could_have_are_refused(column):
    state, _, _ = run_schedule(11)
    assert state.history.n >= 3
    header, arrays = state.copy_for_snapshot()
    arr = arrays["history." + column]
    bad = {
        "step": lambda a: a.__setitem__(1, a[0]),
        "results": lambda a: a.__setitem__(0, a[0] + 1),
        "late": lambda a: a.__setitem__((0, 1), a[0, 1] + 1),
        "group_at": lambda a: a.__setitem__(0, 1),
        "dps_predicted": lambda a: a.__setitem__((0, 0), 1.5),
        "rollouts": lambda a: a.__setitem__(0, np.nan),
    }[column]
    bad(arr)
    with pytest.raises(ValueError):
        deserialize_snapshot(serialize_snapshot(header, arrays))


def test_a_malformed_select_note_is_refused_before_anything_changes():
    state = DatasetState(DatasetSpec(name="note", size=10))
    for note in (b"insight 4", b"Insight 4 ab", b"insight 0 ab", b"insight 4 xyz", b"insight four ab"):
        with pytest.raises(ValueError):
            state.apply_record("1-1", {"n": b"1", "k": b"a", "s": b"3", "q": note})
        assert state.open_step == 0 and state.seq == 0
    assert StepHistory.parse_note(select_note("dps", 8, "0f")) == ("dps", 8, "0f")


def _fresh_priors_twin(ids, hmm_slot, obs_state, obs_prior):
    """The kernel's slow twin, in numpy: the first result of each prompt in the record, unobserved at
    the open step; (sum of the observed ones' priors, never-observed count, count)."""
    first = np.zeros(ids.size, dtype=bool)
    first[np.unique(ids, return_index=True)[1]] = True
    slots = hmm_slot[ids]
    seen = slots >= 0
    fresh = first.copy()
    fresh[seen] &= obs_state[slots[seen]] == 0
    rows = slots[fresh & seen]
    return (
        obs_prior[rows].astype(np.float64).sum(axis=0),
        int(np.count_nonzero(fresh & ~seen)),
        int(fresh.sum()),
    )


@pytest.mark.parametrize("seed", range(40))
def test_the_fresh_prompt_kernel_equals_its_twin(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    m = int(rng.integers(0, 3 * n))  # empty records, records with repeats, records over the whole dataset
    observed = int(rng.integers(0, n + 1))
    hmm_slot = np.full(n, -1, dtype=np.int32)
    hmm_slot[rng.choice(n, observed, replace=False)] = np.arange(observed, dtype=np.int32)
    obs_state = rng.integers(0, 4, max(observed, 1)).astype(np.int8)
    if seed % 4 == 0:
        obs_state[:] = 0  # nothing observed at the open step yet
    obs_prior = np.asfortranarray(rng.dirichlet(np.ones(3), max(observed, 1)).astype(np.float32))
    ids = rng.integers(0, n, m) if seed % 3 else rng.choice(n, min(m, n), replace=False)
    got = history_mod._fresh_priors(ids, hmm_slot, obs_state, obs_prior.T)
    want = _fresh_priors_twin(ids, hmm_slot, obs_state, obs_prior)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
    assert (got[1], got[2]) == want[1:]
