"""Profiling as a counted phase and the filter, through the real service (docs/api.md sections 2 and 3): the
profiling rollouts of uploads in every form, retried uploads counted once, the run's total rollouts in
the summary, the history and the metrics, on Redis and on the embedded Valkey; the filter's settings
listed, refused out of their domain with nothing applied, and its batches the same on every call."""

from __future__ import annotations

import struct

import httpx
import pytest

from rlvr_selector_client.client import SelectorClient
from tests.utils import ServiceProcess

N = 40


def _metric(text: str, name: str, dataset: str) -> float:
    line = next(x for x in text.splitlines() if x.startswith(f'{name}{{dataset="{dataset}"}}'))
    return float(line.split()[-1])


@pytest.fixture(params=["redis", "embedded"])
def svc(request, redis_url, tmp_path):
    """A service on the shared Redis, or on its own embedded Valkey (the users' default store)."""
    proc = (
        ServiceProcess(redis_url=redis_url)
        if request.param == "redis"
        else ServiceProcess(data_dir=str(tmp_path))
    )
    proc.start()
    yield proc
    proc.stop()


def test_profiling_rollouts_are_counted_once_and_in_the_runs_total(svc, dsname):
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        http.post("/datasets", json={"name": dsname, "size": N}).raise_for_status()
        profile = {"pass_rate": [0.5] * 20, "pass_samples": [8] * 19 + [None], "profile": True}
        first = http.put(f"/datasets/{dsname}/metadata", json=profile).json()
        assert first["profile_rollouts"] == 152 and first["coverage"]["prompts_with_pass_samples"] == 19
        again = http.put(f"/datasets/{dsname}/metadata", json=profile).json()  # a retry: counted once
        assert again["profile_rollouts"] == 152
        # Raw counts of another profiling pass (prompts 20..29), then shipped counts (free) for 0..4.
        raw = struct.pack("<10i", *[16] * 10)
        r = http.put(
            f"/datasets/{dsname}/metadata/pass_samples", params={"offset": 20, "profile": "true"}, content=raw
        )
        assert r.status_code == 200 and r.json()["profile_rollouts"] == 152 + 160, r.text
        shipped = http.put(f"/datasets/{dsname}/metadata", json={"offset": 0, "pass_samples": [8] * 5}).json()
        assert shipped["profile_rollouts"] == 312 - 40
        results = [{"prompt_id": p, "successes": 3, "trials": 8} for p in range(6)]
        http.post("/observe", json={"dataset": dsname, "step": 0, "request_id": f"{dsname}-0",
                                    "results": results}).raise_for_status()  # fmt: skip
        summary = http.get(f"/datasets/{dsname}").json()["summary"]
        assert (summary["rollouts"], summary["profile_rollouts"], summary["total_rollouts"]) == (48, 272, 320)
        http.post("/select", json={"dataset": dsname, "step": 2, "batch_size": 4, "strategy": "uniform"})
        history = http.get(f"/datasets/{dsname}/history").json()
        assert (history["profile_rollouts"], history["total_rollouts"]) == (272, 320)
        rows = [(row["step"], row["profile_rollouts"], row["total_rollouts"]) for row in history["rows"]]
        assert rows == [(0, 272, 320), (1, 272, 320)]
        text = http.get("/metrics").text
        assert _metric(text, "selector_dataset_profile_rollouts", dsname) == 272
        assert _metric(text, "selector_dataset_total_rollouts", dsname) == 320
    # The typed client uploads counts and the flag, and reads the answer.
    with SelectorClient(svc.url) as client:
        ack = client.upload_metadata(
            dsname, pass_rate=[0.25] * 10, pass_samples=[4] * 10, offset=30, profile=True
        )
        assert (ack.profile_rollouts, ack.prompts_with_pass_samples) == (272 + 40, 39)
        raw_ack = client.upload_metadata(dsname, pass_samples=[2] * 10, offset=30, raw=True, profile=True)
        assert raw_ack.profile_rollouts == 272 + 20


