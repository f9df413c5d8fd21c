"""The typed client (sync and async) between a trainer and a real service, through a proxy that injects
faults into the HTTP exchanges (tests/service/http_proxy.py): answers dropped after the service applied
the request, resets, cut and drip-fed answers, stalls, 502/503 pages, duplicated requests, connects
refused, and the service killed with SIGKILL and restarted.

The promise checked, through the service's REST API against a model of what the trainer sent: nothing
lost, nothing counted twice, ``applied`` summed over the calls the trainer made once equals the results
it sent, ``duplicate`` only for the trainer's own second sends, every write that may have been applied
raised as `OutcomeUnknown` (a plain `ServiceUnavailable` only when the proxy forwarded none of its
attempts), every call ended by its deadline, and every error message naming its cause.

The search: seeded schedules, a few seeds here (``RLVR_CLIENT_FAULT_SEEDS=<n>`` runs more); a failure
names its seed.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from rlvr_selector_client import client as sc
from rlvr_selector_client import integrations
from rlvr_selector_client.client import AsyncSelectorClient, Result, SelectorClient, ServiceUnavailable
from tests.service.http_proxy import FaultProxy
from tests.utils import ServiceProcess, free_port

pytestmark = pytest.mark.slow

SIZE, BATCH, TRIALS = 40, 4, 4
#: The client's settings in the search: short, so that a fault costs little.
TIMEOUT_S, RETRIES, BACKOFF_S, DEADLINE_S = 0.5, 2, 0.02, 2.5
#: How long after its deadline a call may end (a loaded machine's scheduling); a hang is far beyond.
SLACK_S = 1.5
SEEDS = int(os.environ.get("RLVR_CLIENT_FAULT_SEEDS", "2"))
STEPS = 14
WEIGHTS = {
    "drop": 4,
    "reset": 1,
    "cut": 1,
    "stall": 1,
    "drip": 1,
    "busy": 2,
    "gateway": 2,
    "twice": 2,
    "down": 1,
    "kill": 1,
}
#: The most faults of these kinds per schedule (each costs a deadline, a pause or a restart).
BUDGET = {"drip": 1, "stall": 2, "down": 1, "kill": 1}


class Service:
    """The service on a fixed port and key prefix, so that a SIGKILLed one restarts in its place."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url, self.port = redis_url, free_port()
        self.proc = ServiceProcess(redis_url=redis_url, port=self.port).start()
        self.restarts: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return self.proc.url

    def kill9(self) -> None:
        """SIGKILL now; the restart runs meanwhile (the proxy answers 502 while nothing listens)."""
        self.proc.kill(signal.SIGKILL)
        prefix = self.proc.prefix

        def restart() -> None:
            self.proc = ServiceProcess(redis_url=self.redis_url, port=self.port, prefix=prefix).start()

        thread = threading.Thread(target=restart)
        thread.start()
        self.restarts.append(thread)

    def settle(self) -> None:
        for thread in self.restarts:
            thread.join(120)
        self.restarts.clear()


@pytest.fixture(scope="module")
def service(redis_url):
    svc = Service(redis_url)
    yield svc
    svc.settle()
    svc.proc.stop()


def new_dataset(service: Service) -> str:
    name = f"cf-{uuid.uuid4().hex[:10]}"
    httpx.post(f"{service.url}/datasets", json={"name": name, "size": SIZE}, timeout=30).raise_for_status()
    return name


class AsyncFacade:
    """The async client driven one call at a time from blocking code, on an event loop of its own: the
    same trainer loop runs against both clients."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.inner = AsyncSelectorClient(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.inner, name)
        return lambda *a, **k: self.loop.run_until_complete(method(*a, **k))

    def close(self) -> None:
        self.loop.run_until_complete(self.inner.aclose())
        self.loop.close()


def make_client(kind: str, url: str, **settings: Any) -> Any:
    return (SelectorClient if kind == "sync" else AsyncFacade)(url, **settings)


@dataclass
class Model:
    """What the trainer sent and what it was told."""

    results: dict[str, list[Result]] = field(default_factory=dict)  # request id -> its results
    acked: dict[str, tuple[int, bool]] = field(default_factory=dict)  # request id -> (applied, duplicate)
    again: list[tuple[str, int, bool]] = field(default_factory=list)  # the trainer's second sends
    errors: Counter = field(default_factory=Counter)
    plain: list[tuple[str, int, int]] = field(default_factory=list)  # writes refused as not reached
    late: list[tuple[str, float]] = field(default_factory=list)  # calls that outlived their deadline
    messages: list[str] = field(default_factory=list)


def answered(model: Model, proxy: FaultProxy, what: str, call: Any, request_id: str | None = None) -> Any:
    """Runs ``call`` until it is answered, as a trainer does: an error is recorded and the same call made
    again. Each call is timed against its deadline; a plain ServiceUnavailable of a write is noted with
    the proxy's log around it (none of its attempts may have been forwarded)."""
    for _ in range(60):
        before, started = len(proxy.log), time.monotonic()
        try:
            return call()
        except ServiceUnavailable as exc:
            model.errors[(what, type(exc).__name__)] += 1
            model.messages.append(str(exc))
            if not isinstance(exc, sc.OutcomeUnknown):
                model.plain.append((what, before, len(proxy.log)))
            time.sleep(0.2)
        finally:
            elapsed = time.monotonic() - started
            if elapsed > DEADLINE_S + SLACK_S:
                model.late.append((what, round(elapsed, 2)))
    raise AssertionError(f"{what} {request_id}: no answer in 60 calls")


