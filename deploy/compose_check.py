"""Checks of the running compose stack, for `make compose-check` (deploy/compose-check.sh starts and stops it).

Run against the stack `compose-local.sh up` started (project `rlvr`, DOCKER_HOST set, SELECTOR_API_TOKEN
the token the stack runs with). Standard library only, so any python3 runs it. Each check prints one
line; the first failure stops the run with what was expected and what came back.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from email.message import Message
from typing import Any

PROJECT = "rlvr"
SERVICE_IMAGE = "rlvr-selector/service:local"
SERVICE_DATA_DIR = "/var/lib/selector/data"
SELECTOR_URL = f"http://127.0.0.1:{os.environ.get('SELECTOR_PORT', '8000')}"
PROMETHEUS_URL = f"http://127.0.0.1:{os.environ.get('PROMETHEUS_PORT', '9090')}"
TOKEN = os.environ["SELECTOR_API_TOKEN"]
SCALE = 3
READY_TIMEOUT_S = 180.0
SCRAPE_TIMEOUT_S = 90.0


class CheckFailed(Exception):
    pass


# ------------------------------------------------------------------------------------------- helpers


def run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)


def compose(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return run(["docker-compose", "-p", PROJECT, *args], env=env, timeout=timeout)


def without_token() -> dict[str, str]:
    """This process's environment as a shell that never exported SELECTOR_API_TOKEN would have it."""
    return {k: v for k, v in os.environ.items() if k != "SELECTOR_API_TOKEN"}


def http(
    method: str, url: str, body: Any = None, token: str | None = None, timeout: float = 30
) -> tuple[int, Message, Any]:
    """(status, headers, JSON body or text) of one request; HTTP errors are answers, not exceptions.

    The headers are looked up without regard to case (HAProxy sends them in lower case).
    """
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, headers, raw = response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, exc.headers, exc.read()
    try:
        return status, headers, json.loads(raw)
    except ValueError:
        return status, headers, raw.decode(errors="replace")


def api(method: str, path: str, expected: int, body: Any = None, token: str | None = TOKEN) -> Any:
    status, _, payload = http(method, SELECTOR_URL + path, body, token)
    if status != expected:
        raise CheckFailed(f"{method} {path}: expected {expected}, got {status}: {payload}")
    return payload


