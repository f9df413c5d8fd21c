"""DPS select over the observed set plus the implicit never-observed block (select.dps_select) against the
dense rule: topk_random_ties over every prompt's score, positions = prompt ids.

Where the batch does not stop inside the block of prompts tied at the never-observed score, the two are
the same batch bit for bit; where it does, the same distribution (checked by inclusion counts over many
seeds). Memory and time are O(prompts ever observed + B): the block is never materialized.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from scipy import stats

from selector_service.core import (
    PARTIAL,
    SOLVED,
    UNSOLVED,
    BeliefArrays,
    apply_results,
    close_step,
    score,
    stream,
    topk_random_ties,
)
from selector_service.core.select import dps_select

THIRD = np.float32(1 / 3)


def observed_beliefs(
    n: int, observed: int, steps: int = 4, seed: int = 0, exact_ties: int = 0
) -> BeliefArrays:
    """n prompts, `observed` of them (random ids) seen over a few steps; `exact_ties` observed prompts
    forced to the uniform prior, so that they tie with the never-observed block."""
    rng = np.random.default_rng(seed)
    ba = BeliefArrays.new(n)
    pool = rng.choice(n, observed, replace=False)
    for step in range(steps):
        ids = pool if step == 0 else rng.choice(pool, observed // 2, replace=False)
        states = rng.choice([UNSOLVED, PARTIAL, SOLVED], ids.size).astype(np.int8)
        successes = np.where(states == UNSOLVED, 0.0, np.where(states == SOLVED, 8.0, 4.0))
        apply_results(ba, ids, successes, np.full(ids.size, 8.0), states, 1.0, 1.0, 1.0)
        close_step(ba, 0.7)
    if exact_ties:
        ba.obs_prior[:exact_ties] = THIRD
    return ba


def dense(ba: BeliefArrays, k: int, weight: float, seed: int):
    full = score(
        ba, strategy="dps", params={"entropy_weight": weight}, ids=None, step=0, seed=0, key="k", dataset_k=8
    )
    pos = topk_random_ties(full, k, stream("k", 1, seed, "ties"))
    return pos, full[pos], full


def sparse(ba: BeliefArrays, k: int, weight: float, seed: int):
    return dps_select(ba, k, weight, stream("k", 1, seed, "ties"))


def counts_at(full, s0):
    above = int(np.count_nonzero(full > s0))
    return above, int(np.count_nonzero(full == s0))


@pytest.mark.parametrize(
    ("weight", "n", "observed"),
    [(0.0, 3000, 400), (0.3, 3000, 400), (-1.0, 3000, 400), (0.0, 60_000, 40_000), (0.3, 60_000, 40_000)],
)
def test_batches_outside_the_block_equal_the_dense_rule_bit_for_bit(weight, n, observed):
    """Small observed sets are kept whole by the scan; 40000 rows take the sampled one-pass path."""
    ba = observed_beliefs(n, observed, exact_ties=5)
    _, _, full = dense(ba, 1, weight, 0)
    s0 = full[ba.hmm_slot < 0][0]
    above, tied = counts_at(full, s0)
    assert 0 < above < observed and tied == n - observed + 5
    for k in (1, 7, above, above - 3):  # the block is not reached
        for seed in range(3):
            ids, scores = sparse(ba, k, weight, seed)
            pos, dense_scores, _ = dense(ba, k, weight, seed)
            np.testing.assert_array_equal(ids, pos)
            np.testing.assert_array_equal(scores, dense_scores)
    for k in (above + tied, above + tied + 1, n - 1, n):  # the whole block is in
        ids, scores = sparse(ba, k, weight, 4)
        pos, dense_scores, _ = dense(ba, k, weight, 4)
        np.testing.assert_array_equal(ids, pos)
        np.testing.assert_array_equal(scores, dense_scores)


def _arranged(ba: BeliefArrays, arrangement: str, seed: int) -> BeliefArrays:
    """The same priors moved between slots: ascending or descending score order, or a few values only
    (blocks of ties much larger than the selection buffer)."""
    m = ba.observed
    prior = np.ascontiguousarray(ba.obs_prior[:m])
    if arrangement == "ascending":
        prior = prior[np.argsort(prior[:, 1], kind="stable")]
    elif arrangement == "descending":
        prior = prior[np.argsort(-prior[:, 1], kind="stable")]
    else:  # "few values": every prior one of 3 rows
        rows = prior[np.random.default_rng(seed).choice(m, 3, replace=False)]
        prior = rows[np.random.default_rng(seed + 1).integers(0, 3, m)]
    ba.obs_prior[:m] = prior
    return ba


@pytest.mark.parametrize("arrangement", ["ascending", "descending", "few values"])
@pytest.mark.parametrize("sample", ["usual", "one row"])
@pytest.mark.parametrize("weight", [0.0, 0.3])
def test_any_arrangement_of_scores_gives_the_dense_batch(monkeypatch, arrangement, sample, weight):
    """The ranking of the observed set (select._rank_observed) keeps the rows at or above a threshold
    placed by a sample, in one pass; where the sample misleads (here: a sample of one row), the exact
    passes of _Source rank instead. Sorted scores and blocks of ties far larger than k included, the
    batch is the dense rule's, whichever path ranked."""
    module = sys.modules[dps_select.__module__]
    if sample == "one row":
        monkeypatch.setattr(module, "_RANK_SAMPLE_MIN", 1)
        monkeypatch.setattr(module, "_RANK_SAMPLE_MAX", 1)
    exact, recording = [], []
    top = module._Source.top

    def spy(self, *args):
        if recording:
            exact.append(True)
        return top(self, *args)

    monkeypatch.setattr(module._Source, "top", spy)  # the exact passes (not the dense rule's own calls)
    ba = _arranged(observed_beliefs(30_000, 20_000, seed=5), arrangement, seed=5)
    _, _, full = dense(ba, 1, weight, 0)
    s0 = full[ba.hmm_slot < 0][0]
    above = int(np.count_nonzero(full > s0))
    observed_scores = full[ba.obs_ids[: ba.observed]]
    for k in (1, 256, 1000, 5000):
        if k > above:
            continue
        for seed in range(2):
            recording.append(True)
            ids, scores = sparse(ba, k, weight, seed)
            recording.clear()
            pos, dense_scores, _ = dense(ba, k, weight, seed)
            np.testing.assert_array_equal(ids, pos)
            np.testing.assert_array_equal(scores, dense_scores)
        if sample == "one row" and arrangement == "descending" and weight == 0.0:
            # the one sampled row is the largest score: the pass keeps its ties, too few beyond them
            assert bool(exact) == (np.count_nonzero(observed_scores == observed_scores.max()) < k)
        if sample == "usual" and arrangement != "few values":
            assert not exact
        exact.clear()