def train(client: Any, proxy: FaultProxy, name: str, seed: int, steps: int, model: Model) -> None:
    """A trainer's loop: select a step, report its results once under their request id, sometimes send a
    report a second time after its answer (as a resumed run does), read the dataset's summary."""
    rng = random.Random(seed)
    for step in range(steps):
        selection = answered(
            model,
            proxy,
            "select",
            lambda: client.select(name, step, BATCH, "dps", seed=seed),  # noqa: B023
        )
        results = [Result(p, successes=rng.randint(0, TRIALS), trials=TRIALS) for p in selection.prompt_ids]
        rid = f"{name}-s{step}"
        model.results[rid] = results

        def report() -> Any:
            return client.observe(name, step, results, request_id=rid)  # noqa: B023

        ack = answered(model, proxy, "observe", report, rid)
        model.acked[rid] = (ack.applied, ack.duplicate)
        if rng.random() < 0.15:
            again = answered(model, proxy, "observe", report, rid)
            model.again.append((rid, again.applied, again.duplicate))
        try:  # a read the trainer does without waiting for it (a progress line)
            started = time.monotonic()
            client.get_dataset(name)
        except ServiceUnavailable as exc:
            assert not isinstance(exc, sc.OutcomeUnknown), f"a read raised {exc!r}"
            model.errors[("read", type(exc).__name__)] += 1
            model.messages.append(str(exc))
        if time.monotonic() - started > DEADLINE_S + SLACK_S:
            model.late.append(("read", round(time.monotonic() - started, 2)))


def check(service: Service, proxy: FaultProxy, name: str, model: Model) -> None:
    sent = sum(len(r) for r in model.results.values())
    wrong = {rid: ack for rid, ack in model.acked.items() if ack != (len(model.results[rid]), False)}
    assert not wrong, f"calls made once answered other than (applied=len(results), duplicate=False): {wrong}"
    assert sum(applied for applied, _ in model.acked.values()) == sent
    assert all((applied, dup) == (0, True) for _, applied, dup in model.again), model.again
    assert not model.late, f"calls that ended after their deadline of {DEADLINE_S} s: {model.late}"
    # A plain ServiceUnavailable said that no attempt reached the service: the proxy forwarded none.
    for what, lo, hi in model.plain:
        forwarded = [e for e in proxy.log[lo:hi] if e.forwarded]
        assert not forwarded, f"{what} raised ServiceUnavailable, but the proxy forwarded {forwarded}"
    for message in model.messages:
        assert re.search(r"(GET|POST|PUT|DELETE) /\S+", message) and "attempt" in message, message
        assert not re.search(r"\w+: \)|\w+: ;", message), f"an empty cause: {message}"
        assert "<" not in message and len(message) < 1500, message
    # nothing lost, nothing doubled: the service's beliefs are the model's sums
    successes, failures, count = Counter(), Counter(), Counter()
    for results in model.results.values():
        for r in results:
            successes[r.prompt_id] += r.successes
            failures[r.prompt_id] += r.trials - r.successes
            count[r.prompt_id] += 1
    with httpx.Client(base_url=service.url, timeout=30) as http:
        ids = ",".join(map(str, range(SIZE)))
        beliefs = http.get(f"/datasets/{name}/beliefs", params={"ids": ids}).json()["beliefs"]
        summary = http.get(f"/datasets/{name}").json()["summary"]
    assert summary["observations"] == sent
    for b in beliefs:
        p = b["prompt_id"]
        expected = (1.0 + successes[p], 1.0 + failures[p], count[p])
        assert (b["alpha"], b["beta"], b["observations"]) == expected, f"prompt {p}"


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_trainer_through_a_faulty_network_counts_every_result_once(service, kind, record_property):
    totals: Counter = Counter()
    faults: Counter = Counter()
    for seed in range(SEEDS):
        service.settle()
        name = new_dataset(service)
        model = Model()
        # Every schedule opens with the proxy going away at the first select: that select may have been
        # applied (OutcomeUnknown), its resends reach nothing (ServiceUnavailable). One schedule in two
        # may kill the service.
        weights = {a: w for a, w in WEIGHTS.items() if a != "kill" or seed % 2 == 0}
        with FaultProxy(
            service.port,
            seed=seed,
            faults=0.3,
            weights=weights,
            budget=BUDGET,
            script=["down"],
            down_s=1.0,
            on_kill=service.kill9,
        ) as proxy:
            client = make_client(
                kind, proxy.url, timeout=TIMEOUT_S, retries=RETRIES, backoff=BACKOFF_S, deadline=DEADLINE_S
            )
            try:
                train(client, proxy, name, seed, steps=STEPS, model=model)
                service.settle()
                check(service, proxy, name, model)
            except AssertionError as exc:
                print(f"FAILING SEED: {kind} client, seed {seed} (faults {dict(proxy.counts)})")
                raise AssertionError(f"{kind} client, seed {seed}: {exc}") from None
            finally:
                client.close()
        totals.update(model.errors)
        faults.update(proxy.counts)
    record_property("errors", dict(totals))
    record_property("faults", dict(faults))
    # the schedules did what they are for: every fault happened, and calls ended both ways
    assert set(WEIGHTS) <= {a for a, n in faults.items() if n}, faults
    assert totals[("observe", "OutcomeUnknown")] and totals[("select", "OutcomeUnknown")], totals
    assert totals[("select", "ServiceUnavailable")], totals


