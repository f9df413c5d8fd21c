"""The strategy registry: validation, select and score (core/strategies.py)."""

from __future__ import annotations

import numpy as np
import pytest

from selector_service.core import (
    PARTIAL,
    SOLVED,
    STRATEGIES,
    UNSOLVED,
    BeliefArrays,
    ParamError,
    StrategySpec,
    apply_results,
    close_step,
    score,
    select,
    validate_params,
)
from selector_service.core.coldstart import apply_metadata, beta_for
from selector_service.core.rng import stream
from selector_service.core.scores import thompson_scores
from selector_service.core.select import mopps_threshold_select
from selector_service.core.strategies import dataset_rules, resolve_params

ALL = sorted(STRATEGIES)
SCORED = [s for s in ALL if STRATEGIES[s].scored]
DETERMINISTIC = [s for s in ALL if STRATEGIES[s].deterministic]
#: Deterministic strategies ranking a candidate pool (adarft always ranks the whole dataset).
POOLED = [s for s in DETERMINISTIC if "candidate_ratio" in STRATEGIES[s].params]
#: GRESO walks the dataset's own permutation from a position the dataset keeps: no request seed.
SEEDED = [s for s in ALL if s != "greso"]


def with_metadata(ba, rng):
    """Groups 0..9 for 80% of the prompts and a pass rate for 30% (docs/methods.md §6)."""
    n = ba.n
    group = rng.integers(0, 10, n).astype(np.int32)
    group[rng.random(n) < 0.2] = -1
    rates = np.where(rng.random(n) < 0.3, rng.random(n), np.nan)
    apply_metadata(ba, 0, rates, group)
    return ba


@pytest.fixture(scope="module")
def beliefs():
    """2000 prompts with metadata after a few observed steps (every belief family populated)."""
    rng = np.random.default_rng(0)
    ba = with_metadata(BeliefArrays.new(2000), rng)
    for _ in range(4):
        ids = rng.choice(2000, 300, replace=False)
        s = rng.integers(0, 9, 300).astype(float)
        states = np.where(s == 0, UNSOLVED, np.where(s == 8, SOLVED, PARTIAL)).astype(np.int8)
        apply_results(ba, ids, s, np.full(300, 8.0), states, 0.7, 1.0, 1.0)
        close_step(ba, 0.7)
    return ba


def run(ba, strategy, params=None, batch=32, step=5, seed=0, **kw):
    return select(
        ba,
        strategy=strategy,
        params=params or {},
        batch_size=batch,
        step=step,
        seed=seed,
        key="ds",
        dataset_k=8,
        **kw,
    )


# ---------------------------------------------------------------- validation


def test_defaults_follow_the_api_table():
    assert validate_params("insight", {}) == {"eta": 3.0, "mu": 0.3, "k": None, "candidate_ratio": 16}
    assert validate_params("dps", {}) == {"entropy_weight": 0.0, "candidate_ratio": None}
    assert validate_params("mopps", {}) == {"target": 0.5, "mode": "topk", "candidate_ratio": 16}
    assert validate_params("expected_difficulty", {}) == {"target": 0.5, "candidate_ratio": 16}
    assert validate_params("inverse_evidence", {}) == {"candidate_ratio": 16}
    assert validate_params("uniform", {}) == {} and validate_params("history_resampling", None) == {}
    assert validate_params("learnability", {}) == {"candidate_ratio": 16}
    assert validate_params("greso", {}) == {}
    assert validate_params("sec", {}) == {"lr": 0.5, "tau": 1.0}
    assert validate_params("adarft", {}) == {"eta": 50.0, "alpha": 2.0, "beta": 0.5}


