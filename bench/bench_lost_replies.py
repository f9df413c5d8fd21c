"""Answers under lost store replies (issue 22 item 6) and a select's open step under failing selects
(item 1): what a client that counts `applied` sees.

    python bench/bench_lost_replies.py [--loss 0.03,0.08] [--requests 1350] [--redis-url URL] [--code DIR]

Starts a service whose store connection goes through a proxy (tests/service/store_proxy.py) that loses
the reply of a share `loss` of the script calls (the command runs, the connection is closed before the
reply: the client library sends the command again on a fresh connection). A client sends `requests`
observes, each with a new request id, once; a 503 (the resend lost too) is sent again with the same id.
Counted: answers `applied: n, duplicate: false` (right), answers to a request sent once that say
`applied: 0, duplicate: true` (undercounted), 503s, and the ledger: the sum of `applied` answered
against the results the dataset holds. `--code DIR` runs the service from another checkout (its
`selector_service` package, e.g. an export of main) to compare before/after in one run.

The second part ("failing_selects"): a dataset whose default SEC tau is 5e-324, a select with
observations per step, then three default SEC selects at steps 1, 2 and 5 in a row; the open step after
each (before the fixes each answered 500 and still advanced it: 0 -> 1 -> 2 -> 5). The third
("injected_failures"): the same three selects on an in-process engine whose batch choice raises after
the close; the open step after each must stay 0.
Prints a JSON line last.
"""

from __future__ import annotations

import random
import sys
import urllib.parse
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import OUT_DIR, add_out, emit, parser
from tests.service.store_proxy import StoreProxy
from tests.utils import ServiceProcess, shared_redis_url

SIZE = 2000


def lost_replies(redis_url: str, loss: float, requests: int, code: Path, seed: int) -> dict:
    up = urllib.parse.urlparse(redis_url)
    proxy = StoreProxy(up.hostname or "127.0.0.1", up.port or 6379, loss=0.0, seed=seed)
    db = (up.path or "/0").lstrip("/") or "0"
    svc = ServiceProcess(
        redis_url=f"redis://127.0.0.1:{proxy.port}/{db}", env={"SELECTOR_STORE_TIMEOUT_S": "5"}
    )
    svc.cwd = str(code)
    svc.start()
    name = f"lost-{uuid.uuid4().hex[:8]}"
    rng = random.Random(seed)
    counts = {"right": 0, "undercounted": 0, "resent_after_503": 0, "other": 0}
    applied_sum = sent_results = resent_results = 0
    try:
        with httpx.Client(base_url=svc.url, timeout=60) as http:
            http.post("/datasets", json={"name": name, "size": SIZE}).raise_for_status()
            proxy.loss = loss
            for i in range(requests):
                results = [
                    {"prompt_id": pid, "successes": rng.randint(0, 8), "trials": 8}
                    for pid in rng.sample(range(SIZE), rng.randint(1, 8))
                ]
                body = {"dataset": name, "step": 0, "request_id": f"{name}-{i}", "results": results}
                sent_results += len(results)
                first = True
                for _ in range(20):
                    r = http.post("/observe", json=body)
                    if r.status_code != 503:
                        break
                    first = False
                r.raise_for_status()
                doc = r.json()
                applied_sum += doc["applied"]
                if not first:  # its first send's outcome unknown to the client: a duplicate counts it
                    counts["resent_after_503"] += 1
                    resent_results += len(results) if doc["duplicate"] else 0
                elif doc["applied"] == len(results) and not doc["duplicate"]:
                    counts["right"] += 1
                elif doc["applied"] == 0 and doc["duplicate"]:
                    counts["undercounted"] += 1
                else:
                    counts["other"] += 1
            proxy.loss = 0.0
            held = http.get(f"/datasets/{name}").json()["summary"]["observations"]
            http.delete(f"/datasets/{name}")
    finally:
        svc.stop()
        proxy.close()
    return {
        "loss": loss,
        "requests": requests,
        "replies_lost": proxy.lost,
        **counts,
        "applied_answered": applied_sum,
        "results_sent": sent_results,
        "results_held": held,
        "ledger_ok": applied_sum + resent_results == held,
    }


