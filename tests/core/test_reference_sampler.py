"""The dictionary-based reference sampler (bench/reference_dps_sampler.py) against docs/methods.md §2 and against
the service's close_step: bench_scale.py compares their speed, which is only fair if they compute the
same beliefs. Every prompt, every field (Dirichlet counts, prior, prev_post), after every step."""

from __future__ import annotations

import importlib.util
import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from selector_service.core import BeliefArrays, apply_results, close_step, dps, strategies
from selector_service.core._parallel import CHUNK

ROOT = Path(__file__).resolve().parents[2]
K = 8
#: The service stores float32 and rounds once per step (relative error ~1e-7, measured up to 1.4e-7);
#: the reference computes in float64.
RTOL, ATOL = 1e-6, 1e-8


def _load_reference():
    spec = importlib.util.spec_from_file_location(
        "reference_dps_sampler", ROOT / "bench" / "reference_dps_sampler.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference_dps_sampler"] = module
    spec.loader.exec_module(module)
    return module


ref = _load_reference()


def run_both(n: int, steps: int, batch: int, lam: float, seed: int, reference_lam: float | None = None):
    """`steps` steps of `batch` distinct observed prompts with random success rates, applied to the
    service's BeliefArrays (apply_results + close_step) and to the reference (train). Yields both
    after every step."""
    rng = np.random.default_rng(seed)
    ba = BeliefArrays.new(n)
    sampler = ref.DictHMMSampler(batch, lam if reference_lam is None else reference_lam)
    sampler.select(list(range(n)))  # the released runs rank the whole dataset: every prompt is known
    rates_pool = np.array([0.0, 1 / 8, 3 / 8, 1 / 2, 7 / 8, 1.0])
    for _ in range(steps):
        ids = rng.choice(n, size=batch, replace=False)
        rates = rng.choice(rates_pool, size=batch)
        states = np.array([ref.state_of_rate(r) for r in rates], dtype=np.int8)
        apply_results(ba, ids, rates * K, np.full(batch, float(K)), states, 1.0, 1.0, 1.0)
        close_step(ba, lam)
        sampler.train(ids.tolist(), rates.tolist())
        yield ba, sampler


def final_state(**kwargs):
    """The (BeliefArrays, reference sampler) pair after the last step of run_both(**kwargs)."""
    return deque(run_both(**kwargs), maxlen=1)[0]


def assert_same_beliefs(ba: BeliefArrays, sampler) -> None:
    """Every prompt, observed or not: the never-observed ones are implicit in `ba` (D0 and 1/3) and
    explicit, updated every step, in the reference."""
    d, prior, prev = sampler.as_arrays(ba.n)
    dense = ba.dense_hmm()
    np.testing.assert_allclose(dense["hmm_d"], d, rtol=RTOL, atol=ATOL, err_msg="Dirichlet counts D")
    np.testing.assert_allclose(dense["hmm_prior"], prior, rtol=RTOL, atol=ATOL, err_msg="prior")
    np.testing.assert_allclose(dense["hmm_prev"], prev, rtol=RTOL, atol=ATOL, err_msg="prev_post")


def test_state_of_rate():
    assert ref.state_of_rate(0.0) == 1
    assert ref.state_of_rate(1.0) == 3
    for rate in (1 / 8, 0.5, 7 / 8):
        assert ref.state_of_rate(rate) == 2


def test_reference_reproduces_the_methods_worked_values():
    """docs/methods.md §2, D0 = ones, lam = 0.5: a never-seen prompt stays at 1/3; one observation in state 2
    gives 0.40 next, in state 1 or 3 gives 0.30; with no further observations 0.40 relaxes to 0.368,
    0.351."""
    sampler = ref.DictHMMSampler(batch_size=1, decay=0.5)
    sampler.select([0, 1, 2, 3])
    sampler.train([0, 1, 2], [0.5, 0.0, 1.0])
    assert sampler.priors["0"][1] == pytest.approx(0.40)
    assert sampler.priors["1"][1] == pytest.approx(0.30)
    assert sampler.priors["2"][1] == pytest.approx(0.30)
    assert sampler.priors["3"][1] == pytest.approx(1 / 3)
    sampler.train([], [])
    assert sampler.priors["0"][1] == pytest.approx(0.368, abs=5e-4)
    sampler.train([], [])
    assert sampler.priors["0"][1] == pytest.approx(0.351, abs=5e-4)
    assert sampler.priors["3"][1] == pytest.approx(1 / 3)
    assert sampler.times_sampled == {"0": 1, "1": 1, "2": 1, "3": 0}


@pytest.mark.parametrize("lam", [0.5, 0.7, 1.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_reference_agrees_with_close_step_every_step(lam, seed):
    for ba, sampler in run_both(n=300, steps=25, batch=30, lam=lam, seed=seed):
        assert_same_beliefs(ba, sampler)


def test_reference_agrees_with_the_parallel_close(monkeypatch):
    """From PARALLEL_MIN observed prompts on, close_step runs its parallel kernel (chunks of CHUNK rows);
    it must agree as well. The threshold is lowered so that the observed set crosses it, and then
    spans two chunks, within a few steps the reference can afford."""
    monkeypatch.setattr(dps, "PARALLEL_MIN", 1000)
    monkeypatch.setattr(dps, "CLOSE_PARALLEL_MIN", 0)
    parallel_steps = 0
    for ba, sampler in run_both(n=6000, steps=12, batch=256, lam=0.7, seed=2):
        parallel_steps += ba.observed >= 1000
        assert_same_beliefs(ba, sampler)
    assert parallel_steps >= 6 and ba.observed > CHUNK


def test_both_select_the_same_scores():
    """The reference's top-B by prior(2) and the service's DPS select over the whole dataset pick
    batches with the same score values (which of several tied prompts gets in may differ: the service
    breaks ties at random, the reference by argsort order)."""
    batch = 40
    ba, sampler = final_state(n=500, steps=12, batch=batch, lam=0.7, seed=3)
    ours_ids, ours_scores = strategies.select(
        ba, strategy="dps", params=None, batch_size=batch, step=12, seed=0, key="t", dataset_k=K
    )
    ref_ids, beliefs = sampler.select(list(range(ba.n)))
    ref_scores = beliefs[ref_ids, 1]
    np.testing.assert_allclose(np.sort(ours_scores), np.sort(ref_scores), rtol=RTOL, atol=ATOL)
    assert len(set(ours_ids.tolist())) == batch


def test_reference_select_keeps_the_largest_scores():
    sampler = ref.DictHMMSampler(batch_size=5, decay=0.7, entropy_weight=0.0)
    rng = np.random.default_rng(4)
    for p in range(50):
        belief = rng.random(3) + 0.01
        sampler.entry(p)
        sampler.priors[str(p)] = belief / belief.sum()
    chosen, beliefs = sampler.select(list(range(50)))
    scores = beliefs[:, 1]
    rest = np.setdiff1d(np.arange(50), chosen)
    assert scores[chosen].min() > scores[rest].max()
    assert list(scores[chosen]) == sorted(scores[chosen], reverse=True)


def test_comparison_detects_a_different_decay():
    """The tolerance is tight enough to fail: a reference run at decay 0.501 instead of 0.5 disagrees."""
    ba, sampler = final_state(n=200, steps=5, batch=20, lam=0.5, seed=5, reference_lam=0.501)
    with pytest.raises(AssertionError):
        assert_same_beliefs(ba, sampler)