def test_dataset_level_params_come_from_the_dataset_defaults():
    assert dataset_rules({}) == {"sec_lr": 0.5, "adarft_eta": 50.0, "adarft_alpha": 2.0, "adarft_beta": 0.5}
    defaults = {"sec": {"lr": 0.4}, "adarft": {"eta": 30}}
    assert dataset_rules(defaults) == {
        "sec_lr": 0.4,
        "adarft_eta": 30.0,
        "adarft_alpha": 2.0,
        "adarft_beta": 0.5,
    }
    resolve_params("sec", {"lr": 0.4, "tau": 0.1}, defaults)  # the dataset's lr; tau is per call
    resolve_params("adarft", {"alpha": 2}, defaults)
    with pytest.raises(ParamError, match=r"lr = 0.5 differs from the dataset's 0.4.*defaults"):
        resolve_params("sec", {"lr": 0.5}, defaults)
    with pytest.raises(ParamError, match="eta = 50 differs from the dataset's 30"):
        resolve_params("adarft", {"eta": 50}, defaults)
    with pytest.raises(ParamError, match="lr must lie in"):
        dataset_rules({"sec": {"lr": 0}})


def test_validation_normalises_and_is_idempotent():
    params = validate_params("insight", {"eta": 2, "k": 16.0, "candidate_ratio": None})
    assert params == {"eta": 2.0, "mu": 0.3, "k": 16, "candidate_ratio": None}
    assert validate_params("insight", params) == params


@pytest.mark.parametrize(
    ("strategy", "params", "message"),
    [
        ("greedy", {}, "unknown strategy 'greedy'; choose one of"),
        (
            "insight",
            {"temperature": 1},
            "unknown parameter.*temperature.*allowed: eta, mu, k, candidate_ratio",
        ),
        ("uniform", {"eta": 1}, "allowed: none"),
        ("insight", {"eta": -1}, "eta"),
        ("insight", {"eta": True}, "eta must be a number"),
        ("insight", {"mu": 1.2}, r"mu must lie in \[0, 1\]"),
        ("insight", {"k": 0}, r"k .* \[1, 1024\]"),
        ("insight", {"k": 1025}, r"\[1, 1024\]"),
        ("insight", {"k": 2.5}, "k must be an integer"),
        ("insight", {"candidate_ratio": 0}, "candidate_ratio"),
        ("insight", {"candidate_ratio": 2**64}, r"candidate_ratio must be an integer in \[1, 1e\+09\]"),
        ("mopps", {"mode": "best"}, "mode must be 'topk' or 'threshold'"),
        ("mopps", {"target": -0.1}, "target"),
        ("dps", {"entropy_weight": float("nan")}, "entropy_weight must be finite"),
        ("dps", {"entropy_weight": "0.1"}, "entropy_weight must be a number"),
        ("sec", {"tau": 0}, r"tau must lie in \(0, 1e\+06\]"),
        ("sec", {"lr": 1.5}, "lr must lie in"),
        ("adarft", {"eta": 101}, r"eta must lie in \[0, 100\]"),
        ("adarft", {"beta": -1}, "beta must lie in"),
        ("adarft", {"candidate_ratio": 4}, "allowed: eta, alpha, beta"),
        ("greso", {"p_easy": 0.5}, "allowed: none"),
    ],
)
def test_bad_params_say_what_to_fix(strategy, params, message):
    with pytest.raises(ParamError, match=message):
        validate_params(strategy, params)


# ---------------------------------------------------------------- select


@pytest.mark.parametrize("strategy", ALL)
def test_batches_are_distinct_valid_ids_and_reproducible(beliefs, strategy):
    ids, scores = run(beliefs, strategy)
    assert ids.dtype == np.int64 and ids.size == 32 and np.unique(ids).size == 32
    assert ids.min() >= 0 and ids.max() < beliefs.n
    again, again_scores = run(beliefs, strategy)
    np.testing.assert_array_equal(ids, again)
    if STRATEGIES[strategy].scored:
        assert scores.dtype == np.float64 and np.all(np.diff(scores) <= 0)  # best first
        np.testing.assert_array_equal(scores, again_scores)
    else:
        assert scores is None and again_scores is None


@pytest.mark.parametrize("strategy", SEEDED)
def test_a_different_seed_gives_a_different_batch(beliefs, strategy):
    fresh = BeliefArrays.new(2000)  # all prompts tie: only the seeded tie-breaking decides
    apply_metadata(fresh, 0, None, np.arange(2000, dtype=np.int32) % 7)  # groups: no prior moves
    a, _ = run(fresh, strategy, seed=0)
    b, _ = run(fresh, strategy, seed=1)
    assert not np.array_equal(np.sort(a), np.sort(b))


