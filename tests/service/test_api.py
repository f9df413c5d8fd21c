"""The REST contract against a real service process on the real Redis."""

from __future__ import annotations

import concurrent.futures as cf
import json

import httpx
import pytest

from selector_service.core.strategies import STRATEGIES as REGISTRY
from tests.utils import EXPORTED_METRICS, GROUP_METRICS

STRATEGIES = [s for s in REGISTRY if s != "sec"]  # sec draws by group: tests/service/test_metadata.py


def make(http, name, size=100, **kw):
    r = http.post("/datasets", json={"name": name, "size": size, **kw})
    assert r.status_code == 201, r.text
    return r.json()


def beliefs(http, name, ids):
    r = http.get(f"/datasets/{name}/beliefs", params={"ids": ",".join(map(str, ids))})
    assert r.status_code == 200, r.text
    return r.json()


def test_dataset_lifecycle(http, dsname):
    body = make(http, dsname, size=50, hmm_decay=0.5)
    assert body["created"] is True and body["size"] == 50 and body["hmm_decay"] == 0.5
    again = http.post("/datasets", json={"name": dsname, "size": 50, "hmm_decay": 0.5})
    assert again.status_code == 200 and again.json()["created"] is False
    other = http.post("/datasets", json={"name": dsname, "size": 51})
    assert other.status_code == 409 and "different spec" in other.json()["detail"]
    assert dsname in http.get("/datasets").json()["datasets"]
    info = http.get(f"/datasets/{dsname}").json()
    assert info["summary"]["open_step"] == 0 and info["summary"]["observations"] == 0
    assert http.delete(f"/datasets/{dsname}").status_code == 204
    assert http.get(f"/datasets/{dsname}").status_code == 404
    assert http.delete(f"/datasets/{dsname}").status_code == 404
    assert dsname not in http.get("/datasets").json()["datasets"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_select_every_strategy_is_deterministic(http, dsname, strategy):
    make(http, dsname, size=300)
    req = {
        "dataset": dsname,
        "step": 0,
        "batch_size": 16,
        "strategy": strategy,
        "seed": 3,
        "return_scores": True,
    }
    a = http.post("/select", json=req)
    assert a.status_code == 200, a.text
    ids = a.json()["prompt_ids"]
    assert len(ids) == 16 and len(set(ids)) == 16 and all(0 <= i < 300 for i in ids)
    assert http.post("/select", json=req).json()["prompt_ids"] == ids
    if REGISTRY[strategy].scored:
        assert len(a.json()["scores"]) == 16
    else:
        assert a.json()["scores"] is None
    other_seed = http.post("/select", json=dict(req, seed=4)).json()["prompt_ids"]
    if strategy != "greso":  # greso walks the dataset's epoch order; without history it skips nothing
        assert other_seed != ids  # never-seen prompts all tie: the seed decides


def test_observe_updates_beliefs_exactly(http, dsname):
    make(http, dsname, size=10, beta_decay=0.5, beta_prior=[2.0, 3.0])
    obs = {
        "dataset": dsname,
        "step": 0,
        "request_id": "r0",
        "results": [
            {"prompt_id": 1, "rewards": [1, 0, 0.1, 1, 0, 0, 0, 1]},
            {"prompt_id": 1, "successes": 2, "trials": 4},
            {"prompt_id": 7, "successes": 0, "trials": 8},
        ],
    }
    r = http.post("/observe", json=obs)
    assert r.json() == {"applied": 3, "duplicate": False, "lag": 0}
    b = {x["prompt_id"]: x for x in beliefs(http, dsname, [1, 7, 3])["beliefs"]}
    # lam = 0.5, prior (2, 3): first (S=3 of 8) then (S=2 of 4), applied in order.
    a1, b1 = 0.5 * 2 + 0.5 * 2 + 3, 0.5 * 3 + 0.5 * 3 + 5
    a2, b2 = 0.5 * a1 + 0.5 * 2 + 2, 0.5 * b1 + 0.5 * 3 + 2
    assert (b[1]["alpha"], b[1]["beta"], b[1]["observations"]) == (a2, b2, 2)
    assert (b[7]["alpha"], b[7]["beta"]) == (2.0, 0.5 * 3 + 0.5 * 3 + 8)
    assert (b[3]["alpha"], b[3]["beta"], b[3]["observations"]) == (2.0, 3.0, 0)
    # A retry of the same request id applies nothing.
    assert http.post("/observe", json=obs).json() == {"applied": 0, "duplicate": True, "lag": 0}
    assert beliefs(http, dsname, [1])["beliefs"][0]["alpha"] == a2
    summary = http.get(f"/datasets/{dsname}").json()["summary"]
    assert summary["observations"] == 3 and summary["rollouts"] == 20 and summary["prompts_observed"] == 2


def test_step_semantics(http, dsname):
    make(http, dsname, size=20, hmm_decay=0.5)
    ok = {
        "dataset": dsname,
        "step": 0,
        "request_id": "a",
        "results": [{"prompt_id": 4, "successes": 3, "trials": 8}],
    }
    assert http.post("/observe", json=ok).status_code == 200
    # select at step 2 closes steps 0 and 1
    r = http.post("/select", json={"dataset": dsname, "step": 2, "batch_size": 4, "strategy": "dps"})
    assert r.status_code == 200 and r.json()["step"] == 2
    late = http.post("/observe", json=dict(ok, request_id="b", step=1))
    assert late.status_code == 409 and "closed" in late.json()["detail"]
    again = http.post("/select", json={"dataset": dsname, "step": 1, "batch_size": 4, "strategy": "dps"})
    assert again.status_code == 409
    pri = beliefs(http, dsname, [4, 5])["beliefs"]
    # docs/methods.md worked values (lam = 0.5): one obs in state 2 -> 0.40, then one step unobserved -> 0.368...
    assert pri[0]["hmm_prior"][1] == pytest.approx(0.368, abs=1e-3)
    assert pri[1]["hmm_prior"][1] == pytest.approx(1 / 3, abs=1e-6)
    info = http.get(f"/datasets/{dsname}").json()["summary"]
    assert info["open_step"] == 2 and info["steps_closed"] == 2


BAD_OBSERVES = [
    ({"results": []}, 422),
    ({"results": [{"prompt_id": 100, "successes": 1, "trials": 2}]}, 422),
    ({"results": [{"prompt_id": -1, "successes": 1, "trials": 2}]}, 422),
    ({"results": [{"prompt_id": 1, "successes": 3, "trials": 2}]}, 422),
    ({"results": [{"prompt_id": 1, "successes": -1, "trials": 2}]}, 422),
    ({"results": [{"prompt_id": 1, "successes": 1, "trials": 0}]}, 422),
    ({"results": [{"prompt_id": 1, "successes": 1.5, "trials": 2}]}, 422),
    ({"results": [{"prompt_id": 1, "rewards": []}]}, 422),
    ({"results": [{"prompt_id": 1}]}, 422),
    ({"results": [{"prompt_id": 1, "rewards": [1], "successes": 1, "trials": 1}]}, 422),
    ({"results": [{"prompt_id": 1, "rewards": [1], "extra": 2}]}, 422),
    ({"request_id": ""}, 422),
    ({"request_id": "x" * 129}, 422),
    ({"step": -1}, 422),
    ({"dataset": "no-such-dataset-here"}, 404),
    ({"dataset": "../../etc"}, 422),
    ({"dataset": "a{b}"}, 422),
    ({"bogus": 1}, 422),
]


@pytest.mark.parametrize(("patch", "status"), BAD_OBSERVES)
def test_bad_observe_applies_nothing(http, dsname, patch, status):
    make(http, dsname, size=100)
    body = {
        "dataset": dsname,
        "step": 0,
        "request_id": f"bad-{dsname}",
        "results": [{"prompt_id": 1, "successes": 1, "trials": 2}, {"prompt_id": 2, "rewards": [1, 0]}],
    }
    if "results" in patch:
        # a good result first (it must not be applied either); an empty list stays empty
        body["results"] = body["results"][:1] + patch["results"] if patch["results"] else []
    body.update({k: v for k, v in patch.items() if k != "results"})
    r = http.post("/observe", json=body)
    assert r.status_code == status, r.text
    assert isinstance(r.json()["detail"], str) and r.json()["detail"]
    info = http.get(f"/datasets/{dsname}").json()["summary"]
    assert info["observations"] == 0
    # the request id was not consumed: a corrected request goes through
    fixed = {
        "dataset": dsname,
        "step": 0,
        "request_id": f"bad-{dsname}",
        "results": [{"prompt_id": 1, "successes": 1, "trials": 2}],
    }
    assert http.post("/observe", json=fixed).json() == {"applied": 1, "duplicate": False, "lag": 0}


@pytest.mark.parametrize(
    "raw",
    [
        '{"dataset": "%s", "step": 0, "request_id": "n", "results": [{"prompt_id": 1, "rewards": [NaN, 1]}]}',
        '{"dataset": "%s", "step": 0, "request_id": "n", "results": [{"prompt_id": 1, "rewards": [Infinity]}]}',
        '{"dataset": "%s", "step": 0, "request_id": "n", "results": [{"prompt_id": 1, "successes": 1e999, "trials": 2}]}',
        '{"dataset": "%s", "step": 0, "request_id": "n", "results": [{"prompt_id": 1, "rewards": [1, 0]}',
        "not json at all %s",
    ],
)
def test_non_finite_and_malformed_json(http, dsname, raw):
    make(http, dsname, size=10)
    r = http.post("/observe", content=(raw % dsname).encode(), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert http.get(f"/datasets/{dsname}").json()["summary"]["observations"] == 0


BAD_SELECTS = [
    ({"batch_size": 0}, 422),
    ({"batch_size": 101}, 422),
    ({"strategy": "magic"}, 422),
    ({"strategy": "insight", "params": {"etaa": 1}}, 422),
    ({"strategy": "insight", "params": {"eta": -1}}, 422),
    ({"strategy": "insight", "params": {"candidate_ratio": 0}}, 422),
    ({"strategy": "mopps", "params": {"mode": "banana"}}, 422),
    ({"strategy": "uniform", "params": {"eta": 1}}, 422),
    ({"seed": -3}, 422),
    ({"step": "x"}, 422),
    ({"step": "3"}, 422),
    ({"return_scores": 1}, 422),
    ({"dataset": "missing-ds"}, 404),
]


@pytest.mark.parametrize(("patch", "status"), BAD_SELECTS)
def test_bad_select(http, dsname, patch, status):
    make(http, dsname, size=100)
    body = {"dataset": dsname, "step": 0, "batch_size": 8, "strategy": "insight", **patch}
    r = http.post("/select", json=body)
    assert r.status_code == status, r.text
    assert isinstance(r.json()["detail"], str)


@pytest.mark.parametrize(
    "spec",
    [
        {"size": 0},
        {"size": -5},
        {"beta_decay": 0},
        {"beta_decay": 1.5},
        {"hmm_decay": -0.1},
        {"beta_prior": [0, 1]},
        {"beta_prior": [1]},
        {"rollouts_per_prompt": 0},
        {"reward_mode": "graded"},
        {"defaults": {"insight": {"nope": 1}}},
        {"defaults": {"bogus": {}}},
        {"unknown": True},
    ],
)
def test_bad_dataset_spec(http, dsname, spec):
    r = http.post("/datasets", json={"name": dsname, "size": 10, **spec})
    assert r.status_code == 422, r.text
    assert http.get(f"/datasets/{dsname}").status_code == 404


@pytest.mark.parametrize(
    "name", ["", "-lead", "a" * 129, "with space", "brace{x}", "colon:x", "slash/x", "ü"]
)
def test_dataset_names_are_validated(http, name):
    r = http.post("/datasets", json={"name": name, "size": 10})
    assert r.status_code == 422


def test_beliefs_and_score_inputs(http, dsname):
    make(http, dsname, size=10)
    assert http.get(f"/datasets/{dsname}/beliefs", params={"ids": "1,x"}).status_code == 422
    assert http.get(f"/datasets/{dsname}/beliefs", params={"ids": "10"}).status_code == 422
    assert http.get(f"/datasets/{dsname}/beliefs", params={"ids": ""}).status_code == 422
    r = http.post("/score", json={"dataset": dsname, "strategy": "insight", "prompt_ids": [0, 1]})
    assert r.status_code == 200
    assert r.json()["scores"] == pytest.approx(
        [0.170, 0.170], abs=1e-3
    )  # docs/methods.md sanity value, Beta(1, 1)
    assert (
        http.post("/score", json={"dataset": dsname, "strategy": "insight", "prompt_ids": [10]}).status_code
        == 422
    )
    assert (
        http.post("/score", json={"dataset": dsname, "strategy": "insight", "prompt_ids": []}).status_code
        == 422
    )


def test_select_scores_match_score_endpoint(http, dsname):
    make(http, dsname, size=200)
    http.post(
        "/observe",
        json={
            "dataset": dsname,
            "step": 0,
            "request_id": "s",
            "results": [{"prompt_id": i, "successes": i % 9, "trials": 8} for i in range(0, 200, 3)],
        },
    )
    for strategy, params in [
        ("insight", {"candidate_ratio": None}),
        ("dps", {}),
        ("expected_difficulty", {}),
    ]:
        sel = http.post(
            "/select",
            json={
                "dataset": dsname,
                "step": 0,
                "batch_size": 10,
                "strategy": strategy,
                "params": params,
                "return_scores": True,
            },
        ).json()
        sc = http.post(
            "/score",
            json={"dataset": dsname, "strategy": strategy, "params": params, "prompt_ids": sel["prompt_ids"]},
        ).json()
        assert sc["scores"] == sel["scores"]
        assert sel["scores"] == sorted(sel["scores"], reverse=True)


def test_concurrent_observes_one_step(http, service, dsname):
    make(http, dsname, size=64)

    def send(client_no: int) -> list[dict]:
        acks = []
        with httpx.Client(base_url=service.url, timeout=30) as c:
            for k in range(5):
                body = {
                    "dataset": dsname,
                    "step": 0,
                    "request_id": f"c{client_no}-{k}",
                    "results": [{"prompt_id": (client_no * 5 + k) % 64, "successes": 1, "trials": 4}],
                }
                acks.append(c.post("/observe", json=body).json())
                acks.append(c.post("/observe", json=body).json())  # every request retried once
        return acks

    with cf.ThreadPoolExecutor(8) as pool:
        acks = [a for lst in pool.map(send, range(8)) for a in lst]
    assert sum(a["applied"] for a in acks) == 40 and sum(a["duplicate"] for a in acks) == 40
    summary = http.get(f"/datasets/{dsname}").json()["summary"]
    assert summary["observations"] == 40 and summary["rollouts"] == 160


def test_openapi_describes_every_endpoint(http):
    doc = http.get("/openapi.json").json()
    paths = doc["paths"]
    for path, method in [
        ("/datasets", "post"),
        ("/datasets", "get"),
        ("/datasets/{name}", "get"),
        ("/datasets/{name}", "delete"),
        ("/select", "post"),
        ("/observe", "post"),
        ("/datasets/{name}/beliefs", "get"),
        ("/score", "post"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
    ]:
        assert method in paths[path], (path, method)
    assert "409" in paths["/observe"]["post"]["responses"]
    json.dumps(doc)


def test_openapi_declares_the_bearer_token_where_it_is_checked(http):
    """Generated clients and the /docs Authorize button learn the token from the document; the open
    operations (health, readiness, metrics) declare none."""
    doc = http.get("/openapi.json").json()
    ((name, scheme),) = doc["components"]["securitySchemes"].items()
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer", scheme
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            declared = op.get("security") == [{name: []}]
            assert declared == (path not in ("/healthz", "/readyz", "/metrics")), (method, path)


def test_openapi_gives_every_operation_a_summary_and_description(http):
    doc = http.get("/openapi.json").json()
    operations = [(path, method, op) for path, ops in doc["paths"].items() for method, op in ops.items()]
    assert len(operations) >= 15
    undescribed = [(m, p) for p, m, op in operations if not str(op.get("description", "")).strip()]
    assert not undescribed, f"operations without a description: {undescribed}"
    unsummarized = [(m, p) for p, m, op in operations if not str(op.get("summary", "")).strip()]
    assert not unsummarized, f"operations without a summary: {unsummarized}"


def test_metrics_exposition(http, dsname):
    make(http, dsname, size=30)
    http.post(
        "/observe",
        json={
            "dataset": dsname,
            "step": 0,
            "request_id": "m",
            "results": [{"prompt_id": 1, "successes": 4, "trials": 8}],
        },
    )
    http.post("/select", json={"dataset": dsname, "step": 1, "batch_size": 4, "strategy": "dps"})
    text = http.get("/metrics").text
    # every family but those that need group metadata or a late result
    for name in sorted(EXPORTED_METRICS - GROUP_METRICS - {"selector_dataset_results_by_lag_total"}):
        assert name in text, name
    line = next(
        x
        for x in text.splitlines()
        if x.startswith(f'selector_dataset_effective_ratio{{dataset="{dsname}"}}')
    )
    assert float(line.split()[-1]) == 1.0  # the one observed prompt was partially solved
    assert 'endpoint="/select"' in text and "prompt_id" not in text


def test_oversized_body_is_413(http, dsname):
    make(http, dsname, size=10)
    big = b'{"dataset": "x", "pad": "' + b"a" * (17 * 2**20) + b'"}'
    r = http.post("/observe", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_fractional_reward_mode(http, dsname):
    """Rewards in [0, 1] count as fractional successes (clipped); the HMM state comes from their spread."""
    make(http, dsname, size=5, reward_mode="fractional", hmm_decay=0.5)
    obs = {
        "dataset": dsname,
        "step": 0,
        "request_id": "f",
        "results": [
            {"prompt_id": 0, "rewards": [0.1, 0.1, 0.1, 0.1]},  # no spread, low -> unsolved
            {"prompt_id": 1, "rewards": [0.25, 1.5, -2.0, 0.75]},  # clipped: 0.25 + 1 + 0 + 0.75
            {"prompt_id": 2, "successes": 2.5, "trials": 4},
        ],
    }
    assert http.post("/observe", json=obs).json()["applied"] == 3
    b = {x["prompt_id"]: x for x in beliefs(http, dsname, [0, 1, 2])["beliefs"]}
    assert (b[0]["alpha"], b[0]["beta"]) == pytest.approx((1.4, 4.6))
    assert (b[1]["alpha"], b[1]["beta"]) == pytest.approx((3.0, 3.0))
    assert (b[2]["alpha"], b[2]["beta"]) == pytest.approx((3.5, 2.5))
    http.post(
        "/select", json={"dataset": dsname, "step": 1, "batch_size": 1, "strategy": "dps"}
    ).raise_for_status()
    pri = {x["prompt_id"]: x["hmm_prior"] for x in beliefs(http, dsname, [0, 1, 2])["beliefs"]}
    # docs/methods.md worked values (lam = 0.5): observed unsolved -> prior(2) = 0.30, partially solved -> 0.40
    assert pri[0][1] == pytest.approx(0.30, abs=1e-6) and pri[0][0] > pri[0][2]
    assert pri[1][1] == pytest.approx(0.40, abs=1e-6)
    assert pri[2][1] == pytest.approx(0.40, abs=1e-6)
    # binary datasets refuse fractional successes
    make(http, f"{dsname}-b", size=5)
    bad = {
        "dataset": f"{dsname}-b",
        "step": 0,
        "request_id": "f",
        "results": [{"prompt_id": 0, "successes": 2.5, "trials": 4}],
    }
    assert http.post("/observe", json=bad).status_code == 422


@pytest.mark.parametrize("path", ["/datasets", "/select", "/score"])
def test_a_json_body_sent_as_form_data_says_to_send_json(http, dsname, path):
    """curl -d sends form data: the 422 names the content type instead of "a valid dictionary"."""
    make(http, dsname)
    body = {"/datasets": {"name": f"{dsname}-2", "size": 3}, "/select": {"dataset": dsname, "step": 0,
            "batch_size": 1}, "/score": {"dataset": dsname, "strategy": "insight", "prompt_ids": [0]}}[path]  # fmt: skip
    for headers, sent in (
        ({"content-type": "application/x-www-form-urlencoded"}, "as 'application/x-www-form-urlencoded'"),
        ({}, "without a Content-Type"),
    ):
        r = http.post(path, content=json.dumps(body), headers=headers)
        assert r.status_code == 422, r.text
        assert sent in r.json()["detail"] and "Content-Type: application/json" in r.json()["detail"]
    assert http.get(f"/datasets/{dsname}-2").status_code == 404  # nothing created
    r = http.post(path, content=json.dumps(body), headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code in (200, 201), r.text
    r = http.post(path, json={**body, "extra": 1})  # a JSON body's own mistakes keep their message
    assert r.status_code == 422 and "unknown field" in r.json()["detail"]


def test_strategies_lists_the_registry_with_defaults_that_select_accepts(http, dsname):
    """GET /strategies names every strategy /select takes, each parameter with the default a select
    uses when none is given; a select naming every default explicitly gives the same batch."""
    listed = {s["name"]: s for s in http.get("/strategies").json()["strategies"]}
    assert set(listed) == set(REGISTRY)
    make(http, dsname, size=200)
    for name, info in listed.items():
        spec = REGISTRY[name]
        assert (info["scored"], info["deterministic"]) == (spec.scored, spec.deterministic)
        assert [p["name"] for p in info["params"]] == list(spec.params)
        assert all(p["help"] and isinstance(p["dataset_level"], bool) for p in info["params"])
        if name == "sec":  # needs groups: its defaults are checked by the registry alone
            continue
        body = {"dataset": dsname, "step": 0, "batch_size": 8, "strategy": name}
        plain = http.post("/select", json=body)
        explicit = http.post(
            "/select", json={**body, "params": {p["name"]: p["default"] for p in info["params"]}}
        )
        assert plain.status_code == explicit.status_code == 200, (name, plain.text, explicit.text)
        assert plain.json()["prompt_ids"] == explicit.json()["prompt_ids"], name
