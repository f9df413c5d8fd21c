"""Seeded selection primitives (core/select.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from selector_service.core import (
    SOLVED,
    candidate_pool,
    epoch_permutation,
    history_batch,
    mopps_threshold_select,
    stream,
    topk_random_ties,
    uniform_batch,
)
from selector_service.core.select import (
    TiedScores,
    _Source,
    block_at,
    kth_largest,
    retie,
    tie_index,
    topk_tied,
)
from tests.core import naive

# ---------------------------------------------------------------- candidate_pool


def test_candidate_pool_is_distinct_in_range_and_uniform():
    counts = np.zeros(100, dtype=int)
    for step in range(2000):
        pool = candidate_pool(100, 10, stream("k", step, 0, "candidates"))
        assert pool.dtype == np.int64 and pool.size == 10 and np.unique(pool).size == 10
        assert pool.min() >= 0 and pool.max() < 100
        counts[pool] += 1
    # each id expected 200 times; binomial sd ~13.4: 6 sd either side
    assert counts.min() > 120 and counts.max() < 280
    np.testing.assert_array_equal(candidate_pool(5, 5, stream("k", 0, 0, "c")), np.arange(5))


def test_candidate_pool_large_n():
    pool = candidate_pool(10**7, 4096, stream("k", 0, 0, "candidates"))
    assert np.unique(pool).size == 4096 and pool.max() < 10**7
    with pytest.raises(ValueError):
        candidate_pool(10, 11, stream("k", 0, 0, "c"))


# ---------------------------------------------------------------- kth_largest (radix select)


@settings(max_examples=300, deadline=None, database=None)
@given(
    values=st.lists(st.floats(allow_nan=False, allow_subnormal=True), min_size=1, max_size=80)
    | st.lists(st.sampled_from([-0.0, 0.0, 1 / 3, -1.0, 0.4, float("inf"), 5e-324]), min_size=1, max_size=80),
    data=st.data(),
)
def test_kth_largest_matches_sorting(values, data):
    """Any finite or infinite values, signed zeros, subnormals and heavy ties."""
    x = np.array(values, dtype=np.float64)
    k = data.draw(st.integers(1, x.size))
    assert kth_largest(x, k) == np.sort(x)[::-1][k - 1]


def test_kth_largest_on_large_tied_and_mixed_sign_arrays():
    rng = np.random.default_rng(6)
    n = 200_000
    arrays = [
        np.where(rng.random(n) < 0.99, 1 / 3, rng.random(n)),  # DPS: ties below the top
        np.where(rng.random(n) < 0.99, 1 / 3, 0.3 * rng.random(n)),  # ties at the top
        rng.normal(size=n),
        np.round(rng.normal(size=n), 1),  # many small tie groups
        -np.exp(rng.uniform(-700, 700, n)),  # wide exponent range, all negative
    ]
    for x in arrays:
        ordered = np.sort(x)[::-1]
        for k in (1, 2, 1000, n // 2, n - 1, n):
            assert kth_largest(x, k) == ordered[k - 1]


# ---------------------------------------------------------------- topk_random_ties


@settings(max_examples=200, deadline=None, database=None)
@given(values=st.lists(st.integers(-3, 3), min_size=1, max_size=60), data=st.data())
def test_topk_returns_the_k_largest_in_descending_order(values, data):
    scores = np.array(values, dtype=np.float64)
    k = data.draw(st.integers(0, scores.size))
    pos = topk_random_ties(scores, k, stream("k", 0, data.draw(st.integers(0, 5)), "ties"))
    assert pos.dtype == np.int64 and pos.size == k and np.unique(pos).size == k
    np.testing.assert_array_equal(scores[pos], np.sort(scores)[::-1][:k])


def test_ties_at_the_boundary_are_broken_uniformly():
    scores = np.array([5.0] + [1.0] * 9 + [0.0] * 5)
    counts = np.zeros(scores.size, dtype=int)
    for seed in range(3000):
        pos = topk_random_ties(scores, 4, stream("k", 0, seed, "ties"))
        assert pos[0] == 0
        counts[pos[1:]] += 1
    # 3 of 9 tied slots: each tied position expected 1000 times (sd ~26)
    assert counts[1:10].min() > 850 and counts[1:10].max() < 1150
    assert counts[10:].sum() == 0


def test_order_among_equal_scores_is_random_everywhere():
    """Not only the boundary: inside the batch, equal scores come in random order."""
    scores = np.array([2.0, 2.0, 2.0, 1.0])
    first = np.zeros(3, dtype=int)
    for seed in range(1500):
        pos = topk_random_ties(scores, 4, stream("k", 0, seed, "ties"))
        assert pos[3] == 3
        first[pos[0]] += 1
    assert first.min() > 400  # expected 500 each


def test_same_seed_same_result_different_seed_different_ties():
    rng = np.random.default_rng(0)
    scores = np.where(rng.random(1_000_000) < 0.99, 1 / 3, rng.random(1_000_000))  # 99% tie at 1/3
    k = 20_000  # reaches into the tie
    a = topk_random_ties(scores, k, stream("k", 1, 0, "ties"))
    b = topk_random_ties(scores, k, stream("k", 1, 0, "ties"))
    c = topk_random_ties(scores, k, stream("k", 1, 1, "ties"))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(np.sort(a), np.sort(c))
    np.testing.assert_array_equal(scores[a], np.sort(scores)[::-1][:k])
    tied = a[scores[a] == 1 / 3]
    assert tied.mean() > 300_000  # random among the tied, not the lowest ids


def test_topk_rejects_bad_input():
    rng = stream("k", 0, 0, "ties")
    with pytest.raises(ValueError, match="NaN"):
        topk_random_ties(np.array([1.0, np.nan]), 1, rng)
    with pytest.raises(ValueError, match="k must"):
        topk_random_ties(np.array([1.0]), 2, rng)
    assert topk_random_ties(np.array([1.0]), 0, rng).size == 0


# ---------------------------------------------------------------- epoch walks


def test_uniform_batches_walk_one_permutation_per_epoch():
    n, batch = 100, 10
    epoch0 = np.concatenate([uniform_batch(n, batch, s, 0, "k") for s in range(10)])
    epoch1 = np.concatenate([uniform_batch(n, batch, s, 0, "k") for s in range(10, 20)])
    np.testing.assert_array_equal(np.sort(epoch0), np.arange(n))
    np.testing.assert_array_equal(np.sort(epoch1), np.arange(n))
    assert not np.array_equal(epoch0, epoch1)
    np.testing.assert_array_equal(epoch0, epoch_permutation(n, "k", 0, 0))
    assert not np.array_equal(uniform_batch(n, batch, 3, 1, "k"), uniform_batch(n, batch, 3, 0, "k"))
    np.testing.assert_array_equal(uniform_batch(n, batch, 3, 0, "k"), uniform_batch(n, batch, 3, 0, "k"))


def test_batch_across_an_epoch_boundary_is_distinct():
    n, batch = 23, 10
    for step in range(30):
        ids = uniform_batch(n, batch, step, 5, "k")
        assert ids.size == batch and np.unique(ids).size == batch
    ids = uniform_batch(n, batch, 2, 5, "k")  # positions 20..29: tail of epoch 0 (3 ids) + head of epoch 1
    np.testing.assert_array_equal(ids[:3], epoch_permutation(n, "k", 0, 5)[20:])
    head = [i for i in epoch_permutation(n, "k", 1, 5) if i not in ids[:3]][:7]
    np.testing.assert_array_equal(ids[3:], head)


def test_permutations_are_read_only():
    perm = epoch_permutation(50, "k", 0, 0)
    with pytest.raises(ValueError):
        perm[0] = 1


def test_history_batch_without_history_is_uniform():
    last = np.zeros(100, dtype=np.int8)
    for step in (0, 4, 13):
        np.testing.assert_array_equal(
            history_batch(100, 8, step, 2, "k", last), uniform_batch(100, 8, step, 2, "k")
        )


def test_history_batch_skips_solved_prompts():
    rng = np.random.default_rng(0)
    last = rng.choice([0, 1, 2, 3], 1000, p=[0.1, 0.2, 0.2, 0.5]).astype(np.int8)
    for step in range(0, 200, 7):
        ids = history_batch(1000, 64, step, 0, "k", last)
        assert ids.size == 64 and np.unique(ids).size == 64
        assert not np.any(last[ids] == SOLVED)
    # the walk keeps the permutation's order among eligible prompts
    perm = epoch_permutation(1000, "k", 0, 0)
    eligible = perm[last[perm] != SOLVED]
    np.testing.assert_array_equal(history_batch(1000, 64, 0, 0, "k", last), eligible[:64])


def test_history_batch_fills_with_solved_when_too_few_are_unsolved():
    last = np.full(50, SOLVED, dtype=np.int8)
    last[[3, 17, 41]] = 1
    ids = history_batch(50, 10, 4, 0, "k", last)
    assert ids.size == 10 and np.unique(ids).size == 10
    assert set(ids[:3]) == {3, 17, 41}
    all_solved = history_batch(50, 10, 4, 0, "k", np.full(50, SOLVED, dtype=np.int8))
    assert np.unique(all_solved).size == 10


def test_walks_reject_oversized_batches():
    with pytest.raises(ValueError, match="batch size"):
        uniform_batch(10, 11, 0, 0, "k")
    with pytest.raises(ValueError, match="last_state"):
        history_batch(10, 2, 0, 0, "k", np.zeros(9, np.int8))


# ---------------------------------------------------------------- MoPPS threshold


def test_threshold_select_prefers_the_band_at_random():
    draws = np.array([0.05, 0.31, 0.5, 0.69, 0.95, 0.29, 0.72])
    cands = np.arange(100, 107)
    picks = {
        tuple(sorted(mopps_threshold_select(draws, cands, 2, stream("k", 0, s, "ties")))) for s in range(60)
    }
    assert all(set(p) <= {101, 102, 103} for p in picks) and len(picks) == 3
    # 5 wanted, 3 in band: then the closest outside (0.29 at 0.01, then 0.72 at 0.02)
    five = mopps_threshold_select(draws, cands, 5, stream("k", 0, 0, "ties"))
    assert set(five[:3]) == {101, 102, 103} and five[3:].tolist() == [105, 106]
    # Without candidates: positions in the draws, the same choice.
    at = mopps_threshold_select(draws, None, 5, stream("k", 0, 0, "ties"))
    np.testing.assert_array_equal(cands[at], five)
    with pytest.raises(ValueError, match="one length"):
        mopps_threshold_select(draws, cands[:3], 2, stream("k", 0, 0, "ties"))


# ---------------------------------------------------------------- the one-pass scan and its fallback


def _sampled_rows(m: int) -> np.ndarray:
    return (np.arange(4096) * m) // 4096


@pytest.mark.parametrize(
    "pattern", ["random", "sampled_high", "unsampled_high", "ties", "few_values", "tie_block_under_a_few"]
)
def test_large_inputs_equal_the_literal_twin(pattern, monkeypatch):
    """Above 16384 scores topk_random_ties keeps only the rows at or above a threshold placed from 4096
    evenly spread rows; where those mislead (the sampled rows the highest, so too few are kept; or the
    unsampled ones, so too many), it falls back to two exact passes. The result never changes."""
    m = 20_000
    rng = np.random.default_rng(5)
    scores = rng.random(m)
    if pattern == "sampled_high":
        scores[_sampled_rows(m)] += 10.0
    elif pattern == "unsampled_high":
        scores[:] = 5.0
        scores[_sampled_rows(m)] = rng.random(4096)
    elif pattern == "ties":
        scores = np.where(rng.random(m) < 0.9, 1 / 3, rng.random(m))
    elif pattern == "few_values":
        scores = rng.integers(0, 4, m) / 3.0
    elif pattern == "tie_block_under_a_few":  # k = 1, 100 above the block (one pass), larger k inside it
        scores = np.where(rng.random(m) < 0.99, 0.3, 0.5 + rng.random(m) / 2)
    fallbacks = []
    exact_passes = _Source.histogram
    monkeypatch.setattr(_Source, "histogram", lambda self, *a: fallbacks.append(1) or exact_passes(self, *a))
    for k in (1, 100, 4097, 12_000):
        s = stream("k", 0, k, "ties")
        assert topk_random_ties(scores, k, s).tolist() == naive.topk_random_ties(scores, k, s.id), k
    if pattern == "random":
        assert not fallbacks  # the sample places the threshold well: one pass
    elif pattern in ("sampled_high", "unsampled_high"):
        assert fallbacks  # it misleads: the exact passes decide


@pytest.mark.parametrize(
    ("n", "block", "above", "k", "negative_zero"),
    [
        (20_000, 0.5, 0, 256, False),  # a cold start: the block is the top score
        (20_000, 0.5, 100, 256, False),  # a few observed prompts score above the block
        (50_000, 1 / 3, 255, 256, False),  # one slot left in the block
        (30_000, 0.0, 7, 64, True),  # a block of zeros, -0.0 among them (keyed like +0.0)
        (25_000, -2.5, 40, 300, False),  # negative scores
    ],
)
def test_a_boundary_inside_a_big_tie_block_matches_the_literal_rule(n, block, above, k, negative_zero):
    # The block's members are drawn by rank without listing the block (Source.top_in_tie_block); the
    # batch must be the literal twin's, which lists every tied position.
    rng = np.random.default_rng(n + above)
    scores = np.full(n, block)
    if negative_zero:
        scores[rng.choice(n, n // 3, replace=False)] = -0.0
    lower = rng.choice(n, n // 5, replace=False)
    scores[lower] = block - 1.0 - rng.random(lower.size)
    higher = rng.choice(np.setdiff1d(np.arange(n), lower), above, replace=False)
    scores[higher] = block + 0.5 + rng.random(above)
    source = _Source(n, scores=scores)
    assert source.top_in_tie_block(source.scan(k), k) is not None  # the shortcut is what is tested
    for seed in range(3):
        s = stream("k", 0, seed, "ties")
        assert topk_random_ties(scores, k, s).tolist() == naive.topk_random_ties(scores, k, s.id)


# ---------------------------------------------------------------- topk_tied (a common score indexed)


def _tied_scores(rng, n, base, above, below, negative_zero=False):
    """n scores at `base` but `above` higher and `below` lower ones (some of them tied among
    themselves), with -0.0 among the base ones when asked (base 0.0)."""
    scores = np.full(n, base, dtype=np.float64)
    picked = rng.choice(n, above + below, replace=False)
    scores[picked[:above]] = base + rng.integers(1, 4, above) / 4.0  # few values: ties above the block
    scores[picked[above:]] = base - rng.random(below)
    if negative_zero:
        scores[rng.choice(n, n // 4, replace=False)] = -0.0 if base == 0.0 else base
    return scores


def _index(scores, base):
    return TiedScores(scores, base, np.flatnonzero(scores != base))


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 400),
    above=st.integers(0, 60),
    below=st.integers(0, 60),
    base=st.sampled_from([0.0, 1 / 3, -2.5, 7.0]),
    negative_zero=st.booleans(),
    data=st.data(),
)
def test_topk_tied_equals_the_literal_rule(n, above, below, base, negative_zero, data):
    above = min(above, n)
    below = min(below, n - above)
    rng = np.random.default_rng(n * 1000 + above * 10 + below)
    scores = _tied_scores(rng, n, base, above, below, negative_zero)
    k = data.draw(st.integers(0, n))
    s = stream("ds", 3, data.draw(st.integers(0, 5)), "ties")
    got = topk_tied(_index(scores, base), k, s)
    assert got.tolist() == naive.topk_random_ties(scores, k, s.id)
    assert got.tolist() == topk_random_ties(scores, k, s).tolist()


@pytest.mark.parametrize(
    ("n", "above", "below", "k"),
    [
        (50_000, 0, 0, 256),  # a cold start: nothing observed
        (50_000, 300, 2_000, 256),  # the boundary above the block
        (50_000, 256, 2_000, 256),  # exactly the block's first slot missed
        (50_000, 255, 2_000, 256),  # one slot left in the block
        (50_000, 100, 2_000, 47_999),  # the block wholly in but its last member (k - gt = block - 1)
        (50_000, 100, 2_000, 48_000),  # the block wholly in: the dense rule runs
        (50_000, 100, 2_000, 49_000),  # below the block
        (50_000, 49_000, 1_000, 300),  # no block at all worth the name
    ],
)
def test_topk_tied_at_the_edges_of_the_block(n, above, below, k):
    rng = np.random.default_rng(above + k)
    scores = _tied_scores(rng, n, 0.25, above, below)
    for seed in range(2):
        s = stream("k", 9, seed, "ties")
        assert topk_tied(_index(scores, 0.25), k, s).tolist() == naive.topk_random_ties(scores, k, s.id)


def test_topk_tied_rejects_nan_and_bad_k():
    scores = np.full(10, 0.5)
    scores[3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        topk_tied(_index(scores, 0.5), 2, stream("k", 0, 0, "ties"))
    with pytest.raises(ValueError, match="k must lie"):
        topk_tied(_index(np.full(10, 0.5), 0.5), 11, stream("k", 0, 0, "ties"))


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 300),
    odd_share=st.floats(0, 1),
    data=st.data(),
)
def test_block_at_names_the_ids_outside_the_odd_ones(n, odd_share, data):
    rng = np.random.default_rng(n)
    odd = np.flatnonzero(rng.random(n) < odd_share)
    block = np.setdiff1d(np.arange(n), odd)
    count = data.draw(st.integers(0, block.size))
    ranks = np.sort(rng.choice(block.size, count, replace=False))
    np.testing.assert_array_equal(block_at(odd, ranks), block[ranks])


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), changes=st.integers(0, 6), data=st.data())
def test_retie_keeps_the_index_equal_to_a_rebuilt_one(n, changes, data):
    rng = np.random.default_rng(n * 7 + changes)
    scores = np.where(rng.random(n) < 0.8, 0.5, rng.random(n))
    scores[0] = scores[min(1, n - 1)] = 0.5  # keep the common value common at tiny n
    tied = _index(scores, 0.5)
    for _ in range(changes):
        ids = np.unique(rng.integers(0, n, data.draw(st.integers(0, n))))
        # some back to the common value, some away from it, some rescored to what they were
        scores[ids] = np.where(
            rng.random(ids.size) < 0.4,
            0.5,
            np.where(rng.random(ids.size) < 0.5, scores[ids], rng.random(ids.size)),
        )
        tied = retie(tied, ids)
        np.testing.assert_array_equal(tied.odd, np.flatnonzero(scores != 0.5))


def test_tie_index_finds_the_common_value_or_declines():
    scores = np.full(10_000, 0.125)
    scores[::7] = np.arange(scores[::7].size)  # 1/7 differ
    tied = tie_index(scores, max_odd=10_000)
    assert tied is not None and tied.base == 0.125
    np.testing.assert_array_equal(tied.odd, np.flatnonzero(scores != 0.125))
    assert tie_index(scores, max_odd=1_000) is None  # more differ than allowed
    assert tie_index(np.random.default_rng(0).random(10_000), max_odd=10_000) is None  # nothing common
    assert tie_index(np.full(5, np.nan), max_odd=5) is None
    assert tie_index(np.empty(0), max_odd=0) is None


# ---------------------------------------------------------------- the blocked array passes


@settings(max_examples=150, deadline=None)
@given(
    m=st.sampled_from([0, 1, 1023, 1024, 1025, 3000, 5121]),
    distinct=st.sampled_from([2, 5, 1000]),
    nans=st.integers(0, 3),
    cap_share=st.sampled_from([0.0, 0.3, 1.0, 2.0]),
    data=st.data(),
)
def test_scan_array_equals_numpy(m, distinct, nans, cap_share, data):
    """_scan_array counts block by block and walks only blocks holding kept rows: its counts and kept
    rows are numpy's, and it stops once more than the buffer holds would be kept."""
    from selector_service.core.select import _key_to_value, _scan_array, order_key

    rng = np.random.default_rng(m * 7 + distinct + nans)
    scores = (rng.integers(0, distinct, m) / distinct - 0.5).astype(np.float64)
    scores[rng.random(m) < 0.1] = -0.0
    if m:
        scores[rng.integers(0, m, nans)] = np.nan
    pick = data.draw(st.sampled_from([0.0, 0.25, -0.5, 0.49, 10.0]))
    thr, ref = _key_to_value(order_key(pick)), data.draw(st.sampled_from([0.0, -0.25, 0.1]))
    kept = np.flatnonzero(scores >= thr)
    cap = int(cap_share * kept.size)
    keys, pos = np.empty(cap, np.uint64), np.empty(cap, np.int64)
    n, nan, gt, eq = _scan_array(scores, scores.view(np.uint64), thr, ref, keys, pos)
    if kept.size <= cap:
        assert (n, nan, gt, eq) == (
            kept.size,
            np.isnan(scores).sum(),
            (scores > ref).sum(),
            (scores == ref).sum(),
        )
        np.testing.assert_array_equal(pos[:n], kept)
        np.testing.assert_array_equal(keys[:n], [order_key(x) for x in scores[kept]])
    else:
        assert n == cap + 1
        np.testing.assert_array_equal(pos[:cap], kept[:cap])


@settings(max_examples=150, deadline=None)
@given(
    m=st.sampled_from([1, 1023, 1024, 1025, 4097]),
    share=st.sampled_from([0.001, 0.1, 0.9, 1.0]),
    data=st.data(),
)
def test_tied_at_ranks_equals_numpy(m, share, data):
    from selector_service.core.select import _tied_at_ranks

    rng = np.random.default_rng(m + int(share * 1000))
    scores = np.where(rng.random(m) < share, 0.5, rng.random(m))
    scores[rng.random(m) < 0.05] = np.nan
    tied = np.flatnonzero(scores == 0.5)
    if tied.size == 0:
        return
    count = data.draw(st.integers(1, tied.size))
    ranks = np.sort(rng.choice(tied.size, count, replace=False))
    out = np.empty(count, np.int64)
    _tied_at_ranks(scores, 0.5, ranks, out)
    np.testing.assert_array_equal(out, tied[ranks])