@pytest.mark.parametrize(("n", "observed"), [(600, 100), (600, 595)])  # rejection and listed block draws
def test_batches_that_stop_in_the_block_have_the_dense_distribution(n, observed):
    """k reaches into the tie at the never-observed score: the prompts above it are always in, and every
    tied prompt (observed at the uniform prior, or never observed) is in with probability need / tied,
    as under the dense rule. Scores and the prompts above match exactly."""
    ba = observed_beliefs(n, observed, exact_ties=3)
    _, _, full = dense(ba, 1, 0.0, 0)
    s0 = float(THIRD)
    above, tied = counts_at(full, s0)
    need = min(tied - 1, 4)
    k = above + need
    hits = np.zeros(n, dtype=np.int64)
    dense_hits = np.zeros(n, dtype=np.int64)
    runs = 3000 if tied > 20 else 1500
    for seed in range(runs):
        ids, scores = sparse(ba, k, 0.0, seed)
        assert np.unique(ids).size == k and np.all(np.diff(scores) <= 0)
        np.testing.assert_array_equal(scores, np.sort(full)[::-1][:k])
        assert np.all(full[ids[:above]] > s0) and np.all(full[ids[above:]] == s0)
        hits[ids] += 1
        dense_hits[dense(ba, k, 0.0, seed)[0]] += 1
    tied_ids = np.flatnonzero(full == s0)
    assert np.all(hits[full > s0] == runs) and hits[full < s0].sum() == 0
    for h in (hits, dense_hits):
        expected = np.full(tied_ids.size, runs * need / tied_ids.size)
        assert stats.chisquare(h[tied_ids], expected).pvalue > 1e-4
    assert stats.ks_2samp(hits[tied_ids], dense_hits[tied_ids]).pvalue > 1e-4


def test_order_among_equal_scores_is_random_in_the_block():
    ba = BeliefArrays.new(50)  # nothing observed: every prompt at 1/3
    first = np.zeros(50, dtype=np.int64)
    for seed in range(2000):
        ids, scores = sparse(ba, 50, 0.0, seed)
        assert np.all(scores == np.float64(THIRD)) and np.unique(ids).size == 50
        first[ids[0]] += 1
    assert stats.chisquare(first).pvalue > 1e-4


def test_select_never_touches_the_block_where_it_is_not_needed(monkeypatch):
    """O(observed + B): at 10^7 prompts with 1000 observed, the select neither scans the slot map nor
    allocates anything of size N."""
    import tracemalloc

    ba = observed_beliefs(10_000_000, 1000, steps=2)
    sparse(ba, 256, 0.0, 0)  # compile
    tracemalloc.start()
    try:
        ids, _ = sparse(ba, 256, 0.0, 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ids.size == 256 and peak < 2_000_000  # bytes: the 64k-bin histogram and small arrays


def test_a_large_observed_set_stopping_in_the_block_keeps_the_right_scores():
    """The one-pass scan over 40000 observed rows, boundary at the never-observed score."""
    ba = observed_beliefs(60_000, 40_000, exact_ties=5)
    _, _, full = dense(ba, 1, 0.0, 0)
    s0 = float(THIRD)
    above, _ = counts_at(full, s0)
    k = above + 50
    for seed in range(5):
        ids, scores = sparse(ba, k, 0.0, seed)
        assert np.unique(ids).size == k
        np.testing.assert_array_equal(scores, np.sort(full)[::-1][:k])
        np.testing.assert_array_equal(np.sort(ids[:above]), np.flatnonzero(full > s0))
        assert np.all(full[ids[above:]] == s0)


@pytest.mark.parametrize("seed", range(6))
def test_rank_th_largest_of_the_sample_matches_a_sort(seed):
    """select._rank_th_largest (the threshold of the one-pass ranking) against its literal twin: the
    rank-th entry of the descending sort, duplicates counted, NaN left out, -inf past the end."""
    module = sys.modules[dps_select.__module__]
    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 3000))
    values = rng.choice(rng.random(int(rng.integers(1, 50))), size)  # few distinct values: many ties
    values[rng.random(size) < 0.05] = np.nan
    finite = np.sort(values[~np.isnan(values)])[::-1]
    for rank in (1, 2, 7, 40, size, size + 3):
        want = finite[rank - 1] if rank <= finite.size else -np.inf
        assert module._rank_th_largest(values, rank) == want
