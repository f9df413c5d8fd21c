"""The numerically safe domain (core/domain.py): what is refused, and that every scoring kernel is total
on every belief state reachable from what is accepted (no NaN, no infinity, no exception), agreeing with
the mpmath / float64 twins where those are reliable. Then the same through the service: the reported
specs get a 422 and the extreme accepted ones select without a 5xx.
"""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from selector_service.contract.schemas import DatasetCreate
from selector_service.core import (
    STRATEGIES,
    BeliefArrays,
    ParamError,
    apply_metadata,
    apply_results,
    close_open_step,
    close_step,
    mutual_information,
    outcomes_from_counts,
    score,
    select,
    validate_params,
)
from selector_service.core.domain import (
    ENTROPY_WEIGHT_MAX,
    K_MAX,
    PASS_SAMPLES_MAX,
    PRIOR_MAX,
    PRIOR_MIN,
    PRIOR_STRENGTH_MAX,
    TRIALS_MAX,
)
from selector_service.dataset.state import DatasetSpec, DatasetState
from selector_service.storage.snapshot import serialize_snapshot
from tests.core import naive

#: Far beyond any reachable belief (domain.py: alpha + beta <= 2e6 + 1e9 R after R results).
REACH_MAX = 1e300
BAD_PRIORS = [
    [1e308, 1e308],  # the reported 500s
    [1e-320, 1e-320],
    [1e308, 1e-320],
    [0.0, 1.0],
    [PRIOR_MIN / 2, 1.0],
    [1.0, PRIOR_MAX * 2],
    [1.0, -1.0],
]
EDGE_PRIORS = [
    [PRIOR_MIN, PRIOR_MIN],
    [PRIOR_MIN, PRIOR_MAX],
    [PRIOR_MAX, PRIOR_MIN],
    [PRIOR_MAX, PRIOR_MAX],
    [0.5, 0.5],
]
SCORED = [s for s in sorted(STRATEGIES) if STRATEGIES[s].scored]

edge_value = st.sampled_from(
    [PRIOR_MIN, PRIOR_MIN * (1 - 1e-15), 1.0, 9.999, 10.0, PRIOR_MAX, 1e15, REACH_MAX]
)
log_value = st.floats(math.log(PRIOR_MIN), math.log(REACH_MAX)).map(math.exp)
belief_value = edge_value | log_value
k_value = st.sampled_from([1, 2, 8, 64, K_MAX]) | st.integers(1, 64)


def param_variants(strategy: str, data) -> dict:
    """Random parameters from the edges of each strategy's accepted domain."""
    unit = st.sampled_from([0.0, 1.0, 0.5]) | st.floats(0.0, 1.0)
    ratio = st.sampled_from([None, 1, 2, 16, 10**9])
    draw = data.draw
    if strategy == "insight":
        return {
            "eta": draw(st.sampled_from([0.0, 3.0, 1e6, 1e300, 1.7e308]) | st.floats(0.0, 1e3)),
            "mu": draw(unit),
            "k": draw(st.none() | k_value),
            "candidate_ratio": draw(ratio),
        }
    if strategy == "dps":
        w = st.sampled_from([0.0, ENTROPY_WEIGHT_MAX, -ENTROPY_WEIGHT_MAX]) | st.floats(-10.0, 10.0)
        return {"entropy_weight": draw(w), "candidate_ratio": draw(ratio)}
    if strategy == "mopps":
        return {
            "target": draw(unit),
            "mode": draw(st.sampled_from(["topk", "threshold"])),
            "candidate_ratio": draw(ratio),
        }
    if strategy == "expected_difficulty":
        return {"target": draw(unit), "candidate_ratio": draw(ratio)}
    if strategy in ("inverse_evidence", "learnability"):
        return {"candidate_ratio": draw(ratio)}
    if strategy == "filter":
        return filter_variant(data)
    return {}


def filter_variant(data) -> dict:
    """Filter settings from the edges of their domain (docs/methods.md §9)."""
    bound = st.sampled_from([5e-324, 1e-9, 0.5, 1.0]) | st.floats(0.0, 1.0, exclude_min=True)
    return {
        "solved": data.draw(bound),
        "unsolved": data.draw(bound),
        "k": data.draw(st.none() | k_value),
        "recheck": data.draw(st.sampled_from([0.0, 0.5, 0.999999]) | st.floats(0.0, 1.0, exclude_max=True)),
        "reprofile": data.draw(st.booleans()),
    }


# ---------------------------------------------------------------- what is refused


@pytest.mark.parametrize("prior", BAD_PRIORS)
def test_out_of_domain_priors_are_refused_with_the_domain_named(prior):
    with pytest.raises(
        ValidationError, match=r"beta_prior must be two numbers .* each in \[0\.001, 1e\+06\]"
    ):
        DatasetCreate(name="x", size=5, beta_prior=prior)
    problem = DatasetSpec(name="x", size=5, beta_prior=tuple(prior)).problems()
    assert problem and "beta_prior" in problem and "[0.001, 1e+06]" in problem


