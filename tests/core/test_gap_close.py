"""A close over a gap of several steps in one pass (core/dps.py `close_step(steps=g)`,
core/step_close.py `close_open_step(steps=g)`, state.py `close_until`) against literal twins.

The DPS twin is tests/core/naive.py's per-prompt 3x3 loop run on float64 copies, once for the open step
and then g - 1 times as steps without evidence, rounded to float32 once at the end: the gap close's
definition. The kernel computes D in closed form, starts the prior's walk from the uniform belief
where the steps after that point shrink any difference below 2^-34 (Dobrushin's coefficient), and
uses powers of P by squaring when hmm_decay = 1; the stored float32 values agree with the twin to one
unit in the last place (a value within 2^-34 of a rounding boundary may round the other way).
"""

from __future__ import annotations

import numpy as np
import pytest

from selector_service.core import BeliefArrays, close_open_step, close_step, dps
from selector_service.core.step_close import close_shared, close_shared_empty
from selector_service.dataset.state import DatasetSpec, DatasetState
from tests.core import naive
from tests.core.test_dps import dense_reference, observe, run_random_steps

GAPS = [2, 3, 7, 40, 1000]


def empty_steps(d: np.ndarray, prior: np.ndarray, prev: np.ndarray, lam: float, d0: float, k: int) -> None:
    """k steps without evidence for every prompt, float64, in place (docs/methods.md §2, vectorised over
    prompts; the per-prompt twin is naive.close_step, checked equal for the first steps below)."""
    big = d.reshape(-1, 3, 3)
    for _ in range(k):
        big[:] = lam * big + (1.0 - lam) * d0
        transition = big / big.sum(axis=1, keepdims=True)
        prev[:] = prior
        new = np.einsum("pij,pj->pi", transition, prior)
        prior[:] = new / new.sum(axis=1, keepdims=True)


def twin_gap_close(ref: dict[str, np.ndarray], lam: float, d0: float, steps: int) -> tuple[dict, tuple]:
    wide = {k: (v.astype(np.float64) if k != "step_state" else v.copy()) for k, v in ref.items()}
    stats = naive.close_step(
        wide["hmm_d"], wide["hmm_prior"], wide["hmm_prev"], wide["step_state"], lam, d0=d0
    )
    empty_steps(wide["hmm_d"], wide["hmm_prior"], wide["hmm_prev"], lam, d0, steps - 1)
    out = {k: (v.astype(np.float32) if k != "step_state" else v) for k, v in wide.items()}
    return out, stats


def test_vectorised_empty_steps_equal_the_literal_loop():
    _, ref, _ = run_random_steps(60, 0.7, 10, seed=5)
    wide = {k: v.astype(np.float64) for k, v in ref.items()}
    literal = {k: v.copy() for k, v in wide.items()}
    empty_steps(wide["hmm_d"], wide["hmm_prior"], wide["hmm_prev"], 0.7, 1.0, 3)
    for _ in range(3):
        naive.close_step(
            literal["hmm_d"], literal["hmm_prior"], literal["hmm_prev"], literal["step_state"], 0.7
        )
    for name in ("hmm_d", "hmm_prior", "hmm_prev"):
        np.testing.assert_allclose(wide[name], literal[name], rtol=1e-14, atol=0, err_msg=name)


