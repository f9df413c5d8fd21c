"""Every query of the Grafana dashboard returns data from a real Prometheus scraping a live service.

A real `prometheus` binary (Debian package `prometheus`) scrapes a real selector service (subprocess,
real Redis under a key prefix of its own) every second with the shipped scrape job, while a small
training-like workload runs: a dataset with groups, several select/observe steps with uniform, insight, dps and
mopps, one rejected observation (409). Then every panel query, with $dataset and the interval
variables replaced by concrete values, goes through Prometheus's HTTP API and must come back with at
least one finite sample; the `dataset` variable's label_values() query must list the dataset.

The service caps datasets with series of their own at one (SELECTOR_METRICS_MAX_DATASETS) and two idle
datasets exist beside the live one: the dashboard works on the most active dataset while the others are
summed into `dataset="_other"`, which the variable lists too.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
import redis
import yaml

from tests.deploy.test_deploy import (
    DASHBOARD_PATH,
    PROMETHEUS_CONFIG_PATH,
    dashboard_queries,
    metric_selectors,
    variable_query,
)
from tests.utils import ServiceProcess, free_port

PROMETHEUS = shutil.which("prometheus")
TOKEN = "dashboard-test-" + uuid.uuid4().hex
# Long enough that a rate() window covers the whole workload; Grafana would use a few scrape intervals.
RANGE = "5m"
STRATEGIES = ("uniform", "insight", "dps", "mopps", "dps", "insight")
DATASET_SIZE, BATCH, K = 48, 12, 4
START_TIMEOUT_S = 90.0
SCRAPE_TIMEOUT_S = 20.0
IDLE = tuple(f"dash-idle-{i}-{uuid.uuid4().hex[:6]}" for i in range(2))
IDLE_SIZE = 30

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="the `prometheus` binary is not installed (Debian: apt-get install -y prometheus; "
        "`make test` installs it when it can)",
    ),
]


# --------------------------------------------------------------------------------------------- helpers


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float, context: Callable[[], str] = str) -> Any:
    """Poll `probe` until it returns something truthy; fail with `what` (and `context()`) at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout_s:.0f} s waiting for {what}\n{context()}")
        time.sleep(0.2)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def concrete(expr: str, dataset: str) -> str:
    """The PromQL Grafana would send: template and interval variables replaced."""
    for variable, value in {
        "${dataset}": dataset,
        "$dataset": dataset,
        "$__rate_interval": RANGE,
        "$__interval": "1s",
    }.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"a dashboard variable this test does not know: {expr}"
    return expr


@dataclass
class Prometheus:
    url: str
    http: httpx.Client

    def query(self, expr: str) -> list[dict]:
        response = self.http.get(f"{self.url}/api/v1/query", params={"query": expr})
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None


def finite_values(result: list[dict]) -> list[float]:
    return [v for v in (float(sample["value"][1]) for sample in result) if math.isfinite(v)]


# -------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def selector(redis_url: str) -> Iterator[str]:
    """A live selector service (the real CLI) that requires a token; yields its base URL.

    Its Redis keys live under a prefix of its own and are deleted afterwards.
    """
    prefix = f"dashtest-{uuid.uuid4().hex[:12]}"
    env = {"SELECTOR_API_TOKEN": TOKEN, "SELECTOR_METRICS_MAX_DATASETS": "1"}
    process = ServiceProcess(redis_url=redis_url, prefix=prefix, env=env).start()
    try:
        yield process.url
    finally:
        process.stop()
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"{prefix}*", count=1000):
            client.delete(key)
        client.close()