@pytest.mark.parametrize("prior", EDGE_PRIORS)
def test_edge_priors_are_accepted(prior):
    assert DatasetCreate(name="x", size=5, beta_prior=prior).beta_prior == prior
    assert DatasetSpec(name="x", size=5, beta_prior=tuple(prior)).problems() is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rollouts_per_prompt", K_MAX + 1),
        ("rollouts_per_prompt", 0),
        ("beta_decay", 0.0),
        ("hmm_decay", 1.5),
        ("size", 0),
    ],
)
def test_other_spec_fields_are_refused_outside_their_domain(field, value):
    spec = {"name": "x", "size": 5, field: value}
    with pytest.raises(ValidationError, match=field):
        DatasetCreate(**spec)
    assert field in DatasetSpec(**spec).problems()


@pytest.mark.parametrize(
    ("strategy", "params", "message"),
    [
        ("dps", {"entropy_weight": 2e6}, r"entropy_weight must lie in \[-1e\+06, 1e\+06\]"),
        ("dps", {"entropy_weight": -1e300}, r"entropy_weight must lie in \[-1e\+06, 1e\+06\]"),
        ("insight", {"eta": float("inf")}, "eta must be finite"),
        ("insight", {"k": K_MAX + 1}, r"\[1, 1024\]"),
    ],
)
def test_out_of_domain_parameters_are_refused(strategy, params, message):
    with pytest.raises(ParamError, match=message):
        validate_params(strategy, params)


# ---------------------------------------------------------------- the kernels are total


@settings(max_examples=300, deadline=None, database=None)
@given(
    alpha=st.lists(belief_value, min_size=1, max_size=12),
    data=st.data(),
)
def test_every_scored_strategy_is_total_on_reachable_beliefs(alpha, data):
    n = len(alpha)
    beta = data.draw(st.lists(belief_value, min_size=n, max_size=n))
    ba = BeliefArrays.new(n)
    ba.alpha[:] = alpha
    ba.beta[:] = beta
    dataset_k = data.draw(k_value)
    for strategy in SCORED:
        params = validate_params(strategy, param_variants(strategy, data))
        kw = dict(strategy=strategy, params=params, step=3, seed=data.draw(st.integers(0, 2**63 - 1)))
        values = score(ba, ids=None, key="dom", dataset_k=dataset_k, **kw)
        assert np.all(np.isfinite(values)), (strategy, params, alpha, beta, values)
        ids, scores = select(
            ba, batch_size=data.draw(st.integers(1, n)), key="dom", dataset_k=dataset_k, **kw
        )
        assert np.unique(ids).size == ids.size and np.all(np.isfinite(scores))


@settings(max_examples=300, deadline=None, database=None)
@given(a=belief_value, b=belief_value, k=k_value)
def test_information_is_finite_non_negative_and_bounded(a, b, k):
    value = mutual_information(np.array([a]), np.array([b]), k)[0]
    assert math.isfinite(value)
    assert -1e-12 * max(value, 1e-300) <= value <= math.log(k + 1) * (1 + 1e-12)


def mp_information(a: float, b: float, k: int) -> float:
    """I_K by docs/methods.md's textbook formula with enough digits for its cancellation (40 + 2 log10 n)."""
    mp = pytest.importorskip("mpmath")
    n = a + b
    with mp.workdps(40 + 2 * max(0, int(math.log10(n)))):
        a, b = mp.mpf(a), mp.mpf(b)

        def entropy(x, y):
            return (
                mp.log(mp.beta(x, y))
                - (x - 1) * mp.digamma(x)
                - (y - 1) * mp.digamma(y)
                + (x + y - 2) * mp.digamma(x + y)
            )

        total, log_b = entropy(a, b), mp.log(mp.beta(a, b))
        for s in range(k + 1):
            total -= (
                mp.binomial(k, s)
                * mp.exp(mp.log(mp.beta(a + s, b + k - s)) - log_b)
                * entropy(a + s, b + k - s)
            )
        return float(total)


@settings(max_examples=60, deadline=None, database=None)
@given(
    a=belief_value.filter(lambda x: x <= 1e150),
    b=belief_value.filter(lambda x: x <= 1e150),
    k=st.sampled_from([1, 2, 8, 33]),
)
def test_information_agrees_with_mpmath_across_the_domain(a, b, k):
    """Relative error below 5e-14 K (1 + 1 / min(a, b)) everywhere (measured worst: 1.4e-14 K at large n,
    3.5e-13 K at min(a, b) ~ 1e-3), including n far past 1e15 where the textbook regrouping (the previous
    kernel) lost every digit and went negative."""
    exact = mp_information(a, b, k)
    ours = mutual_information(np.array([a]), np.array([b]), k)[0]
    assert abs(ours / exact - 1) <= 5e-14 * k * (1 + 1 / min(a, b)), (a, b, k, ours, exact)