# ---- one fault at a time ---------------------------------------------------------------------------
def results_of(n: int) -> list[Result]:
    return [Result(p, rewards=[1.0, 0.0]) for p in range(n)]


def observations(service: Service, name: str) -> int:
    return httpx.get(f"{service.url}/datasets/{name}", timeout=30).json()["summary"]["observations"]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_observe_whose_answers_were_lost_is_an_outcome_unknown_and_its_resend_counts_once(service, kind):
    name = new_dataset(service)
    rid = f"{name}-lost"
    with FaultProxy(service.port, script=["drop", "reset", "gateway"]) as proxy:
        client = make_client(kind, proxy.url, retries=2, backoff=0.01)
        try:
            with pytest.raises(sc.OutcomeUnknown) as lost:
                client.observe(name, 0, results_of(3), request_id=rid)
            err = lost.value
            assert (err.request_id, err.method, err.path, err.attempts, err.status) == (
                rid,
                "POST",
                "/observe",
                3,
                502,
            )
            message = str(err)
            assert "may have been applied" in message and f"request_id {rid!r}" in message, message
            assert "never send these results under a new request id" in message.lower(), message
            assert "3 attempts" in message and "HTTP 502: 502 Bad Gateway" in message, message
            assert observations(service, name) == 3  # the first attempt was applied
            # sent again on the same client: it continues the call, and its answer counts what was applied
            ack = client.observe(name, 0, results_of(3), request_id=rid)
            assert (ack.applied, ack.duplicate) == (3, False)
            again = client.observe(name, 0, results_of(3), request_id=rid)  # the caller's own second send
            assert (again.applied, again.duplicate) == (0, True)
        finally:
            client.close()
    calls = {e.call for e in proxy.log}
    assert len(calls) == 2 and None not in calls  # one call id for the lost call and its resend
    assert observations(service, name) == 3


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_write_that_reached_nothing_is_plain_service_unavailable(kind):
    with FaultProxy(1) as proxy:  # nothing listens once it is closed
        url = proxy.url
    client = make_client(kind, url, retries=2, backoff=0.01)
    try:
        for call in (
            lambda: client.observe("d", 0, results_of(1), request_id="never-sent"),
            lambda: client.select("d", 0, 1, "uniform"),
            lambda: client.delete_dataset("d"),
        ):
            with pytest.raises(ServiceUnavailable) as refused:
                call()
            assert not isinstance(refused.value, sc.OutcomeUnknown)
            message = str(refused.value)
            assert (
                "nothing was applied" in message and "ConnectError: " in message and "3 attempts" in message
            )
    finally:
        client.close()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_answer_fed_a_byte_at_a_time_ends_by_the_deadline(service, kind):
    """httpx's timeouts bound each read, and a trickle never trips them: the call's deadline does (here
    the default one, 0.6 s for each of 2 attempts and 0.1 s between them). The proxy stops by itself
    after 10 s, so a client without a deadline ends there."""
    name = new_dataset(service)
    for what, call, error in [
        ("select", lambda c: c.select(name, 0, 2, "uniform"), "OutcomeUnknown"),
        ("read", lambda c: c.get_dataset(name), "ServiceUnavailable"),
    ]:
        with FaultProxy(service.port, script=["drip", "drip"], drip_s=0.2, lifetime_s=10) as proxy:
            client = make_client(kind, proxy.url, timeout=0.6, retries=1, backoff=0.1)
            started = time.monotonic()
            try:
                with pytest.raises(ServiceUnavailable) as cut:
                    call(client)
            finally:
                elapsed = time.monotonic() - started
                client.close()
        assert elapsed < 1.3 + SLACK_S, f"{what}: {elapsed:.1f} s"
        assert type(cut.value).__name__ == error, cut.value
        assert "deadline of 1.3 s" in str(cut.value), cut.value


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_errors_name_their_cause_and_quote_a_page_by_its_first_line(service, kind):
    name = new_dataset(service)
    with FaultProxy(service.port, script=["stall", "stall", "busy", "busy"]) as proxy:
        client = make_client(kind, proxy.url, timeout=0.3, retries=1, backoff=0.01)
        try:
            with pytest.raises(ServiceUnavailable) as stalled:
                client.get_dataset(name)
            with pytest.raises(ServiceUnavailable) as busy:
                client.get_dataset(name)
        finally:
            client.close()
    message = str(stalled.value)
    assert re.search(r"ReadTimeout: \w", message), message  # httpx's async timeouts have no text
    assert f"GET /datasets/{name}" in message and "2 attempts" in message, message
    message = str(busy.value)
    assert busy.value.status == 503 and busy.value.detail == "503 Service Temporarily Unavailable"
    assert "-> HTTP 503 (2 attempts" in message and "503 Service Temporarily Unavailable" in message, message
    assert "<" not in message and len(message) < 300, message


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_retry_after_is_waited_within_the_deadline(service, kind):
    name = new_dataset(service)
    with FaultProxy(service.port, script=["busy"], retry_after="0.3") as proxy:
        client = make_client(kind, proxy.url, retries=1, backoff=0.0)
        try:
            assert client.get_dataset(name).name == name  # waited 0.3 s, then answered
        finally:
            client.close()
    assert [e.action for e in proxy.log] == ["busy", "pass"]
    with FaultProxy(service.port, script=["busy"], retry_after="30") as proxy:
        client = make_client(kind, proxy.url, retries=1, backoff=0.0, deadline=5.0)
        try:
            with pytest.raises(ServiceUnavailable) as later:
                client.get_dataset(name)
        finally:
            client.close()
    assert [e.action for e in proxy.log] == ["busy"]  # not sent again before the service asked
    assert "asked to retry after 30 s, beyond the call's deadline" in str(later.value), later.value


