"""Property-based fuzzing of the live service with schemathesis, driven by the OpenAPI document it serves.

Every operation in `/openapi.json` gets schema-valid requests (positive mode) and schema-violating ones
(negative mode). Whatever arrives, the service must answer without a 5xx, with a status code, content
type and body that its own OpenAPI document declares.

schemathesis' `negative_data_rejection` check is not run: request models parse in pydantic's lax mode,
which accepts what JSON Schema calls a type violation but means the same value (`"step": "3"`,
`"return_scores": 1`), so that check fails whenever a fuzzed name happens to exist. Values outside the
allowed ranges, unknown fields and non-finite numbers are refused (tests/service/test_api.py).

schemathesis' pytest plugin (`from_fixture` / `parametrize`) does not run under pytest 9, so the tests
drive its Hypothesis strategies directly: `operation.as_strategy(...)` per operation and mode.

Half of the positive cases are pointed at a seeded dataset (otherwise nearly every random name is a 404
and the deeper code paths never run). The service runs with small limits so that a schema-valid request
can never ask it to allocate gigabytes on a shared test machine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from selector_service.core.rollouts import ROLLOUT_POLICIES
from selector_service.core.strategies import STRATEGIES as REGISTRY
from tests.utils import ServiceProcess

pytestmark = pytest.mark.slow

# Cases per (operation, mode) at most; all 27 (operation, mode) pairs take about a minute here.
MAX_EXAMPLES = 100

# What the service serves; test_every_served_operation_is_fuzzed fails when an endpoint is added or removed.
OPERATIONS = [
    ("GET", "/datasets"),
    ("POST", "/datasets"),
    ("GET", "/datasets/{name}"),
    ("DELETE", "/datasets/{name}"),
    ("GET", "/datasets/{name}/export"),
    ("POST", "/datasets/{name}/import"),
    ("GET", "/datasets/{name}/beliefs"),
    ("GET", "/datasets/{name}/history"),
    ("PUT", "/datasets/{name}/metadata"),
    ("PUT", "/datasets/{name}/metadata/{field}"),
    ("POST", "/select"),
    ("POST", "/observe"),
    ("POST", "/score"),
    ("GET", "/strategies"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
]

LIMITS = {
    "SELECTOR_MAX_DATASET_SIZE": "5000",
    "SELECTOR_MAX_BATCH_SIZE": "5000",
    "SELECTOR_MAX_IDS_PER_REQUEST": "5000",
    "SELECTOR_MAX_BODY_BYTES": str(2**20),
    "SELECTOR_MAX_IMPORT_BYTES": str(2**20),
}
SEED_SIZE = 64
# A response slower than this is a hang (the slowest legitimate request here takes well under a second).
REQUEST_TIMEOUT_S = 30
STRATEGIES = list(REGISTRY)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_service(redis_url):
    proc = ServiceProcess(redis_url=redis_url, env=LIMITS).start()
    yield proc
    proc.stop()


@dataclass
class Seed:
    """A dataset with a few observed steps, so that aimed cases reach the belief code paths."""

    url: str
    name: str
    export: bytes = b""

    def ensure(self) -> None:
        """Creates and feeds the dataset unless it exists (a fuzzed DELETE may have removed it)."""
        with httpx.Client(base_url=self.url, timeout=60) as c:
            r = c.post("/datasets", json={"name": self.name, "size": SEED_SIZE})
            if r.status_code == 200:
                return
            assert r.status_code == 201, r.text
            incarnation = uuid.uuid4().hex[:8]  # ids of an earlier incarnation are refused (409)
            for step in range(3):
                sel = c.post("/select", json={"dataset": self.name, "step": step, "batch_size": 8})
                results = [
                    {"prompt_id": p, "successes": (p + step) % 5, "trials": 4}
                    for p in sel.json()["prompt_ids"]
                ]
                body = {
                    "dataset": self.name,
                    "step": step,
                    "request_id": f"seed-{incarnation}-{step}",
                    "results": results,
                }
                c.post("/observe", json=body).raise_for_status()
            self.export = c.get(f"/datasets/{self.name}/export").content

    def open_step(self) -> int:
        r = httpx.get(f"{self.url}/datasets/{self.name}", timeout=60)
        return r.json()["summary"]["open_step"] if r.status_code == 200 else 0


@pytest.fixture(scope="module")
def seed(fuzz_service) -> Iterator[Seed]:
    seeded = Seed(fuzz_service.url, f"fuzz-{uuid.uuid4().hex[:8]}")
    seeded.ensure()
    yield seeded
    # Leave nothing behind in the shared Redis: the fuzzer created datasets under this service's prefix.
    with httpx.Client(base_url=fuzz_service.url, timeout=60) as c:
        for name in c.get("/datasets").json()["datasets"]:
            c.delete(f"/datasets/{name}")


def _homogeneous_tuples_as_arrays(node: Any) -> Any:
    """Rewrites `prefixItems: [S, S]` (pydantic's spelling of `tuple[float, float]`) as `items: S`.

    OpenAPI 3.1 allows `prefixItems`, but schemathesis 4.x turns it into the draft-4 `items: [...]` form
    for response validation and then refuses its own output as an invalid 2020-12 schema. The rewrite
    keeps `minItems`/`maxItems`, so the constraint it checks is the same for tuples of one element type.
    """
    if isinstance(node, list):
        return [_homogeneous_tuples_as_arrays(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _homogeneous_tuples_as_arrays(v) for k, v in node.items()}
    prefix = out.get("prefixItems")
    if isinstance(prefix, list) and prefix and "items" not in out and all(p == prefix[0] for p in prefix):
        out["items"] = out.pop("prefixItems")[0]
    return out


@pytest.fixture(scope="module")
def api_schema(fuzz_service):
    """The OpenAPI document the live service serves (with the one rewrite above)."""
    served = httpx.get(f"{fuzz_service.url}/openapi.json", timeout=30)
    served.raise_for_status()
    return schemathesis.openapi.from_dict(_homogeneous_tuples_as_arrays(served.json()))


def test_every_served_operation_is_fuzzed(api_schema):
    """The served document parses, and the fuzzed list is exactly what it describes."""
    results = list(api_schema.get_all_operations())
    broken = [str(r.err()) for r in results if isinstance(r, Err)]
    assert not broken, f"operations schemathesis cannot read: {broken}"
    served = sorted((r.ok().method.upper(), r.ok().path) for r in results)
    assert served == sorted(OPERATIONS)


def _aim_at_seed(case, seed: Seed, data: st.DataObject) -> None:
    """Points a positive case at the seeded dataset and, three times in four, pulls its numbers into the
    dataset's range (otherwise random ids and batch sizes are nearly always rejected before the
    interesting code runs). Everything else stays as the fuzzer chose it."""
    if "name" in (case.path_parameters or {}):
        case.path_parameters["name"] = seed.name
    if case.operation.path.endswith("/import") and data.draw(st.booleans(), label="real export"):
        case.body = seed.export  # a real export under the seed's name: 409, or 201 with replace=true
    if isinstance(case.query, dict) and "ids" in case.query:
        ids = data.draw(st.lists(st.integers(0, SEED_SIZE - 1), min_size=1, max_size=80), label="ids")
        case.query["ids"] = ",".join(map(str, ids))
    body = case.body
    if not isinstance(body, dict) or "dataset" not in body:
        return
    body["dataset"] = seed.name
    if data.draw(st.integers(0, 3), label="in range") == 0:
        return
    open_step = seed.open_step()
    if "step" in body:
        body["step"] = data.draw(st.sampled_from([body["step"], open_step, open_step + 1]), label="step")
    if "batch_size" in body:
        body["batch_size"] = data.draw(st.integers(1, SEED_SIZE), label="batch_size")
    budget = body.get("rollouts")
    if isinstance(budget, dict) and isinstance(body.get("batch_size"), int):  # a budget the batch can take
        lo = data.draw(st.integers(1, 4), label="rollouts.min")
        hi = data.draw(st.integers(lo, 64), label="rollouts.max")
        batch = body["batch_size"]
        budget.update(min=lo, max=hi, budget=data.draw(st.integers(batch * lo, batch * hi), label="budget"))
        budget["policy"] = data.draw(st.sampled_from(ROLLOUT_POLICIES), label="rollouts.policy")
    if "strategy" in body:
        body["strategy"] = data.draw(st.sampled_from(STRATEGIES), label="strategy")
        if data.draw(st.booleans(), label="default params"):
            body.pop("params", None)
    if isinstance(body.get("prompt_ids"), list):
        body["prompt_ids"] = [int(i) % SEED_SIZE for i in body["prompt_ids"]]
    for result in body.get("results") or []:
        if not isinstance(result, dict) or not isinstance(result.get("prompt_id"), int | float):
            continue
        result["prompt_id"] = int(result["prompt_id"]) % SEED_SIZE
        if not result.get("rewards"):  # give it the other form, with counts that make sense
            result.pop("rewards", None)
            result["trials"] = data.draw(st.integers(1, 16), label="trials")
            result["successes"] = data.draw(st.integers(0, result["trials"]), label="successes")


# Operations without any input have nothing to violate: negative mode cannot generate a case for them.
WITHOUT_INPUT = {("GET", "/datasets"), ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")}
CASES = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode.value}")
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or (method, path) not in WITHOUT_INPUT
]


#: Headers that frame the HTTP message itself: the server (uvicorn's h11) refuses a malformed one with a
#: bare 400 before any route runs, so a fuzzed value there tests the HTTP library, not the service. Negative
#: mode sometimes adds them among its extra headers (which ones depends on the process's hash seed).
FRAMING_HEADERS = frozenset(
    {"content-length", "transfer-encoding", "host", "connection", "expect", "upgrade", "te"}
)


def _drop_framing_headers(case: Any) -> None:
    if isinstance(case.headers, dict):
        for name in [h for h in case.headers if h.lower() in FRAMING_HEADERS]:
            del case.headers[name]


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_fuzz_operation(api_schema, fuzz_service, seed, method, path, mode):
    """No 5xx; only documented status codes and content types; bodies that match their schemas."""
    operation = api_schema[path][method]

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case, data):
        _drop_framing_headers(case)
        aimed = mode is GenerationMode.POSITIVE and data.draw(st.booleans(), label="aim at seed")
        if aimed:
            _aim_at_seed(case, seed, data)
        case.call_and_validate(base_url=fuzz_service.url, checks=CHECKS, timeout=REQUEST_TIMEOUT_S)
        if aimed and method == "DELETE":
            seed.ensure()

    run()


@pytest.mark.parametrize("strategy", ["uniform", "history_resampling"])
def test_score_of_an_unscored_strategy_is_422(fuzz_service, seed, strategy):
    """Found by this fuzzer: /score with a strategy that has no scores was a 500 (ParamError)."""
    body = {"dataset": seed.name, "strategy": strategy, "prompt_ids": [0, 1]}
    r = httpx.post(f"{fuzz_service.url}/score", json=body, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 422, r.text
    assert "no per-prompt scores" in r.json()["detail"]