@pytest.fixture(scope="module")
def prometheus(selector: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """A real Prometheus running the shipped scrape job against the live service, every second.

    The service requires a bearer token and the job sends none: a healthy target also proves that
    /metrics is open, as the compose cluster needs.
    """
    workdir = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load(PROMETHEUS_CONFIG_PATH.read_text())
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    (job,) = config["scrape_configs"]
    # Compose's DNS discovery cannot resolve here: the same job, pointed at the test's service.
    job.pop("dns_sd_configs")
    job["static_configs"] = [{"targets": [selector.removeprefix("http://")]}]
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    http = httpx.Client(timeout=10)

    def ready() -> bool:
        if process.poll() is not None:
            pytest.fail(f"prometheus exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
        try:
            return http.get(f"{url}/-/ready").status_code == 200
        except httpx.TransportError:
            return False

    def target_up() -> bool:
        targets = http.get(f"{url}/api/v1/targets").json()["data"]["activeTargets"]
        return bool(targets) and all(t["health"] == "up" for t in targets)

    def target_report() -> str:
        return json.dumps(http.get(f"{url}/api/v1/targets").json()["data"]["activeTargets"], indent=1)

    try:
        wait_for("prometheus to be ready", ready, START_TIMEOUT_S, lambda: log_path.read_text()[-3000:])
        wait_for(
            "the scrape of the service's /metrics to succeed", target_up, SCRAPE_TIMEOUT_S, target_report
        )
        yield Prometheus(url, http)
    finally:
        http.close()
        stop(process)


@pytest.fixture(scope="module")
def dataset(selector: str, prometheus: Prometheus) -> Iterator[str]:
    """Runs the workload; each step waits until Prometheus has scraped its effect, so rates have data."""
    name = f"dash-{uuid.uuid4().hex[:10]}"
    rng = np.random.default_rng(7)
    success_rate = rng.uniform(0.05, 0.95, size=DATASET_SIZE)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    series = f'{{dataset="{name}"}}'
    with httpx.Client(base_url=selector, headers=headers, timeout=30) as http:

        def call(method: str, path: str, expected: int, **kwargs: Any) -> dict:
            response = http.request(method, path, **kwargs)
            assert response.status_code == expected, (
                f"{method} {path}: {response.status_code} {response.text}"
            )
            return response.json() if response.content else {}

        for idle in IDLE:  # summed into dataset="_other": the live dataset is the most active one
            call("POST", "/datasets", 201, json={"name": idle, "size": IDLE_SIZE})
            observe = {"dataset": idle, "step": 0, "request_id": f"{idle}-0",
                       "results": [{"prompt_id": 1, "successes": 1, "trials": 2}]}  # fmt: skip
            call("POST", "/observe", 200, json=observe)
        call("POST", "/datasets", 201, json={"name": name, "size": DATASET_SIZE, "rollouts_per_prompt": K})
        # Groups (and a few pass rates) for the per-group panel, as a dataset's metadata would give them.
        metadata = {"group": [i % 3 for i in range(DATASET_SIZE)], "pass_rate": [0.5] * 8 + [None] * 40}
        call("PUT", f"/datasets/{name}/metadata", 200, json=metadata)
        results_sent = 0
        for step, strategy in enumerate(STRATEGIES):
            batch = {"dataset": name, "step": step, "batch_size": BATCH, "strategy": strategy, "seed": step}
            prompt_ids = call("POST", "/select", 200, json=batch)["prompt_ids"]
            results = [
                {"prompt_id": i, "successes": int(rng.binomial(K, success_rate[i])), "trials": K}
                for i in prompt_ids
            ]
            request = {"dataset": name, "step": step, "request_id": f"{name}-{step}", "results": results}
            assert call("POST", "/observe", 200, json=request)["applied"] == len(results)
            results_sent += len(results)
            wait_for(
                f"a scrape showing step {step}'s results",
                lambda n=results_sent: prometheus.value(f"selector_dataset_results_total{series}") == n,
                SCRAPE_TIMEOUT_S,
            )
        # Close the last step (DPS accuracy and the effective ratio describe closed steps), then send an
        # observation for a closed step: the 409 feeds the error-rate panel.
        last = len(STRATEGIES)
        call(
            "POST",
            "/select",
            200,
            json={"dataset": name, "step": last, "batch_size": BATCH, "strategy": "dps"},
        )
        stale = {"dataset": name, "step": 0, "request_id": f"{name}-stale", "results": results[:1]}
        call("POST", "/observe", 409, json=stale)
        wait_for(
            "a scrape showing the last step closed",
            lambda: prometheus.value(f"selector_dataset_open_step{series}") == last,
            SCRAPE_TIMEOUT_S,
        )
        yield name
        call("DELETE", f"/datasets/{name}", 204)
        for idle in IDLE:
            call("DELETE", f"/datasets/{idle}", 204)


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD_PATH.read_text())


# ----------------------------------------------------------------------------------------------- tests


def test_the_service_exports_every_metric_the_dashboard_queries(
    prometheus: Prometheus, dataset: str, dashboard: dict
) -> None:
    used = {metric for _, expr in dashboard_queries(dashboard) for metric, _ in metric_selectors(expr)}
    exported = set(prometheus.http.get(f"{prometheus.url}/api/v1/label/__name__/values").json()["data"])
    assert used - exported == set(), (
        f"metrics the dashboard queries but the service does not export: {sorted(used - exported)}"
    )


def test_the_dataset_variable_lists_the_live_dataset(
    prometheus: Prometheus, dataset: str, dashboard: dict
) -> None:
    query = variable_query(dashboard, "dataset")
    match = re.fullmatch(r"\s*label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)\s*", query)
    assert match, f"unexpected variable query: {query}"
    metric, label = match.groups()
    response = prometheus.http.get(
        f"{prometheus.url}/api/v1/label/{label}/values", params={"match[]": metric}
    )
    assert dataset in response.json()["data"]


def test_the_datasets_beyond_the_cap_are_summed_into_other(prometheus: Prometheus, dataset: str) -> None:
    response = prometheus.http.get(
        f"{prometheus.url}/api/v1/label/dataset/values", params={"match[]": "selector_dataset_prompts"}
    )
    assert {dataset, "_other"} <= set(response.json()["data"])
    for idle in IDLE:  # no series of their own now (they may have had some before the live one moved)
        assert prometheus.value(f'selector_dataset_prompts{{dataset="{idle}"}}') is None
    assert prometheus.value('selector_dataset_prompts{dataset="_other"}') == len(IDLE) * IDLE_SIZE
    assert prometheus.value('selector_dataset_results_total{dataset="_other"}') == len(IDLE)


def test_every_dashboard_query_returns_data(prometheus: Prometheus, dataset: str, dashboard: dict) -> None:
    queries = [(title, concrete(expr, dataset)) for title, expr in dashboard_queries(dashboard)]
    assert len(queries) >= 15

    def empty() -> list[str]:
        return [f"{title}: {expr}" for title, expr in queries if not finite_values(prometheus.query(expr))]

    # A rate() needs two samples in its window: give the newest series (the 409) a few more scrapes.
    still_empty = empty()
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    while still_empty and time.monotonic() < deadline:
        time.sleep(1)
        still_empty = empty()
    assert not still_empty, "dashboard queries without a finite sample:\n" + "\n".join(still_empty)


def test_the_cold_start_share_is_the_share_of_prompts_never_observed(
    selector: str, prometheus: Prometheus, dataset: str, dashboard: dict
) -> None:
    (expr,) = [expr for title, expr in dashboard_queries(dashboard) if title == "Cold-start share"]
    summary = httpx.get(
        f"{selector}/datasets/{dataset}", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10
    ).json()
    observed = summary["summary"]["prompts_observed"]
    assert 0 < observed <= DATASET_SIZE
    value = prometheus.value(concrete(expr, dataset))
    assert value == pytest.approx(1 - observed / DATASET_SIZE, abs=1e-12)
