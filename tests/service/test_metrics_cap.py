"""Dataset series are capped: at most SELECTOR_METRICS_MAX_DATASETS datasets have series of their own,
the most active first, and every other one is summed into `dataset="_other"`; a scrape's size then stays
the same however many datasets there are."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

pytestmark = pytest.mark.slow
CAP = 3


@pytest.fixture(scope="module")
def svc(start_service):
    return start_service(SELECTOR_METRICS_MAX_DATASETS=str(CAP), SELECTOR_METRICS_WAIT_S="30")


def scrape(http: httpx.Client) -> str:
    r = http.get("/metrics")
    assert r.status_code == 200
    return r.text


def values(text: str, family: str) -> dict[str, float]:
    """dataset label -> value of a per-dataset family in an exposition text."""
    found = {}
    for line in text.splitlines():
        m = re.fullmatch(rf'{family}\{{dataset="([^"]+)"\}} (\S+)', line)
        if m:
            found[m.group(1)] = float(m.group(2))
    return found


def observe(http: httpx.Client, name: str, step: int, count: int) -> None:
    results = [{"prompt_id": i, "successes": 1, "trials": 2} for i in range(count)]
    body = {
        "dataset": name,
        "step": step,
        "request_id": f"{name}-{step}-{uuid.uuid4().hex[:6]}",
        "results": results,
    }
    assert http.post("/observe", json=body).status_code == 200


def test_the_most_active_datasets_have_their_own_series_and_the_rest_are_summed(svc):
    tag = uuid.uuid4().hex[:6]
    names = [f"cap-{tag}-{i:02d}" for i in range(10)]
    with httpx.Client(base_url=svc.url, timeout=60) as http:
        for i, name in enumerate(names):
            assert http.post("/datasets", json={"name": name, "size": 100 + i}).status_code == 201
            observe(http, name, 0, 1)
        scrape(http)  # the first refresh: every dataset has its record count
        active = names[7], names[2]
        for name in active:
            observe(http, name, 0, 5)
        text = scrape(http)
        prompts = values(text, "selector_dataset_prompts")
        assert len(prompts) == CAP + 1 and "_other" in prompts, sorted(prompts)
        assert set(active) <= set(prompts)
        own = {n for n in prompts if n != "_other"}
        rest = [n for n in names if n not in own]
        assert prompts["_other"] == sum(100 + names.index(n) for n in rest)
        results = values(text, "selector_dataset_results_total")
        assert results["_other"] == len(rest) and results[active[0]] == 6
        # ten more datasets: not one line more
        lines = len(text.splitlines())
        for i in range(10):
            name = f"cap-{tag}-more-{i}"
            assert http.post("/datasets", json={"name": name, "size": 50}).status_code == 201
            names.append(name)
        text = scrape(http)
        assert abs(len(text.splitlines()) - lines) <= 5, (lines, len(text.splitlines()))
        assert len(values(text, "selector_dataset_prompts")) == CAP + 1
        assert values(text, "selector_dataset_prompts")["_other"] == sum(
            100 + names.index(n) if "more" not in n else 50 for n in names if n not in own
        )
        for name in names:
            assert http.delete(f"/datasets/{name}").status_code == 204
        assert "_other" not in values(scrape(http), "selector_dataset_prompts")
