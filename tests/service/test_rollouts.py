"""Select with a rollout budget (docs/api.md §3, docs/methods.md §8) against a real service on the real
Redis: the counts, their determinism across replicas, the answer without a budget unchanged, every
refusal a 422 that names the fix and applies nothing, and groups of the allotted sizes observed back."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from selector_service.core.domain import K_MAX
from selector_service.core.rollouts import ROLLOUT_POLICIES
from tests.utils import ServiceProcess


def make(http, name, size=200, **kw):
    r = http.post("/datasets", json={"name": name, "size": size, **kw})
    assert r.status_code == 201, r.text


def observe(http, name, step, request_id, ids, counts, rng):
    """One group per prompt, of its allotted size, with random binary rewards; returns the successes."""
    successes = []
    results = []
    for pid, n in zip(ids, counts, strict=True):
        rewards = rng.integers(0, 2, n).tolist()
        successes.append(sum(rewards))
        results.append({"prompt_id": pid, "rewards": rewards})
    body = {"dataset": name, "step": step, "request_id": f"{name}-{request_id}", "results": results}
    r = http.post("/observe", json=body)
    assert r.status_code == 200, r.text
    return successes


def open_step(http, name):
    return http.get(f"/datasets/{name}").json()["summary"]["open_step"]


@pytest.mark.parametrize("policy", ROLLOUT_POLICIES)
def test_counts_fill_the_budget_within_the_bounds_on_every_replica(http, service, redis_url, dsname, policy):
    make(http, dsname)
    rng = np.random.default_rng(0)
    first = http.post("/select", json={"dataset": dsname, "step": 0, "batch_size": 40, "strategy": "uniform"})
    observe(http, dsname, 0, "warm", first.json()["prompt_ids"], [8] * 40, rng)  # some prompts are known
    req = {
        "dataset": dsname,
        "step": 1,
        "batch_size": 32,
        "strategy": "insight",
        "seed": 5,
        "rollouts": {"budget": 700, "min": 2, "max": 48, "policy": policy},
    }
    a = http.post("/select", json=req)
    assert a.status_code == 200, a.text
    body = a.json()
    counts = body["rollouts"]
    assert len(counts) == 32 and sum(counts) == 700 and min(counts) >= 2 and max(counts) <= 48
    assert list(body) == ["dataset", "step", "strategy", "prompt_ids", "scores", "rollouts"]
    assert http.post("/select", json=req).json() == body  # the same request: the same answer
    other = ServiceProcess(redis_url=redis_url, prefix=service.prefix).start()  # another replica
    try:
        with httpx.Client(base_url=other.url, timeout=60) as replica:
            assert replica.post("/select", json=req).json() == body
    finally:
        other.stop()
    # The budget shares out the batch; it does not choose it (INSIGHT scores with the dataset's K).
    plain = http.post("/select", json={k: v for k, v in req.items() if k != "rollouts"}).json()
    assert plain["prompt_ids"] == body["prompt_ids"]


def test_without_a_budget_the_answer_is_as_before(http, dsname):
    """No `rollouts` field at all (not even null), and the bytes of the answer are the old ones."""
    make(http, dsname, size=50)
    req = {"dataset": dsname, "step": 0, "batch_size": 5, "strategy": "dps", "return_scores": True}
    r = http.post("/select", json=req)
    assert r.status_code == 200
    assert list(r.json()) == ["dataset", "step", "strategy", "prompt_ids", "scores"]
    body = r.json()
    expected = (
        f'{{"dataset":"{dsname}","step":0,"strategy":"dps","prompt_ids":{body["prompt_ids"]},'
        f'"scores":{body["scores"]}}}'
    ).replace(" ", "")
    assert r.content.decode() == expected
    null = http.post("/select", json=dict(req, rollouts=None))
    assert null.status_code == 200 and null.content == r.content


def test_the_default_policy_and_max(http, dsname):
    make(http, dsname, size=30)
    r = http.post(
        "/select", json={"dataset": dsname, "step": 0, "batch_size": 2, "rollouts": {"budget": 2000}}
    )
    assert r.status_code == 200, r.text
    assert sum(r.json()["rollouts"]) == 2000 and max(r.json()["rollouts"]) <= K_MAX
    listed = http.get("/strategies").json()["rollout_policies"]
    assert [p["name"] for p in listed] == list(ROLLOUT_POLICIES)
    assert [p["name"] for p in listed if p["default"]] == ["posterior"]


@pytest.mark.parametrize(
    ("rollouts", "message"),
    [
        ({"budget": 7}, "rollouts.budget 7 is below batch_size x min = 8 x 1 = 8: raise the budget"),
        ({"budget": 65, "max": 8}, "above batch_size x max = 8 x 8 = 64: lower the budget to at most 64"),
        ({"budget": 16, "min": 0}, "rollouts.min: Input should be greater than or equal to 1"),
        ({"budget": 16, "min": 3, "max": 2}, "rollouts.min (3) is above rollouts.max (2)"),
        ({"budget": 16, "max": K_MAX + 1}, f"rollouts.max: Input should be less than or equal to {K_MAX}"),
        ({"budget": 16, "policy": "best"}, "rollouts.policy: Input should be 'posterior', 'knapsack'"),
        ({"budget": 16, "minimum": 2}, "rollouts.minimum: unknown field"),
        ({"min": 2}, "rollouts.budget: Field required"),
        ({"budget": 16.5}, "rollouts.budget: Input should be a valid integer"),
    ],
)
def test_a_bad_budget_is_a_422_naming_the_fix_and_applies_nothing(http, dsname, rollouts, message):
    make(http, dsname, size=30)
    req = {"dataset": dsname, "step": 3, "batch_size": 8, "rollouts": rollouts}
    r = http.post("/select", json=req)
    assert r.status_code == 422, r.text
    assert message in r.json()["detail"], r.json()["detail"]
    assert open_step(http, dsname) == 0  # the select for step 3 closed nothing


def test_a_batch_larger_than_the_dataset_is_named_before_the_budget_it_implies(http, dsname):
    """The budget's bounds follow from batch_size: a batch the dataset cannot fill is the error to fix."""
    make(http, dsname, size=30)
    req = {"dataset": dsname, "step": 0, "batch_size": 31, "rollouts": {"budget": 8}}
    r = http.post("/select", json=req)
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == f"batch_size 31 is larger than dataset {dsname!r} (30 prompts)"