@pytest.mark.parametrize(("a", "b"), [(1.0, 1e15), (1e15, 1e15), (1e-3, 1e15), (0.5, 1e20), (1e100, 3e99)])
def test_former_failures_at_large_n_now_agree_with_mpmath(a, b):
    for k in (1, 8, 64):
        exact = mp_information(a, b, k)
        ours = mutual_information(np.array([a]), np.array([b]), k)[0]
        assert abs(ours / exact - 1) <= 5e-14 * k * (1 + 1 / min(a, b))


def test_beta_scores_agree_with_their_float64_twins_at_the_edges():
    values = np.array([PRIOR_MIN, 1.0, PRIOR_MAX, 1e15, REACH_MAX])
    a, b = (x.ravel() for x in np.meshgrid(values, values))
    ids = np.arange(a.size)
    from selector_service.core import expected_difficulty_scores, inverse_evidence_scores

    np.testing.assert_allclose(
        expected_difficulty_scores(a, b, ids, 0.3), naive.expected_difficulty(a, b, ids, 0.3), rtol=1e-15
    )
    np.testing.assert_allclose(
        inverse_evidence_scores(a, b, ids), naive.inverse_evidence(a, b, ids), rtol=1e-15
    )


# ---------------------------------------------------------------- reachable states


@settings(max_examples=150, deadline=None, database=None)
@given(data=st.data())
def test_cold_priors_and_field_strategies_are_total(data):
    """Metadata at its edges (pass rates 0, 1, unknown; sample counts 1 .. 1e6 or unknown; groups; prior
    strength 0 .. 1e6), extreme priors and maximal results: every strategy selects distinct prompts with
    finite scores, with and without a filter at the edges of its settings (sec: or refuses a dataset
    without enough grouped prompts; greso and sec refuse a filter, strategy filter a filter object)."""
    n = data.draw(st.integers(2, 10))
    prior = data.draw(st.sampled_from(EDGE_PRIORS))
    ba = BeliefArrays.new(
        n,
        *prior,
        prior_strength=data.draw(st.sampled_from([0.0, 2.0, PRIOR_STRENGTH_MAX])),
        group_decay=data.draw(st.sampled_from([1.0, 0.5, 1e-9])),
    )
    rate = st.sampled_from([0.0, 1.0, math.nan]) | st.floats(0.0, 1.0)
    rates = np.array(data.draw(st.lists(rate, min_size=n, max_size=n)))
    groups = np.array(data.draw(st.lists(st.integers(-1, 3), min_size=n, max_size=n)), dtype=np.int32)
    count = st.sampled_from([-1, 1, 2, 8, PASS_SAMPLES_MAX])
    samples = np.array(data.draw(st.lists(count, min_size=n, max_size=n)), dtype=np.int32)
    apply_metadata(ba, 0, rates, groups, samples, data.draw(st.booleans()))
    for _ in range(data.draw(st.integers(0, 3))):
        ids = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=2 * n)), dtype=np.int64)
        trials = np.full(ids.size, float(data.draw(st.sampled_from([1, 8, TRIALS_MAX]))))
        successes = trials * np.array(
            data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=ids.size, max_size=ids.size))
        )
        successes = np.floor(successes)
        apply_results(ba, ids, successes, trials, outcomes_from_counts(successes, trials), 0.5, *prior)
        close_open_step(ba, hmm_decay=0.7, key="dom")
    for strategy in sorted(STRATEGIES):
        params = validate_params(strategy, param_variants(strategy, data))
        batch = data.draw(st.integers(1, n))
        kw = dict(
            strategy=strategy, params=params, step=3, seed=data.draw(st.integers(0, 2**63 - 1)), key="dom"
        )
        filtered = filter_variant(data) if data.draw(st.booleans()) else None
        try:
            ids, scores = select(ba, batch_size=batch, dataset_k=8, filter=filtered, **kw)
        except ParamError:
            assert (strategy == "sec" and batch > ba.shared.grouped) or (
                filtered is not None and strategy in ("greso", "sec", "filter")
            )
            continue
        assert np.unique(ids).size == ids.size == batch
        assert scores is None or np.all(np.isfinite(scores)), (strategy, scores)
        if STRATEGIES[strategy].scored:
            assert np.all(np.isfinite(score(ba, ids=None, dataset_k=8, **kw)))