def with_open_step(n: int, lam: float, d0: float, seed: int, warm: int = 25) -> tuple[BeliefArrays, dict]:
    """`warm` random steps closed, then a random set observed at the open step (not closed)."""
    ba, ref, _ = run_random_steps(n, lam, warm, seed=seed, d0=d0)
    rng = np.random.default_rng(seed + 1)
    ids = rng.integers(0, 2 * n // 3, n // 3)
    states = rng.choice([1, 2, 3], ids.size).astype(np.int8)
    observe(ba, ids, states)
    for p, s in zip(ids, states, strict=True):
        ref["step_state"][p] = naive.combine_state(int(ref["step_state"][p]), int(s))
    return ba, ref


@pytest.mark.parametrize("steps", GAPS)
@pytest.mark.parametrize(("lam", "d0"), [(0.7, 1.0), (0.95, 1.0), (0.999, 1.0), (1.0, 1.0), (0.3, 1.0), (0.1, 0.5), (0.7, 0.3), (1.0, 0.3)])  # fmt: skip
def test_gap_close_matches_the_literal_steps(lam, d0, steps):
    ba, ref = with_open_step(90, lam, d0, seed=int(lam * 1000) + steps)
    stats = close_step(ba, lam, steps=steps)
    twin, twin_stats = twin_gap_close(ref, lam, d0, steps)
    dense = ba.dense_hmm()
    for name in ("hmm_d", "hmm_prior", "hmm_prev"):
        np.testing.assert_array_max_ulp(dense[name], twin[name], maxulp=1)
    np.testing.assert_array_equal(dense["step_state"], 0)
    assert stats[:3] == twin_stats[:3]  # the open step's observed, partial, correct
    top = np.argmax(dense["hmm_prior"], axis=1)  # ties to the lowest state, as the kernel's
    assert stats[3:] == tuple(int((top == s).sum()) for s in range(3))
    # Prompts never observed stay exactly at D0 and uniform: the kernel does not walk them.
    never = ba.hmm_slot < 0
    assert never.any()
    assert np.all(dense["hmm_d"][never] == np.float32(d0))
    assert np.all(dense["hmm_prior"][never] == np.float32(1 / 3))


@pytest.mark.parametrize("lam", [0.7, 1.0])
def test_gap_close_at_the_domain_edges(lam):
    """Beliefs at the edges of what a close can produce: D columns of a prompt observed in one state for
    ever (a near-identity P: with lam = 1 the slowest walk, counts in the thousands), D at D0, priors
    one-hot; and a step where every prompt was observed."""
    n = 12
    ba = BeliefArrays.new(n)
    ref = dense_reference(ba)
    for _ in range(400 if lam == 1.0 else 60):
        ids = np.arange(n)
        states = np.array([1, 2, 3] * 4, dtype=np.int8)
        observe(ba, ids, states)
        ref["step_state"][:] = states
        close_step(ba, lam)
        naive.close_step(ref["hmm_d"], ref["hmm_prior"], ref["hmm_prev"], ref["step_state"], lam)
    observe(ba, np.arange(n), np.array([3, 2, 1] * 4, dtype=np.int8))
    ref["step_state"][:] = np.array([3, 2, 1] * 4, dtype=np.int8)
    for steps in (2, 50, 1000):
        got = ba.copy()
        close_step(got, lam, steps=steps)
        twin, _ = twin_gap_close({k: v.copy() for k, v in ref.items()}, lam, 1.0, steps)
        dense = got.dense_hmm()
        for name in ("hmm_d", "hmm_prior", "hmm_prev"):
            np.testing.assert_array_max_ulp(dense[name], twin[name], maxulp=1)


def test_gap_parallel_path_equals_serial_path_bitwise(monkeypatch):
    n = dps.PARALLEL_MIN * 2 + 77
    rng = np.random.default_rng(3)
    big = BeliefArrays.new(n)
    observe(big, rng.integers(0, n, n), rng.choice([1, 2, 3], n).astype(np.int8))
    close_step(big, 0.7)
    observe(big, rng.integers(0, n, n // 4), rng.choice([1, 2, 3], n // 4).astype(np.int8))
    for steps in (2, 9, 1000):
        serial, parallel = big.copy(), big.copy()
        monkeypatch.setattr(dps, "CLOSE_PARALLEL_MIN", 0)
        stats = close_step(parallel, 0.7, steps=steps)
        monkeypatch.setattr(dps, "PARALLEL_MIN", n + 1)
        serial_stats = close_step(serial, 0.7, steps=steps)
        monkeypatch.undo()
        assert stats == serial_stats
        for name, arr in serial.arrays().items():
            np.testing.assert_array_equal(parallel.arrays()[name], arr, err_msg=name)


def test_one_step_is_the_step_close_bit_for_bit():
    ba, _ = with_open_step(90, 0.7, 1.0, seed=9)
    a, b = ba.copy(), ba.copy()
    assert close_step(a, 0.7, steps=1) == close_step(b, 0.7)
    for name, arr in a.arrays().items():
        np.testing.assert_array_equal(b.arrays()[name], arr, err_msg=name)
    with pytest.raises(ValueError, match="steps"):
        close_step(ba, 0.7, steps=0)


def grouped_beliefs(seed: int) -> BeliefArrays:
    """Beliefs whose shared state has groups with counts, SEC values and a step's advantages pending."""
    rng = np.random.default_rng(seed)
    ba = BeliefArrays.new(40)
    sh = ba.shared
    sh.grow(4)
    sh.grouped = True
    sh.sec_q[:] = rng.normal(size=4)
    sh.group_successes[:] = rng.uniform(0, 50, 4)
    sh.group_trials[:] = sh.group_successes + rng.uniform(0, 50, 4)
    sh.step_adv[:] = rng.normal(size=4)
    sh.step_adv_n[:] = rng.integers(0, 5, 4)
    sh.step_counts[:] = [10, 2, 3, 30, 80]
    return ba


def test_shared_state_over_a_gap_equals_its_steps():
    """close_shared_empty(k) is close_shared of k steps without results, in closed form."""
    for steps in (1, 2, 17, 1000):
        ours, theirs = grouped_beliefs(1), grouped_beliefs(1)
        close_shared(ours)
        close_shared_empty(ours, steps - 1)
        for _ in range(steps):
            close_shared(theirs)
        for name in ("sec_q", "group_successes", "group_trials"):
            np.testing.assert_allclose(
                getattr(ours.shared, name), getattr(theirs.shared, name), rtol=1e-12, atol=1e-300
            )
        for name in ("p_easy", "p_hard", "adarft_t"):
            assert getattr(ours.shared, name) == getattr(theirs.shared, name)
        assert ours.shared.cold_version > 0 and theirs.shared.cold_version > 0


def test_close_open_step_over_a_gap_moves_no_walk_after_the_first():
    ba, _ = with_open_step(90, 0.7, 1.0, seed=4)
    ours, theirs = ba.copy(), ba.copy()
    stats = close_open_step(ours, hmm_decay=0.7, key="d", steps=5)
    first = close_open_step(theirs, hmm_decay=0.7, key="d")
    assert stats[:3] == first[:3]
    assert ours.shared.greso_pos == theirs.shared.greso_pos
    np.testing.assert_array_equal(ours.shared.sec_pos, theirs.shared.sec_pos)


def test_state_close_until_writes_a_row_per_step_of_the_gap():
    spec = DatasetSpec(name="gap", size=50)
    state = DatasetState(spec)
    ids = np.arange(10)
    state.apply_outcomes(ids, np.full(10, 3.0), np.full(10, 8.0), np.full(10, 2, dtype=np.int8))
    state.close_until(7)
    assert state.open_step == 7 and state.steps_closed == 7
    rows = state.history.rows(0, 100)[0]
    assert [r["step"] for r in rows] == list(range(7))
    assert rows[0]["results"] == 10 and rows[0]["observed"] == 10
    assert all(r["results"] == 0 and r["observed"] == 0 for r in rows[1:])
    state.close_until(7)  # nothing to close
    assert state.steps_closed == 7