def test_dps_breaks_the_one_third_ties_at_random(beliefs):
    """Never-seen prompts tie at prior(2) = 1/3: the batch must not be the lowest ids."""
    fresh = BeliefArrays.new(2000)
    ids, scores = run(fresh, "dps", batch=100)
    assert np.all(scores == np.float32(1 / 3))
    assert ids.max() > 1000 and np.mean(ids) > 500


def test_dps_ranks_predicted_partial_prompts_first(beliefs):
    ids, scores = run(beliefs, "dps", batch=50)
    full = beliefs.dense_hmm()["hmm_prior"][:, 1].astype(np.float64)
    np.testing.assert_array_equal(scores, np.sort(full)[::-1][:50])
    np.testing.assert_array_equal(full[ids], scores)


@pytest.mark.parametrize("strategy", POOLED)
@pytest.mark.parametrize("ratio", [None, 4])
def test_full_scores_cache_gives_identical_results(beliefs, strategy, ratio):
    params = {"candidate_ratio": ratio}
    full = score(beliefs, strategy=strategy, params=params, ids=None, step=5, seed=0, key="ds", dataset_k=8)
    for step, seed in [(5, 0), (6, 3)]:
        plain = run(beliefs, strategy, params, step=step, seed=seed)
        cached = run(beliefs, strategy, params, step=step, seed=seed, full_scores=full)
        np.testing.assert_array_equal(plain[0], cached[0])
        np.testing.assert_array_equal(plain[1], cached[1])


@pytest.mark.parametrize("strategy", DETERMINISTIC)
def test_score_gives_what_select_ranks_by(beliefs, strategy):
    ids, scores = run(beliefs, strategy, {"candidate_ratio": None} if strategy in POOLED else {})
    direct = score(beliefs, strategy=strategy, params={}, ids=ids, step=5, seed=0, key="ds", dataset_k=8)
    np.testing.assert_array_equal(direct, scores)


def test_insight_k_defaults_to_the_dataset_k(beliefs):
    by_default = score(
        beliefs, strategy="insight", params={}, ids=np.arange(50), step=0, seed=0, key="ds", dataset_k=4
    )
    explicit = score(
        beliefs, strategy="insight", params={"k": 4}, ids=np.arange(50), step=0, seed=0, key="ds", dataset_k=8
    )
    np.testing.assert_array_equal(by_default, explicit)


def test_candidate_pool_restricts_the_choice(beliefs):
    """With a pool of 2 * B the batch is the top B of that pool, not of the whole dataset."""
    ids, scores = run(beliefs, "inverse_evidence", {"candidate_ratio": 2}, batch=20)
    whole, whole_scores = run(beliefs, "inverse_evidence", {"candidate_ratio": None}, batch=20)
    assert scores.min() <= whole_scores.min()
    assert not np.array_equal(np.sort(ids), np.sort(whole))


def test_mopps_threshold_mode_picks_from_the_band(beliefs):
    ids, scores = run(beliefs, "mopps", {"mode": "threshold", "candidate_ratio": None}, batch=32)
    assert np.unique(ids).size == 32
    distance_from_target = np.sqrt(-scores)  # scores are -(g - 0.5)^2
    assert np.all(distance_from_target <= 0.2 + 1e-12)  # every draw g in [0.3, 0.7]


def test_mopps_threshold_mode_is_the_threshold_select(beliefs):
    """Over the whole dataset, a threshold select is select.mopps_threshold_select of the Thompson draws."""
    params = {"mode": "threshold", "candidate_ratio": None, "target": 0.2}
    ids, scores = run(beliefs, "mopps", params, batch=32, step=5, seed=1)
    alpha, beta, sub = beta_for(beliefs, None)
    want, draws = thompson_scores(alpha, beta, sub, 0.2, stream("ds", 5, 1, "thompson"))
    np.testing.assert_array_equal(ids, mopps_threshold_select(draws, None, 32, stream("ds", 5, 1, "ties")))
    np.testing.assert_array_equal(scores, want[ids])