@pytest.mark.parametrize("prior", EDGE_PRIORS)
@pytest.mark.parametrize("lam", [1.0, 0.5, 5e-324])
def test_many_maximal_observations_keep_every_score_finite(prior, lam):
    """Results of TRIALS_MAX rollouts each (all failed, all solved, half), many steps, both decays."""
    ba = BeliefArrays.new(6, *prior)
    ids = np.arange(6, dtype=np.int64)
    successes = np.array([0.0, TRIALS_MAX, TRIALS_MAX / 2, 0.0, TRIALS_MAX, 1.0])
    trials = np.full(6, float(TRIALS_MAX))
    states = outcomes_from_counts(successes, trials)
    for _ in range(200):
        for _ in range(5):
            apply_results(ba, ids, successes, trials, states, lam, *prior)
        close_step(ba, lam if lam > 0 else 1e-300)
    assert np.all(ba.alpha >= min(prior) * (1 - 1e-15)) and np.all(np.isfinite(ba.alpha + ba.beta))
    prior = ba.observed_view()["obs_prior"]
    assert ba.observed == 6 and np.all(np.isfinite(prior)) and np.allclose(prior.sum(axis=1), 1, atol=1e-6)
    for strategy in SCORED:
        for k in (1, 8, K_MAX):
            values = score(ba, strategy=strategy, params={}, ids=None, step=1, seed=0, key="r", dataset_k=k)
            assert np.all(np.isfinite(values)), (strategy, k, values)


# ---------------------------------------------------------------- through the service


@pytest.fixture
def http(service):
    with httpx.Client(base_url=service.url, timeout=60) as client:
        yield client


@pytest.mark.parametrize("prior", BAD_PRIORS[:3])
def test_service_refuses_the_reported_priors(http, dsname, prior):
    r = http.post("/datasets", json={"name": dsname, "size": 50, "beta_prior": prior})
    assert r.status_code == 422, r.text
    assert "beta_prior" in r.json()["detail"] and "[0.001, 1e+06]" in r.json()["detail"]
    assert http.get(f"/datasets/{dsname}").status_code == 404


def test_service_refuses_an_import_with_an_out_of_domain_prior(http, dsname):
    spec = DatasetSpec(name="old", size=10, beta_prior=(1e308, 1e308), uid="u")
    state = DatasetState(spec, BeliefArrays.new(10))
    blob = serialize_snapshot(state.snapshot_header(), state.snapshot_arrays())
    r = http.post(f"/datasets/{dsname}/import", content=blob)
    assert r.status_code == 422 and "beta_prior" in r.json()["detail"], r.text


@pytest.mark.parametrize("prior", EDGE_PRIORS[:4])
def test_extreme_accepted_specs_select_without_server_errors(http, dsname, prior):
    k = 1024 if prior[0] == PRIOR_MIN else 1
    r = http.post(
        "/datasets",
        json={"name": dsname, "size": 50, "beta_prior": prior, "rollouts_per_prompt": k, "hmm_decay": 1.0},
    )
    assert r.status_code == 201, r.text
    variants = {
        "insight": [{}, {"eta": 0.0, "mu": 0.0}, {"eta": 1e300, "mu": 1.0, "k": 1}, {"k": 1024}],
        "dps": [{}, {"entropy_weight": 1e6}, {"entropy_weight": -1e6, "candidate_ratio": 1}],
        "mopps": [{}, {"mode": "threshold", "target": 0.0}, {"target": 1.0, "candidate_ratio": None}],
        "expected_difficulty": [{"target": 0.0}, {"target": 1.0}],
        "inverse_evidence": [{}],
        "uniform": [{}],
        "history_resampling": [{}],
    }
    results = [
        {"prompt_id": i, "successes": [0, TRIALS_MAX, TRIALS_MAX // 2][i % 3], "trials": TRIALS_MAX}
        for i in range(0, 50, 2)
    ]
    for step in range(3):
        for strategy, params_list in variants.items():
            for params in params_list:
                body = {
                    "dataset": dsname,
                    "step": step,
                    "batch_size": 7,
                    "strategy": strategy,
                    "params": params,
                    "seed": step,
                    "return_scores": True,
                }
                r = http.post("/select", json=body)
                assert r.status_code == 200, (strategy, params, r.text)
                scores = r.json()["scores"]
                assert scores is None or all(math.isfinite(x) for x in scores)
        for rep in range(3):
            r = http.post(
                "/observe",
                json={
                    "dataset": dsname,
                    "step": step,
                    "request_id": f"{dsname}-r{step}-{rep}",
                    "results": results,
                },
            )
            assert r.status_code == 200, r.text
    r = http.get(f"/datasets/{dsname}/beliefs", params={"ids": "0,1,2,3"})
    assert r.status_code == 200 and all(math.isfinite(b["mean"]) for b in r.json()["beliefs"])
