"""The state's whole-dataset score cache and its index of the common score (state._ScoreCache).

A select with candidate_ratio null ranks a buffer kept across requests, and where most prompts share one
score, only the others (select.topk_tied). Searched over seeded schedules of observations, cold-prior
uploads, decays and step closes: every select must give the ids and scores of a fresh computation over
the same beliefs, and the index must name exactly the positions whose score differs from the common one.
"""

from __future__ import annotations

import numpy as np
import pytest

from selector_service.core import PARTIAL, SOLVED, UNSOLVED, apply_metadata, strategies
from selector_service.core.select import TiedScores
from selector_service.dataset.state import DatasetSpec, DatasetState

SCHEDULES = 200
#: The strategies whose whole-dataset scores the state caches (StrategySpec.cacheable).
CACHED = tuple(name for name, spec in strategies.STRATEGIES.items() if spec.cacheable)


def _observe(st: DatasetState, rng: np.random.Generator, count: int) -> None:
    k = st.spec.rollouts_per_prompt
    ids = rng.choice(st.spec.size, count, replace=False).astype(np.int64)
    succ = rng.integers(0, k + 1, count).astype(np.float64)
    states = np.where(succ == k, SOLVED, np.where(succ == 0, UNSOLVED, PARTIAL)).astype(np.int8)
    st.apply_outcomes(ids, succ, np.full(count, float(k)), states)


def _check(st: DatasetState, strategy: str, params: dict, batch: int, seed: int, uses: dict) -> None:
    ids, scores = st.select(strategy, params, batch, seed)
    fresh_ids, fresh_scores = strategies.select(
        st.arrays,
        strategy=strategy,
        params=params,
        batch_size=batch,
        step=st.open_step,
        seed=seed,
        key=st.spec.name,
        dataset_k=st.spec.rollouts_per_prompt,
    )
    np.testing.assert_array_equal(ids, fresh_ids)
    np.testing.assert_array_equal(scores, fresh_scores)
    for cache in st._caches.values():
        view = cache.view()
        if isinstance(view, TiedScores):
            uses["tied"] += 1
            np.testing.assert_array_equal(view.odd, np.flatnonzero(cache.scores != view.base))
        else:
            uses["dense"] += 1


def _schedule(seed: int, uses: dict) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.choice([40, 300, 2_000]))
    spec = DatasetSpec(
        name=f"cache-{seed}",
        size=n,
        rollouts_per_prompt=int(rng.choice([4, 8])),
        beta_decay=float(rng.choice([1.0, 0.9])),
        beta_prior=(float(rng.choice([1.0, 0.5])), 1.0),
        group_decay=0.5,
    )
    st = DatasetState(spec)
    for _ in range(int(rng.integers(5, 25))):
        op = rng.random()
        if op < 0.5:  # the usual: a batch of results; now and then a quarter of the set at once
            _observe(st, rng, int(min(n, rng.choice([1, 8, 32, n // 4 + 1]))))
        elif op < 0.6:  # cold priors move every never-observed prompt of a group
            count = int(rng.integers(1, n + 1))
            offset = int(rng.integers(0, n - count + 1))
            groups = rng.integers(-1, 3, count).astype(np.int32) if rng.random() < 0.7 else None
            rates = np.where(rng.random(count) < 0.3, rng.random(count), np.nan).astype(np.float32)
            apply_metadata(st.arrays, offset, rates if groups is None or rng.random() < 0.5 else None, groups)
        elif op < 0.75:
            st.close_until(st.open_step + 1)
        strategy = CACHED[int(rng.integers(0, len(CACHED)))]
        batch = int(rng.integers(1, n + 1)) if rng.random() < 0.2 else int(min(n, rng.choice([1, 16, 64])))
        _check(st, strategy, {"candidate_ratio": None}, batch, int(rng.integers(0, 3)), uses)


def test_cached_selects_equal_fresh_ones_over_searched_schedules():
    uses = {"tied": 0, "dense": 0}
    for seed in range(SCHEDULES):
        try:
            _schedule(seed, uses)
        except AssertionError as exc:
            raise AssertionError(f"schedule seed {seed}: {exc}") from exc
    assert uses["tied"] > SCHEDULES and uses["dense"] > 0, uses  # both paths were searched


@pytest.mark.parametrize("strategy", CACHED)
def test_a_cold_start_selects_from_the_index(strategy):
    """10^5 prompts, a few hundred observed: the select reads the index, and stays exact."""
    st = DatasetState(DatasetSpec(name="big", size=100_000))
    rng = np.random.default_rng(1)
    for step in range(3):
        _observe(st, rng, 256)
        uses = {"tied": 0, "dense": 0}
        _check(st, strategy, {"candidate_ratio": None}, 256, step, uses)
        assert uses == {"tied": 1, "dense": 0}
        st.close_until(step + 1)