# ---------------------------------------------------------------- the registry entries


def test_a_spec_walks_or_scores_and_caches_only_deterministic_scores():
    uniform, mopps = STRATEGIES["uniform"], STRATEGIES["mopps"]
    with pytest.raises(ValueError, match="exactly one"):
        StrategySpec("x")
    with pytest.raises(ValueError, match="exactly one"):
        StrategySpec("x", walk=uniform.walk, score=mopps.score, deterministic=False)
    with pytest.raises(ValueError, match="no scores"):
        StrategySpec("x", walk=uniform.walk, pick=mopps.pick, deterministic=False)
    with pytest.raises(ValueError, match="only deterministic"):
        StrategySpec("x", score=mopps.score, deterministic=False, cacheable=True)
    assert all(name == spec.name for name, spec in STRATEGIES.items())
    assert {s for s in ALL if STRATEGIES[s].cacheable} == {
        "insight",
        "expected_difficulty",
        "inverse_evidence",
    }


def test_the_pool_is_the_whole_dataset_where_a_spec_says_so():
    whole = [s for s in SCORED if STRATEGIES[s].ratio(validate_params(s, {})) is None]
    assert whole == ["adarft", "dps"]
    assert STRATEGIES["insight"].ratio({}) == 16  # the registry's default where params name none
    assert STRATEGIES["insight"].ratio({"candidate_ratio": None}) is None
    assert STRATEGIES["adarft"].ratio({"candidate_ratio": 4}) is None  # adarft has no pool


def test_only_sec_requires_groups_and_says_what_to_do():
    ba = BeliefArrays.new(50)
    assert [s for s in ALL if STRATEGIES[s].unmet(ba, 4, "d") is not None] == ["sec"]
    sec = STRATEGIES["sec"]
    assert "has none: upload groups with PUT /datasets/d/metadata first" in sec.unmet(ba, 4, "d")
    apply_metadata(ba, 0, None, np.array([0, 1, 1], np.int32))
    assert "batch_size 4 is larger than the 3 prompts of dataset 'd' that have a group" in sec.unmet(
        ba, 4, "d"
    )
    assert sec.unmet(ba, 3, "d") is None


def test_batch_size_is_checked(beliefs):
    with pytest.raises(ParamError, match=r"batch_size must be an integer in \[1, 2000\]"):
        run(beliefs, "insight", batch=2001)
    with pytest.raises(ParamError, match="batch_size"):
        run(beliefs, "uniform", batch=0)


def test_score_refuses_unscored_strategies(beliefs):
    with pytest.raises(ParamError, match="no per-prompt scores"):
        score(beliefs, strategy="uniform", params={}, ids=np.arange(3), step=0, seed=0, key="ds", dataset_k=8)


def test_select_does_not_modify_beliefs(beliefs):
    before = beliefs.copy()
    for strategy in ALL:
        run(beliefs, strategy)
    after = beliefs.arrays()
    for name, arr in before.arrays().items():
        np.testing.assert_array_equal(after[name], arr, err_msg=name)


@pytest.mark.parametrize(
    ("batch_size", "dataset", "problem"),
    [
        (1, None, None),
        (5, "d", None),
        (np.int64(5), None, None),
        (0, None, "batch_size must be an integer in [1, 5] (the dataset size), got 0"),
        (True, None, "batch_size must be an integer in [1, 5] (the dataset size), got True"),
        (2.0, None, "batch_size must be an integer in [1, 5] (the dataset size), got 2.0"),
        (6, None, "batch_size must be an integer in [1, 5] (the dataset size), got 6"),
        (6, "d", "batch_size 6 is larger than dataset 'd' (5 prompts)"),
    ],
)
def test_the_batch_size_rule_is_one_function_for_the_core_and_the_service(batch_size, dataset, problem):
    from selector_service.core.strategies import batch_size_problem

    assert batch_size_problem(batch_size, 5, dataset) == problem
