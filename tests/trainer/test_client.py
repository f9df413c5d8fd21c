"""The typed client against a real selector service (child process) on the shared Redis.

Every method, the error mapping, and the retry rules. Fault injection happens at the only seam the
real stack cannot provide on demand: an httpx transport that wraps the real one and drops a response
(the request reached the service and was applied) or answers 503 before forwarding.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import http.server
import inspect
import socket
import threading
import uuid

import httpx
import pytest

from rlvr_selector_client import contract
from rlvr_selector_client.client import (
    AsyncSelectorClient,
    AuthError,
    Conflict,
    DatasetInfo,
    InvalidRequest,
    NotFound,
    Result,
    RolloutBudget,
    SelectorClient,
    SelectorError,
    ServiceUnavailable,
)

TOKEN = "test-token-" + uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def service_url(start_service):
    return start_service(SELECTOR_API_TOKEN=TOKEN).url


@pytest.fixture
def client(service_url):
    with SelectorClient(service_url, token=TOKEN, backoff=0.01) as c:
        yield c


@pytest.fixture
def dataset(client):
    name = f"c-{uuid.uuid4().hex[:12]}"
    client.create_dataset(name, 20, rollouts_per_prompt=4)
    yield name
    with contextlib.suppress(NotFound):
        client.delete_dataset(name)


class DropFirstResponse(httpx.BaseTransport):
    """Forwards to the real service; the first request to ``path`` is applied there but its response
    is replaced by a read timeout, as when a connection dies after the server answered."""

    def __init__(self, path: str) -> None:
        self.inner = httpx.HTTPTransport()
        self.path = path
        self.dropped = 0
        self.bodies: list[bytes] = []
        self.calls: list[str | None] = []  # the Selector-Call header of each request to ``path``

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path == self.path:
            self.bodies.append(request.read())
            self.calls.append(request.headers.get(contract.CALL_HEADER))
            if not self.dropped:
                response.read()
                response.close()
                self.dropped += 1
                raise httpx.ReadTimeout("response lost", request=request)
        return response


class UnavailableFirst(httpx.BaseTransport):
    """Answers 503 to the first ``failures`` requests, then forwards to the real service."""

    def __init__(self, failures: int) -> None:
        self.inner = httpx.HTTPTransport()
        self.failures = failures
        self.calls = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.calls <= self.failures:
            return httpx.Response(503, json={"detail": "store unreachable, retry later"})
        return self.inner.handle_request(request)


class Counting(httpx.BaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.calls = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        return self.inner.handle_request(request)


class ClosesAStepAfterBeliefs(httpx.BaseTransport):
    """Forwards to the real service, and after each of the first ``times`` beliefs requests has the
    service close a step of ``dataset`` (a /select for the step after its open one), as a trainer
    running alongside would."""

    def __init__(self, dataset: str, times: int) -> None:
        self.inner = httpx.HTTPTransport()
        self.dataset = dataset
        self.times = times
        self.beliefs_urls: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path.endswith("/beliefs"):
            self.beliefs_urls.append(str(request.url))
            if len(self.beliefs_urls) <= self.times:
                response.read()
                step = response.json()["open_step"] + 1
                body = {"dataset": self.dataset, "step": step, "batch_size": 1, "strategy": "uniform"}
                select = httpx.Request(
                    "POST", request.url.join("/select"), json=body, headers=request.headers
                )
                answer = self.inner.handle_request(select)
                answer.read()
                assert answer.status_code == 200, answer.content
        return response


# --------------------------------------------------------------------------------------------------
def test_operations_endpoints_and_check_server(service_url, client) -> None:
    with SelectorClient(service_url) as anonymous:  # health endpoints need no token
        assert isinstance(anonymous.healthz(), dict)
        assert isinstance(anonymous.readyz(), dict)
    client.check_server()


def test_token_errors(service_url, monkeypatch) -> None:
    monkeypatch.delenv("SELECTOR_API_TOKEN", raising=False)
    with SelectorClient(service_url) as anonymous:
        with pytest.raises(AuthError) as missing:
            anonymous.list_datasets()
        assert missing.value.status == 401
        assert "requires a token and none was sent" in str(missing.value)
        with pytest.raises(AuthError) as unsent:
            anonymous.check_server()
        assert "requires a token and none was sent" in str(unsent.value)
        assert "rejected" not in str(unsent.value)
    with SelectorClient(service_url, token="wrong") as wrong:
        with pytest.raises(AuthError) as rejected:
            wrong.list_datasets()
        assert rejected.value.status == 403
        assert rejected.value.detail
        assert "none was sent" not in str(rejected.value)
        with pytest.raises(AuthError, match="rejected the token"):
            wrong.check_server()


def test_the_token_comes_from_selector_api_token_unless_passed(service_url, monkeypatch) -> None:
    monkeypatch.setenv("SELECTOR_API_TOKEN", TOKEN)
    with SelectorClient(service_url) as from_env:
        from_env.check_server()
    asyncio.run(_check_server_async(service_url))
    monkeypatch.setenv("SELECTOR_API_TOKEN", "wrong")
    with SelectorClient(service_url, token=TOKEN) as explicit:  # the argument wins
        explicit.check_server()
    with SelectorClient(service_url) as from_env, pytest.raises(AuthError, match="rejected the token"):
        from_env.check_server()
    monkeypatch.setenv("SELECTOR_API_TOKEN", "")  # empty: as if unset
    with SelectorClient(service_url) as anonymous, pytest.raises(AuthError) as missing:
        anonymous.check_server()
    assert missing.value.status == 401 and "none was sent" in str(missing.value)


async def _check_server_async(service_url: str) -> None:
    async with AsyncSelectorClient(service_url) as client:
        await client.check_server()


def test_dataset_lifecycle(client) -> None:
    name = f"c-{uuid.uuid4().hex[:12]}"
    info = client.create_dataset(name, 12, rollouts_per_prompt=6, success_threshold=0.5, beta_decay=0.9)
    assert (info.name, info.size, info.rollouts_per_prompt) == (name, 12, 6)
    assert (info.success_threshold, info.beta_decay, info.hmm_decay) == (0.5, 0.9, 0.7)
    again = client.create_dataset(name, 12, rollouts_per_prompt=6, success_threshold=0.5, beta_decay=0.9)
    assert again.size == 12  # same spec: accepted, not a conflict
    with pytest.raises(Conflict) as conflict:
        client.create_dataset(name, 13, rollouts_per_prompt=6)
    assert conflict.value.status == 409
    assert name in client.list_datasets()
    fetched = client.get_dataset(name)
    assert fetched.size == 12 and fetched.open_step == 0 and fetched.observations == 0
    client.delete_dataset(name)
    with pytest.raises(NotFound) as missing:
        client.get_dataset(name)
    assert missing.value.status == 404
    assert name not in client.list_datasets()


def test_create_parameters_are_the_dataset_settings() -> None:
    """DatasetInfo's spec fields and both clients' create_dataset parameters are the dataset settings,
    in order, with the service's defaults; the create body holds every setting but `defaults` (only when
    given)."""
    names = [s.name for s in contract.SETTINGS]
    info_fields = dataclasses.fields(DatasetInfo)[: len(names)]
    assert [f.name for f in info_fields] == names
    for f in info_fields:
        setting = next(s for s in contract.SETTINGS if s.name == f.name)
        assert f.default == (
            contract.DEFAULTS[f.name] if setting.name in contract.INFO_DEFAULTED else dataclasses.MISSING
        )
    for method in (SelectorClient.create_dataset, AsyncSelectorClient.create_dataset):
        params = list(inspect.signature(method).parameters.values())[1:]
        assert [p.name for p in params] == names
        for p in params:
            expected = inspect.Parameter.empty if p.name in ("name", "size") else contract.DEFAULTS[p.name]
            assert p.default == (None if p.name == "defaults" else expected), p.name
    body = contract.create_body({"name": "d", "size": 3, **contract.DEFAULTS, "defaults": None})
    assert body == {
        "name": "d",
        "size": 3,
        "rollouts_per_prompt": 8,
        "success_threshold": 1.0,
        "beta_prior": [1.0, 1.0],
        "beta_decay": 1.0,
        "hmm_decay": 0.7,
        "reward_mode": "binary",
        "max_lag": 0,
        "prior_strength": 2.0,
        "group_decay": 0.9,
    }
    assert contract.create_body({"name": "d", "size": 3, "group_decay": 0.5, "max_lag": 2}) == {
        **body,
        "group_decay": 0.5,
        "max_lag": 2,
    }


def test_select_observe_beliefs_score(client, dataset) -> None:
    selection = client.select(dataset, step=0, batch_size=5, strategy="insight", return_scores=True)
    assert selection.step == 0 and selection.strategy == "insight"
    assert len(set(selection.prompt_ids)) == 5 and all(0 <= i < 20 for i in selection.prompt_ids)
    assert selection.scores is not None and len(selection.scores) == 5
    assert client.select(dataset, 0, 5, "insight").prompt_ids == selection.prompt_ids  # deterministic
    uniform = client.select(dataset, 0, 5, "uniform")
    assert uniform.scores is None

    first, second = selection.prompt_ids[:2]
    results = [Result(first, rewards=[1, 0, 1, 0]), Result(second, successes=3, trials=4)]
    ack = client.observe(dataset, 0, results, request_id="run-a-s0-r0")
    assert (ack.applied, ack.duplicate) == (2, False)
    repeat = client.observe(dataset, 0, results, request_id="run-a-s0-r0")
    assert (repeat.applied, repeat.duplicate) == (0, True)

    beliefs = client.beliefs(dataset, [first, second])
    assert beliefs.open_step == 0
    by_id = {b.prompt_id: b for b in beliefs.beliefs}
    assert (by_id[first].alpha, by_id[first].beta, by_id[first].observations) == (3.0, 3.0, 1)
    assert (by_id[second].alpha, by_id[second].beta) == (4.0, 2.0)
    assert by_id[second].mean == pytest.approx(4 / 6)
    assert len(by_id[first].hmm_prior) == 3

    scores = client.score(dataset, "insight", [first, second, 7])
    assert scores.open_step == 0 and len(scores.scores) == 3
    info = client.get_dataset(dataset)
    assert info.observations == 2 and info.rollouts == 8


def test_select_with_a_rollout_budget(client, service_url, dataset) -> None:
    """RolloutBudget against the real service: counts per prompt, summing to the budget, within the
    bounds, the same batch as without a budget; max None is the service's K limit; a budget the batch
    cannot take is an InvalidRequest naming the fix; the async client agrees."""
    plain = client.select(dataset, 0, 5, "insight")
    assert plain.rollouts is None
    budget = RolloutBudget(budget=37, min=2, max=12, policy="posterior")
    shared = client.select(dataset, 0, 5, "insight", rollouts=budget)
    assert shared.prompt_ids == plain.prompt_ids
    assert shared.rollouts is not None and len(shared.rollouts) == 5
    assert sum(shared.rollouts) == 37 and all(2 <= n <= 12 for n in shared.rollouts)
    for policy in ("uniform", "knapsack", "variance"):
        other = client.select(dataset, 0, 5, "insight", rollouts=RolloutBudget(37, 2, 12, policy))
        assert sum(other.rollouts) == 37
    wide = client.select(dataset, 0, 2, "uniform", rollouts=RolloutBudget(budget=2000))
    assert wide.rollouts == [1000, 1000]  # max None: up to the K limit (1024)
    with pytest.raises(InvalidRequest) as small:
        client.select(dataset, 0, 5, "insight", rollouts=RolloutBudget(budget=9, min=2))
    assert small.value.status == 422 and "at least 10" in small.value.detail

    async def via_async() -> list[int] | None:
        async with AsyncSelectorClient(service_url, token=TOKEN) as c:
            return (await c.select(dataset, 0, 5, "insight", rollouts=budget)).rollouts

    assert asyncio.run(via_async()) == shared.rollouts


def test_invalid_requests_are_typed(client, dataset) -> None:
    with pytest.raises(InvalidRequest) as too_big:
        client.select(dataset, 0, 21, "uniform")
    assert too_big.value.status == 422 and too_big.value.detail
    with pytest.raises(InvalidRequest):
        client.select(dataset, 0, 2, "no-such-strategy")
    with pytest.raises(InvalidRequest):
        client.select(dataset, 0, 2, "insight", params={"no_such_param": 1})
    with pytest.raises(InvalidRequest):
        client.observe(dataset, 0, [Result(20, rewards=[1.0])], request_id="out-of-range")
    with pytest.raises(NotFound):
        client.select("no-such-dataset-" + uuid.uuid4().hex[:6], 0, 1, "uniform")
    client.select(dataset, 3, 2, "uniform")  # closes steps 0..2
    with pytest.raises(Conflict) as closed:
        client.observe(dataset, 1, [Result(0, rewards=[1.0, 0.0])], request_id="late")
    assert closed.value.status == 409


def test_retry_after_a_lost_response_reuses_the_request_id(service_url, dataset) -> None:
    transport = DropFirstResponse("/observe")
    with SelectorClient(service_url, token=TOKEN, backoff=0.01, transport=transport) as flaky:
        ack = flaky.observe(dataset, 0, [Result(4, rewards=[1, 1, 0, 0])], request_id="run-b-s0-r0")
        # the first attempt was applied, its answer lost; the retry is answered with what that attempt
        # applied: the call was made once, and its ack counts its one result
        assert (ack.applied, ack.duplicate) == (1, False)
        assert transport.dropped == 1 and len(transport.bodies) == 2
        assert transport.bodies[0] == transport.bodies[1]  # byte-identical retry, same request id
        assert transport.calls[0] and transport.calls[0] == transport.calls[1]  # the same call id
        # a second send by the caller is a duplicate: it applies nothing
        again = flaky.observe(dataset, 0, [Result(4, rewards=[1, 1, 0, 0])], request_id="run-b-s0-r0")
        assert (again.applied, again.duplicate) == (0, True) and transport.calls[2] != transport.calls[0]
        belief = flaky.beliefs(dataset, [4]).beliefs[0]
    assert (belief.observations, belief.alpha, belief.beta) == (1, 3.0, 3.0)  # counted once


def test_503_is_retried_then_succeeds_or_reported(service_url) -> None:
    transport = UnavailableFirst(failures=2)
    with SelectorClient(service_url, token=TOKEN, retries=3, backoff=0.0, transport=transport) as c:
        assert isinstance(c.list_datasets(), list)
    assert transport.calls == 3
    with (
        SelectorClient(
            service_url, token=TOKEN, retries=1, backoff=0.0, transport=UnavailableFirst(failures=5)
        ) as c,
        pytest.raises(ServiceUnavailable) as exc,
    ):
        c.list_datasets()
    assert exc.value.status == 503 and "retry later" in exc.value.detail


def test_client_errors_are_not_retried(service_url) -> None:
    transport = Counting()
    with (
        SelectorClient(service_url, token=TOKEN, retries=3, backoff=0.0, transport=transport) as c,
        pytest.raises(NotFound),
    ):
        c.get_dataset("missing-" + uuid.uuid4().hex[:6])
    assert transport.calls == 1


def test_unreachable_service_is_a_clear_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here once the socket closes
    url = f"http://127.0.0.1:{port}"
    with SelectorClient(url, retries=2, backoff=0.01) as c, pytest.raises(ServiceUnavailable) as exc:
        c.check_server()
    message = str(exc.value)
    assert url in message and "3 attempt" in message and "selector-service serve" in message
    assert exc.value.status is None


class _QuietFiles(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_is_not_the_selector_service(tmp_path) -> None:
    """A real HTTP server that is something else: clear errors, no JSON tracebacks."""
    (tmp_path / "healthz").write_text("<html>hello</html>")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietFiles, directory=str(tmp_path))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with (
            SelectorClient(url, retries=0) as c,
            pytest.raises(SelectorError, match="not the selector service's"),
        ):
            c.healthz()  # 200 with an HTML body
        (tmp_path / "healthz").write_text('{"status": "ok"}')
        with SelectorClient(url, retries=0) as c, pytest.raises(SelectorError, match="does not look like"):
            c.check_server()  # /readyz is missing: 404
    finally:
        server.shutdown()
        server.server_close()


def test_result_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        Result(1, rewards=[1.0], successes=1, trials=1)
    with pytest.raises(ValueError, match="exactly one"):
        Result(1)
    with pytest.raises(ValueError, match="together"):
        Result(1, successes=1)
    with pytest.raises(ValueError, match="finite"):
        Result(1, rewards=[float("nan")])
    with pytest.raises(ValueError, match="http"):
        SelectorClient("localhost:8000")


def test_async_client(service_url) -> None:
    async def scenario() -> None:
        name = f"a-{uuid.uuid4().hex[:12]}"
        async with AsyncSelectorClient(service_url, token=TOKEN, backoff=0.01) as c:
            await c.check_server()
            info = await c.create_dataset(name, 10, rollouts_per_prompt=2)
            assert info.size == 10
            assert name in await c.list_datasets()
            selection = await c.select(name, 0, 3, "dps", return_scores=True)
            assert len(selection.prompt_ids) == 3 and selection.scores is not None
            results = [Result(i, rewards=[1.0, 0.0]) for i in selection.prompt_ids]
            assert (await c.observe(name, 0, results, "async-s0")).duplicate is False
            assert (await c.observe(name, 0, results, "async-s0")).duplicate is True
            beliefs = await c.beliefs(name, selection.prompt_ids)
            assert [b.observations for b in beliefs.beliefs] == [1, 1, 1]
            assert len((await c.score(name, "dps", [0, 1])).scores) == 2
            assert (await c.get_dataset(name)).observations == 3
            assert isinstance(await c.healthz(), dict) and isinstance(await c.readyz(), dict)
            await c.delete_dataset(name)
            with pytest.raises(NotFound):
                await c.get_dataset(name)

    asyncio.run(scenario())


def test_beliefs_of_more_ids_than_one_url_holds(service_url, client) -> None:
    name = f"c-{uuid.uuid4().hex[:12]}"
    client.create_dataset(name, 20_000, rollouts_per_prompt=2)
    try:
        client.observe(name, 0, [Result(19_990, rewards=[1, 1]), Result(3, rewards=[0, 0])], request_id="big")
        ids = [*range(19_999, 3_999, -1), 3, 19_990, 3]  # 16 003 ids, not sorted, one twice
        transport = Counting()
        with SelectorClient(service_url, token=TOKEN, transport=transport) as counted:
            beliefs = counted.beliefs(name, iter(ids))
        assert transport.calls > 1
        assert beliefs.open_step == 0
        assert [b.prompt_id for b in beliefs.beliefs] == ids
        observed = {b.prompt_id: (b.alpha, b.beta, b.observations) for b in beliefs.beliefs if b.observations}
        assert observed == {19_990: (3.0, 1.0, 1), 3: (1.0, 3.0, 1)}

        async def read_async():
            async with AsyncSelectorClient(service_url, token=TOKEN) as c:
                return await c.beliefs(name, ids)

        assert asyncio.run(read_async()) == beliefs
    finally:
        client.delete_dataset(name)


def test_a_long_beliefs_read_is_at_one_open_step(service_url, client) -> None:
    name = f"c-{uuid.uuid4().hex[:12]}"
    client.create_dataset(name, 12_000, rollouts_per_prompt=2)
    ids = list(range(12_000))
    try:
        once = ClosesAStepAfterBeliefs(name, times=1)
        with SelectorClient(service_url, token=TOKEN, transport=once) as c:
            beliefs = c.beliefs(name, ids)
        requests = len(once.beliefs_urls) // 2
        assert requests > 1 and len(once.beliefs_urls) == 2 * requests  # the first read was started over
        assert all(len(url) < 40_000 for url in once.beliefs_urls)
        assert beliefs.open_step == 1 and [b.prompt_id for b in beliefs.beliefs] == ids

        always = ClosesAStepAfterBeliefs(name, times=1_000)
        with (
            SelectorClient(service_url, token=TOKEN, transport=always) as c,
            pytest.raises(Conflict) as moving,
        ):
            c.beliefs(name, ids)
        assert f"{requests} requests" in str(moving.value) and "read fewer ids per call" in str(moving.value)
    finally:
        client.delete_dataset(name)


def test_strategies_from_both_clients(service_url, client) -> None:
    offered = client.strategies()
    assert offered["insight"] == {"eta": 3.0, "mu": 0.3, "k": None, "candidate_ratio": 16}
    assert offered["uniform"] == {} and "dps" in offered

    async def scenario() -> dict:
        async with AsyncSelectorClient(service_url, token=TOKEN) as c:
            return await c.strategies()

    assert asyncio.run(scenario()) == offered