def failing_selects(redis_url: str, code: Path) -> dict:
    svc = ServiceProcess(redis_url=redis_url)
    svc.cwd = str(code)
    svc.start()
    name = f"tau-{uuid.uuid4().hex[:8]}"
    seq, statuses = [], []
    try:
        with httpx.Client(base_url=svc.url, timeout=60) as http:
            r = http.post("/datasets", json={"name": name, "size": 60, "defaults": {"sec": {"tau": 5e-324}}})
            r.raise_for_status()
            http.put(
                f"/datasets/{name}/metadata", json={"group": [i % 5 for i in range(60)]}
            ).raise_for_status()
            sel = {"dataset": name, "step": 0, "batch_size": 8, "strategy": "sec"}
            ids = http.post("/select", json=sel).json()["prompt_ids"]
            results = [{"prompt_id": i, "successes": i % 9, "trials": 8} for i in ids]
            http.post(
                "/observe", json={"dataset": name, "step": 0, "request_id": f"{name}-0", "results": results}
            )
            seq.append(http.get(f"/datasets/{name}").json()["summary"]["open_step"])
            for step in (1, 2, 5):
                statuses.append(http.post("/select", json=dict(sel, step=step)).status_code)
                seq.append(http.get(f"/datasets/{name}").json()["summary"]["open_step"])
            http.delete(f"/datasets/{name}")
    finally:
        svc.stop()
    return {"open_steps": seq, "statuses": statuses}


# Run in a child with the checkout under test as its working directory: three selects at steps 1, 2, 5
# whose batch choice raises (injected), on an in-process engine; the open step after each.
_INJECTED = """
import asyncio, json, sys, uuid
from selector_service.replication.engine import Engine
from selector_service.settings import Settings
from selector_service.dataset.state import DatasetSpec, DatasetState
from selector_service.storage.store import Store, connect

async def main(url):
    prefix = "inj" + uuid.uuid4().hex[:8]
    client = await connect(url, 5.0)
    eng = Engine(Store(client, prefix, 3600), Settings(redis_url=url, key_prefix=prefix))
    await eng.create_dataset(DatasetSpec(name="inj", size=50))
    def boom(self, *a, **k):
        raise RuntimeError("injected")
    DatasetState.select = boom
    seen = [int((await eng.store.read_meta("inj"))["open_step"])]
    for step in (1, 2, 5):
        try:
            await eng.select("inj", step=step, batch_size=4, strategy="dps", params={}, seed=0)
        except RuntimeError:
            pass
        seen.append(int((await eng.store.read_meta("inj"))["open_step"]))
    await eng.delete_dataset("inj")
    await client.aclose()
    print(json.dumps(seen))

asyncio.run(main(sys.argv[1]))
"""


def injected_failures(redis_url: str, code: Path) -> list[int]:
    import json
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", _INJECTED, redis_url], cwd=code, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--loss", default="0.03,0.08", help="shares of lost script replies, comma-separated")
    ap.add_argument("--requests", type=int, default=1350, help="observes per loss rate")
    ap.add_argument("--redis-url", default=None, help="the Redis behind the proxy (default: the shared one)")
    ap.add_argument(
        "--code", type=Path, default=Path(__file__).resolve().parents[1], help="checkout to serve"
    )
    ap.add_argument("--seed", type=int, default=1)
    add_out(ap, OUT_DIR / "lost_replies.json")
    args = ap.parse_args()
    url = args.redis_url or shared_redis_url()
    runs = [lost_replies(url, float(x), args.requests, args.code, args.seed) for x in args.loss.split(",")]
    for run in runs:
        print(
            f"loss {run['loss']:.0%}: {run['undercounted']}/{run['requests']} undercounted, "
            f"{run['right']} right, {run['resent_after_503']} resent after a 503, "
            f"replies lost {run['replies_lost']}, applied answered {run['applied_answered']} "
            f"of {run['results_held']} held"
        )
    fails = failing_selects(url, args.code)
    print(
        f"failing selects: open step {' -> '.join(map(str, fails['open_steps']))}, answers {fails['statuses']}"
    )
    injected = injected_failures(url, args.code)
    print(f"selects failing after their close (injected): open step {' -> '.join(map(str, injected))}")
    emit(
        {
            "code": str(args.code),
            "lost_replies": runs,
            "failing_selects": fails,
            "injected_failures": injected,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
