"""Three real service processes on one Redis, killed with SIGKILL at random moments under load.

The process-level counterpart of tests/service/test_replica_search.py: real HTTP clients (threads) observe,
select and read through three `selector-service` processes that snapshot every few records and catch
up a few records per round trip; a killer thread sends SIGKILL to a random process at seeded random
moments and starts a new one in its place. Clients retry an unanswered call (connection refused or
reset, 503) with the same request id on another process. After every phase each live process must hold
exactly what the reference model (tests/service/replica_model.py), fed only acknowledged answers, holds: the
Beta posteriors, DPS priors, observation counts, step and the batches of every strategy.

Schedules are seeded (operations, kill times), the interleaving is real: a failure prints its seed, and
replaying it (KILL9_SEEDS=<seed>) repeats the same operations, not necessarily the same race.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid

import httpx
import numpy as np
import pytest

from selector_service.dataset.state import DatasetSpec
from tests.service.replica_model import SELECTIONS, ReplicaModel, model_batches, random_results
from tests.utils import ServiceProcess

SEEDS = [int(s) for s in os.environ.get("KILL9_SEEDS", "0,1").split(",")]
RETRYABLE = (httpx.TransportError,)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


class Fleet:
    """Three service processes on one Redis key prefix; `kill_one` replaces one with a fresh process."""

    def __init__(self, redis_url: str, rng: random.Random) -> None:
        self.redis_url = redis_url
        self.prefix = f"k9{uuid.uuid4().hex[:8]}"
        self.env = {
            "SELECTOR_SNAPSHOT_EVERY_RECORDS": str(rng.choice([2, 3, 5])),
            "SELECTOR_SYNC_BATCH": str(rng.choice([1, 2, 3])),
            "SELECTOR_SNAPSHOT_CHUNK_BYTES": "1024",
        }
        self.lock = threading.Lock()
        self.procs = [self._start() for _ in range(3)]
        self.kills = 0

    def _start(self) -> ServiceProcess:
        return ServiceProcess(redis_url=self.redis_url, prefix=self.prefix, env=self.env).start()

    def urls(self) -> list[str]:
        with self.lock:
            return [p.url for p in self.procs]

    def kill_one(self, rng: random.Random) -> None:
        index = rng.randrange(len(self.procs))
        with self.lock:
            victim = self.procs[index]
        victim.kill(signal.SIGKILL)
        fresh = self._start()
        with self.lock:
            self.procs[index] = fresh
            self.kills += 1

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill(signal.SIGKILL)


def _call(fleet: Fleet, rng: random.Random, method: str, path: str, **kwargs) -> httpx.Response:
    """Sends until a process answers with something other than 503."""
    for _ in range(400):
        url = rng.choice(fleet.urls())
        try:
            r = httpx.request(method, url + path, timeout=30, **kwargs)
        except RETRYABLE:
            time.sleep(0.02)
            continue
        if r.status_code == 503:
            time.sleep(0.02)
            continue
        assert r.status_code < 500, f"{method} {path}: {r.status_code} {r.text}"
        return r
    raise AssertionError(f"{method} {path}: no process answered")


def _client(fleet, model, lock, name, rng, tag, ops) -> None:
    spec = model.spec
    sent = []
    for i in range(ops):
        roll = rng.random()
        with lock:
            open_step = model.open_step
        if roll < 0.6:
            if sent and rng.random() < 0.15:
                rid, step, results = rng.choice(sent)
            else:
                rid = f"{tag}-{i}"
                step = max(0, open_step + rng.choice([-2, -1, 0, 0, 0, 1]))
                results = random_results(rng, spec.size, spec.rollouts_per_prompt)
                sent.append((rid, step, results))
            body = {
                "dataset": name,
                "step": step,
                "request_id": rid,
                "results": [
                    {"prompt_id": r.prompt_id, "rewards": r.rewards}
                    if r.rewards is not None
                    else {"prompt_id": r.prompt_id, "successes": r.successes, "trials": r.trials}
                    for r in results
                ],
            }
            r = _call(fleet, rng, "POST", "/observe", json=body)
            if r.status_code == 409:
                continue
            assert r.status_code == 200, r.text
            with lock:
                model.acknowledged(rid, step, r.json()["lag"], results)
        elif roll < 0.85:
            step = open_step + rng.choice([0, 0, 1])
            body = {
                "dataset": name,
                "step": step,
                "batch_size": 2,
                "strategy": rng.choice(["dps", "insight"]),
            }
            r = _call(fleet, rng, "POST", "/select", json=body)
            if r.status_code == 409:
                continue
            assert r.status_code == 200, r.text
            with lock:
                model.opened(step)
        else:
            _call(fleet, rng, "GET", f"/datasets/{name}").raise_for_status()


def _check(fleet: Fleet, model: ReplicaModel, name: str, seed: int) -> None:
    expected = model.state()
    batches = model_batches(model.spec, expected, 2)
    ids = ",".join(str(i) for i in range(model.spec.size))
    a = expected.arrays
    for url in fleet.urls():
        who = f"seed {seed}, process {url} (replay: KILL9_SEEDS={seed})"
        info = httpx.get(f"{url}/datasets/{name}", timeout=30).json()["summary"]
        got = (info["open_step"], info["observations"], info["rollouts"], info["steps_closed"])
        want = (expected.open_step, expected.results, round(expected.rollouts), expected.steps_closed)
        assert got == want, f"{who}: (open step, results, rollouts, steps closed) {got} != {want}"
        beliefs = httpx.get(f"{url}/datasets/{name}/beliefs", params={"ids": ids}, timeout=30).json()
        rows = beliefs["beliefs"]
        assert [r["alpha"] for r in rows] == a.alpha.tolist(), f"{who}: alpha"
        assert [r["beta"] for r in rows] == a.beta.tolist(), f"{who}: beta"
        assert [r["observations"] for r in rows] == a.n_obs.tolist(), f"{who}: observations"
        prior = a.hmm_prior_of(np.arange(a.n)).astype(np.float64)  # never-observed prompts: 1/3
        assert np.array_equal(np.array([r["hmm_prior"] for r in rows]), prior), f"{who}: hmm_prior"
        got_batches = []
        for strategy, params, sel_seed in SELECTIONS:
            r = httpx.post(
                f"{url}/select",
                json={
                    "dataset": name,
                    "step": expected.open_step,
                    "batch_size": 2,
                    "strategy": strategy,
                    "params": params,
                    "seed": sel_seed,
                },
                timeout=30,
            )
            assert r.status_code == 200, f"{who}: {r.text}"
            got_batches.append(r.json()["prompt_ids"])
        assert got_batches == batches, f"{who}: batches differ from the model's"


@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_under_load_loses_and_doubles_nothing(redis_url, seed):
    rng = random.Random(seed)
    fleet = Fleet(redis_url, rng)
    try:
        name = f"k9-{seed}"
        spec = DatasetSpec(
            name=name, size=6, rollouts_per_prompt=2, hmm_decay=0.7, max_lag=rng.choice([0, 1])
        )
        r = httpx.post(
            f"{fleet.urls()[0]}/datasets",
            json={
                "name": name,
                "size": spec.size,
                "rollouts_per_prompt": 2,
                "hmm_decay": 0.7,
                "max_lag": spec.max_lag,
            },
            timeout=30,
        )
        assert r.status_code == 201, r.text
        model, lock = ReplicaModel(spec), threading.Lock()
        errors: list[BaseException] = []

        def guarded(*args) -> None:
            try:
                _client(*args)
            except BaseException as exc:  # re-raised in the test's thread below
                errors.append(exc)

        for phase in range(2):
            done = threading.Event()
            clients = [
                threading.Thread(
                    target=guarded,
                    args=(fleet, model, lock, name, random.Random(rng.random()), f"p{phase}c{c}", 25),
                )
                for c in range(3)
            ]
            killer_rng = random.Random(rng.random())

            def killer(done: threading.Event, krng: random.Random) -> None:
                while not done.wait(krng.uniform(0.3, 2.0)):
                    fleet.kill_one(krng)

            threads = [*clients, threading.Thread(target=killer, args=(done, killer_rng))]
            for t in threads:
                t.start()
            for t in clients:
                t.join()
            done.set()
            threads[-1].join()
            if errors:
                raise AssertionError(f"seed {seed} (replay: KILL9_SEEDS={seed}): {errors[0]}") from errors[0]
            _check(fleet, model, name, seed)
        assert fleet.kills >= 1, "the schedule killed no process"
    finally:
        fleet.stop()