def test_a_delete_whose_answer_was_lost_is_done(service):
    name = new_dataset(service)
    with (
        FaultProxy(service.port, script=["drop"]) as proxy,
        SelectorClient(proxy.url, backoff=0.01) as client,
    ):
        client.delete_dataset(name)  # the retry finds it gone: the lost attempt deleted it
    assert httpx.get(f"{service.url}/datasets/{name}", timeout=30).status_code == 404


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_adapters_report_sends_an_unknown_outcome_again_until_it_counts_once(service, kind, caplog):
    """integrations.observe_exactly_once, which every adapter reports through: its first send's answers
    are all lost (OutcomeUnknown), the second meets a service that is away (all 503), the third is
    answered with what the first applied."""
    name = new_dataset(service)
    rid = f"{name}-adapter"
    with FaultProxy(service.port, script=["drop"] * 3 + ["busy"] * 3) as proxy:
        kwargs: dict[str, Any] = {"retries": 2, "backoff": 0.01}
        if kind == "sync":
            with SelectorClient(proxy.url, **kwargs) as client:
                ack = integrations.observe_exactly_once(
                    client, name, 0, results_of(4), rid, waits_s=(0.05, 0.1)
                )
        else:

            async def report() -> Any:
                async with AsyncSelectorClient(proxy.url, **kwargs) as client:
                    return await integrations.observe_exactly_once_async(
                        client, name, 0, results_of(4), rid, waits_s=(0.05, 0.1)
                    )

            ack = asyncio.run(report())
    assert (ack.applied, ack.duplicate) == (4, False)
    assert observations(service, name) == 4
    assert sum("sending it again with the same request id" in r.getMessage() for r in caplog.records) == 2
    # a service away for longer than the patience: the unknown outcome is raised, to be resent later
    with (
        FaultProxy(service.port, script=["busy"] * 50) as proxy,
        SelectorClient(proxy.url, **kwargs) as client,
        pytest.raises(sc.OutcomeUnknown),
    ):
        integrations.observe_exactly_once(
            client, name, 1, results_of(1), f"{rid}-2", patience_s=0.3, waits_s=(0.05, 0.1)
        )
    assert observations(service, name) == 4