def test_the_filter_is_listed_checked_and_deterministic(http, dsname):
    http.post("/datasets", json={"name": dsname, "size": N}).raise_for_status()
    rates = [0.0] * 10 + [1.0] * 10 + [0.5] * 20
    http.put(
        f"/datasets/{dsname}/metadata", json={"pass_rate": rates, "pass_samples": [16] * N}
    ).raise_for_status()
    listing = http.get("/strategies").json()
    settings = {p["name"]: p["default"] for p in listing["filter"]}
    assert settings == {"solved": 0.5, "unsolved": 0.5, "k": None, "recheck": 0.0, "reprofile": True}
    strategy = next(s for s in listing["strategies"] if s["name"] == "filter")
    assert [p["name"] for p in strategy["params"]] == list(settings) and not strategy["scored"]
    body = {"dataset": dsname, "step": 0, "batch_size": 8, "seed": 3}
    for extra in ({"strategy": "insight", "filter": {}}, {"strategy": "uniform", "filter": {"recheck": 0.25}},
                  {"strategy": "filter", "params": {"reprofile": False}}):  # fmt: skip
        first = http.post("/select", json={**body, **extra})
        assert first.status_code == 200, first.text
        ids = first.json()["prompt_ids"]
        assert len(set(ids)) == 8 and http.post("/select", json={**body, **extra}).json()["prompt_ids"] == ids
        kept = ids[:6] if extra.get("filter", {}).get("recheck") else ids
        assert all(20 <= p < N for p in kept), (extra, ids)  # 0/16 and 16/16 are dropped


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"strategy": "insight", "filter": {"solved": 0}}, "filter.solved"),
        ({"strategy": "insight", "filter": {"unsolved": 1.5}}, "filter.unsolved"),
        ({"strategy": "insight", "filter": {"k": 0}}, "filter.k"),
        ({"strategy": "insight", "filter": {"k": 1025}}, "filter.k"),
        ({"strategy": "insight", "filter": {"recheck": 1}}, "filter.recheck"),
        ({"strategy": "insight", "filter": {"reprofile": "yes"}}, "filter.reprofile"),
        ({"strategy": "insight", "filter": {"bound": 0.5}}, "filter.bound: unknown field"),
        ({"strategy": "greso", "filter": {}}, "strategy greso advances its walk"),
        ({"strategy": "sec", "filter": {}}, "strategy sec advances its walk"),
        ({"strategy": "filter", "filter": {}}, "send them in params"),
        ({"strategy": "filter", "params": {"solved": 0}}, "solved must lie in (0, 1]"),
        ({"strategy": "filter", "params": {"recheck": -0.1}}, "recheck"),
        ({"strategy": "filter", "params": {"k": 2.5}}, "k must be an integer"),
        ({"strategy": "filter", "params": {"reprofile": 1}}, "reprofile must be true or false"),
        ({"strategy": "filter", "params": {"bound": 1}}, "unknown parameter(s) bound"),
    ],
)
def test_a_filter_out_of_its_domain_is_422_and_applies_nothing(http, dsname, extra, words):
    http.post("/datasets", json={"name": dsname, "size": N}).raise_for_status()
    http.post("/select", json={"dataset": dsname, "step": 0, "batch_size": 4, "strategy": "uniform"})
    before = http.get(f"/datasets/{dsname}").json()["summary"]
    r = http.post("/select", json={"dataset": dsname, "step": 3, "batch_size": 4, **extra})
    assert r.status_code == 422 and words in r.json()["detail"], r.text
    assert http.get(f"/datasets/{dsname}").json()["summary"] == before  # no step was closed


def test_a_raw_body_is_read_as_it_comes_and_bounded(http, dsname):
    """Without a Content-Length (a chunked body) the record grows as the body arrives; a body above the
    service's limits is a 413 and nothing is applied."""
    http.post("/datasets", json={"name": dsname, "size": N}).raise_for_status()
    parts = [struct.pack("<5i", *[3] * 5), struct.pack("<3i", 7, -1, 9), b""]
    r = http.put(f"/datasets/{dsname}/metadata/pass_samples", params={"offset": 2}, content=iter(parts))
    assert r.status_code == 200 and r.json()["count"] == 8 and r.json()["profile_rollouts"] == 0, r.text
    beliefs = http.get(f"/datasets/{dsname}").json()["summary"]
    assert beliefs["prompts_with_pass_samples"] == 7
    big = http.put(f"/datasets/{dsname}/metadata/pass_samples", content=b"\1\0\0\0" * 1_000_001)
    assert big.status_code == 413, big.text
    assert http.get(f"/datasets/{dsname}").json()["summary"] == beliefs


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("solved", [0, 1e-9, 1, 1.0000001, -1]),
        ("unsolved", [0, 0.5, 1, 2]),
        ("k", [None, 0, 1, 1024, 1025, 2.5]),
        ("recheck", [-0.1, 0, 0.999, 1]),
        ("reprofile", [True, False]),
    ],
)
def test_the_filter_object_and_strategy_filter_take_one_domain(name, values):
    """Both shapes of the filter's settings follow their one declaration (core/filter.py): the select
    body's `filter` and strategy filter's parameters have its defaults and accept the same values at the
    edges of its bounds."""
    from pydantic import ValidationError

    from selector_service.contract.schemas import SelectFilter
    from selector_service.core.filter import FILTER_SETTINGS
    from selector_service.core.strategies import ParamError, validate_params

    assert (
        SelectFilter().model_dump()
        == validate_params("filter", {})
        == {n: s.default for n, s in FILTER_SETTINGS.items()}
    )
    for value in values:
        try:
            SelectFilter(**{name: value})
            body = True
        except ValidationError:
            body = False
        try:
            validate_params("filter", {name: value})
            param = True
        except ParamError:
            param = False
        assert body == param, (name, value, body, param)