def wait_for(what: str, probe: Callable[[], Any], timeout: float) -> Any:
    """Call probe until it returns something truthy; its last answer goes into the failure message."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = probe()
        except (OSError, CheckFailed) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        if time.monotonic() > deadline:
            raise CheckFailed(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")
        time.sleep(1)


def selector_containers() -> list[str]:
    result = compose("ps", "-q", "selector")
    return [line for line in result.stdout.split() if line]


def inspect(container: str) -> dict:
    return json.loads(run(["docker", "inspect", container]).stdout)[0]


def container_ips(containers: list[str]) -> set[str]:
    ips = set()
    for container in containers:
        for network in inspect(container)["NetworkSettings"]["Networks"].values():
            ips.add(network["IPAddress"])
    return ips


def healthy_replicas(count: int) -> list[str] | None:
    containers = selector_containers()
    states = [inspect(c)["State"].get("Health", {}).get("Status") for c in containers]
    return containers if len(containers) == count and all(s == "healthy" for s in states) else None


def prometheus_replicas() -> set[str]:
    """Host addresses of the selector targets Prometheus scrapes successfully."""
    with urllib.request.urlopen(f"{PROMETHEUS_URL}/api/v1/targets?state=active", timeout=10) as response:
        targets = json.load(response)["data"]["activeTargets"]
    return {
        t["labels"]["instance"].rsplit(":", 1)[0]
        for t in targets
        if t["labels"].get("job") == "selector" and t["health"] == "up"
    }


def prometheus_value(query: str) -> float | None:
    url = f"{PROMETHEUS_URL}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as response:
        result = json.load(response)["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def answers_by_replica(request: dict, wanted: int, timeout: float) -> dict[str, list[int]]:
    """Send the same /select through the load balancer until `wanted` replicas have answered it."""
    answers: dict[str, list[int]] = {}

    def probe() -> bool:
        status, headers, payload = http("POST", f"{SELECTOR_URL}/select", request, TOKEN)
        if status != 200:
            raise CheckFailed(f"/select through the load balancer: {status} {payload}")
        answers[headers.get("X-Served-By", "?")] = payload["prompt_ids"]
        return len(answers) >= wanted

    try:
        wait_for(f"{wanted} replicas answering the same /select through the load balancer", probe, timeout)
    except CheckFailed as exc:
        raise CheckFailed(f"{exc}; answers by replica: {answers}") from None
    return answers


# -------------------------------------------------------------------------------------------- checks


def check_service_image() -> str:
    found = run(
        ["docker", "run", "--rm", "--entrypoint", "sh", SERVICE_IMAGE, "-c", "command -v trainer-client"]
    )
    if found.returncode == 0:
        raise CheckFailed(
            f"the service image ships trainer-client ({found.stdout.strip()}), which cannot run there"
        )
    help_run = run(["docker", "run", "--rm", SERVICE_IMAGE, "--help"])
    if help_run.returncode != 0:
        raise CheckFailed(f"`selector-service --help` in the image failed: {help_run.stderr[-2000:]}")
    volumes = json.loads(
        run(["docker", "image", "inspect", "-f", "{{json .Config.Volumes}}", SERVICE_IMAGE]).stdout
    )
    if SERVICE_DATA_DIR not in (volumes or {}):
        raise CheckFailed(f"the service image declares no VOLUME {SERVICE_DATA_DIR} (volumes: {volumes})")
    return f"no trainer-client, selector-service runs, VOLUME {SERVICE_DATA_DIR}"


def check_inspection_without_token() -> str:
    for args in (["ps"], ["config", "-q"], ["logs", "--tail", "1", "selector"]):
        result = compose(*args, env=without_token())
        if result.returncode != 0:
            raise CheckFailed(
                f"`docker-compose {' '.join(args)}` without SELECTOR_API_TOKEN: {result.stderr}"
            )
    return "ps, config and logs work without SELECTOR_API_TOKEN"


def check_selector_refuses_to_start_without_token() -> str:
    started = time.monotonic()
    result = compose("run", "--rm", "--no-deps", "-T", "selector", env=without_token(), timeout=120)
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    if result.returncode != 3 or "SELECTOR_API_TOKEN is not set" not in output:
        raise CheckFailed(
            f"expected exit 3 and a message about SELECTOR_API_TOKEN, got {result.returncode}: {output}"
        )
    return f"exit 3 after {seconds:.1f} s, saying: SELECTOR_API_TOKEN is not set ..."


def check_ready() -> str:
    wait_for(
        "/readyz through the load balancer",
        lambda: http("GET", f"{SELECTOR_URL}/readyz")[0] == 200,
        READY_TIMEOUT_S,
    )
    containers = wait_for("a healthy selector container", lambda: healthy_replicas(1), READY_TIMEOUT_S)
    return f"{len(containers)} replica healthy, /readyz 200 on {SELECTOR_URL}"


def check_select_and_observe(dataset: str) -> str:
    api("POST", "/datasets", 201, {"name": dataset, "size": 64, "rollouts_per_prompt": 4})
    batch = api(
        "POST", "/select", 200, {"dataset": dataset, "step": 0, "batch_size": 8, "strategy": "insight"}
    )
    ids = batch["prompt_ids"]
    if len(set(ids)) != 8 or not all(0 <= i < 64 for i in ids):
        raise CheckFailed(f"/select returned {ids}: expected 8 distinct ids in 0..63")
    results = [{"prompt_id": i, "successes": n % 5, "trials": 4} for n, i in enumerate(ids)]
    observe = {"dataset": dataset, "step": 0, "request_id": f"{dataset}-0", "results": results}
    first = api("POST", "/observe", 200, observe)
    retry = api("POST", "/observe", 200, observe)
    if first["applied"] != 8 or retry["applied"] != 0 or not retry["duplicate"]:
        raise CheckFailed(f"/observe applied {first}, its retry {retry}: expected 8, then a duplicate")
    beliefs = api("GET", f"/datasets/{dataset}/beliefs?ids={','.join(map(str, ids))}", 200)["beliefs"]
    counts = [b["observations"] for b in beliefs]
    if counts != [1] * 8:
        raise CheckFailed(f"observations per prompt after one observe: {counts}")
    return f"dataset {dataset}: select 8, observe applied 8, retry a duplicate, beliefs updated"


def check_refused_without_token(dataset: str, replicas: int) -> str:
    request = {"dataset": dataset, "step": 1, "batch_size": 4, "strategy": "uniform"}
    seen: dict[str, int] = {}
    for _ in range(8 * replicas):
        status, headers, _ = http("POST", f"{SELECTOR_URL}/select", request, token=None)
        seen[headers.get("X-Served-By", "?")] = status
        if status != 401:
            raise CheckFailed(f"/select without a token answered {status} (expected 401)")
    if len(seen) != replicas:
        raise CheckFailed(f"{8 * replicas} requests reached {sorted(seen)}, expected {replicas} replicas")
    wrong = http("POST", f"{SELECTOR_URL}/select", request, token="not-the-token-" + secrets.token_hex(4))[0]
    if wrong != 403:
        raise CheckFailed(f"/select with a wrong token answered {wrong} (expected 403)")
    if http("GET", f"{SELECTOR_URL}/metrics")[0] != 200 or http("GET", f"{SELECTOR_URL}/healthz")[0] != 200:
        raise CheckFailed("/metrics and /healthz must stay open")
    return (
        f"401 without a token ({len(seen)} replica(s) asked), 403 with a wrong one; /healthz, /metrics open"
    )


def check_prometheus_sees_every_replica(count: int) -> str:
    ips = container_ips(selector_containers())
    if len(ips) != count:
        raise CheckFailed(f"expected {count} selector containers, found addresses {ips}")
    wait_for(
        f"Prometheus scraping the {count} replica(s) {sorted(ips)}",
        lambda: prometheus_replicas() == ips,
        SCRAPE_TIMEOUT_S,
    )
    return f"{count} selector target(s) up, one per replica: {', '.join(sorted(ips))}"


def check_metrics_reach_prometheus(dataset: str) -> str:
    query = f'sum(selector_dataset_results_total{{dataset="{dataset}"}})'
    wait_for(f"{query} == 8", lambda: prometheus_value(query) == 8, SCRAPE_TIMEOUT_S)
    return f"{query} = 8"


def check_scale_out(dataset: str) -> str:
    result = compose("up", "-d", "--no-recreate", "--scale", f"selector={SCALE}", "selector", timeout=600)
    if result.returncode != 0:
        raise CheckFailed(f"scaling to {SCALE} failed: {result.stderr}")
    wait_for(f"{SCALE} healthy selector containers", lambda: healthy_replicas(SCALE), READY_TIMEOUT_S)
    # The same select from every replica: they share the store, so they must agree on the batch.
    request = {"dataset": dataset, "step": 1, "batch_size": 8, "strategy": "insight", "seed": 7}
    answers = answers_by_replica(request, SCALE, SCRAPE_TIMEOUT_S)
    batches = {tuple(ids) for ids in answers.values()}
    if len(batches) != 1:
        raise CheckFailed(f"replicas disagree on the same /select: {answers}")
    return f"{SCALE} replicas behind {SELECTOR_URL} ({', '.join(sorted(answers))}) answer the same batch"


def check_up_without_token() -> str:
    """What a user who forgot the token sees: `up` returns, and the replicas refuse to run, saying why."""
    services = [
        name for name in compose("config", "--services").stdout.split() if name not in ("grafana", "trainer")
    ]
    started = time.monotonic()
    result = compose("up", "-d", *services, env=without_token(), timeout=300)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise CheckFailed(f"`up -d` without a token exited {result.returncode}: {result.stderr}")

    def refused() -> bool:
        states = [inspect(c)["State"] for c in selector_containers()]
        logs = compose("logs", "--no-color", "selector").stdout
        return (
            bool(states)
            and "SELECTOR_API_TOKEN is not set" in logs
            and not any(s.get("Health", {}).get("Status") == "healthy" for s in states)
        )

    wait_for("the token-less selector to refuse to start", refused, 60)
    ready = http("GET", f"{SELECTOR_URL}/readyz")[0]
    if ready != 503:
        raise CheckFailed(
            f"/readyz through the load balancer answered {ready} with no replica running (expected 503)"
        )
    return (
        f"`up -d` returned after {seconds:.0f} s; no replica becomes healthy, `logs selector` says "
        "SELECTOR_API_TOKEN is not set, the load balancer answers 503"
    )


def main() -> int:
    dataset = f"compose-check-{secrets.token_hex(4)}"
    checks: list[tuple[str, Callable[[], str]]] = [
        ("the service image ships only what works", check_service_image),
        ("compose inspection without the token", check_inspection_without_token),
        ("a selector without a token refuses to start", check_selector_refuses_to_start_without_token),
        ("the service is ready through the load balancer", check_ready),
        (
            "authenticated select and observe through the published port",
            lambda: check_select_and_observe(dataset),
        ),
        ("unauthenticated calls are refused", lambda: check_refused_without_token(dataset, 1)),
        ("Prometheus scrapes every replica", lambda: check_prometheus_sees_every_replica(1)),
        ("the service's metrics reach Prometheus", lambda: check_metrics_reach_prometheus(dataset)),
        (f"scale to {SCALE} replicas behind the one port", lambda: check_scale_out(dataset)),
        (f"Prometheus scrapes all {SCALE} replicas", lambda: check_prometheus_sees_every_replica(SCALE)),
        (
            f"unauthenticated calls are refused by all {SCALE}",
            lambda: check_refused_without_token(dataset, SCALE),
        ),
        ("`up` without the token", check_up_without_token),
    ]
    started = time.monotonic()
    for number, (title, check) in enumerate(checks, 1):
        t0 = time.monotonic()
        try:
            detail = check()
        except (CheckFailed, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as exc:
            print(f"FAIL {number:2d}/{len(checks)} {title}: {exc}", flush=True)
            return 1
        print(f"ok   {number:2d}/{len(checks)} {title} ({time.monotonic() - t0:.1f} s): {detail}", flush=True)
    print(f"compose-check: all {len(checks)} checks passed in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