def test_groups_of_the_allotted_sizes_are_counted_exactly(http, dsname):
    """Each group is reported with its own number of rewards; the Beta belief counts them exactly, the
    dataset counts every rollout, and a group of n is classified by its own n (a single rollout is
    all solved or none: its DPS state is never partially solved)."""
    make(http, dsname, size=100, beta_prior=[1.0, 1.0], hmm_decay=0.5)
    rng = np.random.default_rng(3)
    req = {"dataset": dsname, "step": 0, "batch_size": 20, "rollouts": {"budget": 300, "max": 64}}
    sel = http.post("/select", json=req).json()
    ids, counts = sel["prompt_ids"], sel["rollouts"]
    counts[0] = 1  # and one group of a single rollout
    successes = observe(http, dsname, 0, "sized", ids, counts, rng)
    got = http.get(f"/datasets/{dsname}/beliefs", params={"ids": ",".join(map(str, ids))}).json()["beliefs"]
    for belief, n, s in zip(got, counts, successes, strict=True):
        assert (belief["alpha"], belief["beta"]) == (1.0 + s, 1.0 + n - s)
    summary = http.get(f"/datasets/{dsname}").json()["summary"]
    assert summary["rollouts"] == sum(counts) and summary["observations"] == 20
    http.post("/select", json={"dataset": dsname, "step": 1, "batch_size": 1})  # closes step 0
    single = http.get(f"/datasets/{dsname}/beliefs", params={"ids": str(ids[0])}).json()["beliefs"][0]
    # D0 = ones, lam = 0.5, observed all solved or none: the next prior(2) is 0.30 (docs/methods.md §2)
    assert single["hmm_prior"][1] == pytest.approx(0.3, abs=1e-6)


@pytest.mark.parametrize("prior", [[1e-3, 1e-3], [1e-3, 1e6], [1e6, 1e-3], [1e6, 1e6]])
def test_the_edges_of_the_belief_domain_allocate_without_a_5xx(http, dsname, prior):
    """Datasets whose priors sit at the edges of the accepted domain (docs/numerics.md), observed with
    huge groups: every policy still fills the budget, with counts in their bounds."""
    make(http, dsname, size=40, beta_prior=prior)
    results = [{"prompt_id": p, "successes": 10**9 * (p % 2), "trials": 10**9} for p in range(0, 40, 3)]
    body = {"dataset": dsname, "step": 0, "request_id": f"{dsname}-huge", "results": results}
    assert http.post("/observe", json=body).status_code == 200
    for policy in ROLLOUT_POLICIES:
        req = {
            "dataset": dsname,
            "step": 0,
            "batch_size": 40,
            "strategy": "dps",
            "rollouts": {"budget": 40 * 30, "min": 1, "max": K_MAX, "policy": policy},
        }
        r = http.post("/select", json=req)
        assert r.status_code == 200, r.text
        counts = r.json()["rollouts"]
        assert sum(counts) == 1200 and min(counts) >= 1 and max(counts) <= K_MAX
