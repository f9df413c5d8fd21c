"""Cold start through the real service (docs/methods.md §6, docs/api.md PUT /datasets/{name}/metadata) and the strategies
of docs/methods.md §7: uploads in JSON and raw form, 422s that apply nothing, replicas that agree after an
upload, snapshots and exports that carry it, per-group gauges, and the typed client's upload."""

from __future__ import annotations

import math
import struct
import time

import httpx
import numpy as np
import pytest
import redis

from rlvr_selector_client.client import InvalidRequest, SelectorClient
from tests.utils import ServiceProcess

N = 60
RATES = [None if i % 4 == 0 else round((i % 10) / 10, 2) for i in range(N)]
GROUPS = [i % 5 if i % 7 else -1 for i in range(N)]
SAMPLES = [None if i % 3 == 0 else 8 + i for i in range(N)]


def make(http, name, **kw):
    r = http.post("/datasets", json={"name": name, "size": N, **kw})
    assert r.status_code == 201, r.text
    return r.json()


def beliefs(http, name, ids=range(N)):
    r = http.get(f"/datasets/{name}/beliefs", params={"ids": ",".join(map(str, ids))})
    assert r.status_code == 200, r.text
    return r.json()["beliefs"]


def upload(http, name, **body):
    return http.put(f"/datasets/{name}/metadata", json=body)


def state(url, name):
    """Everything a replica reports about a dataset that metadata and observations can change."""
    with httpx.Client(base_url=url, timeout=60) as c:
        info = c.get(f"/datasets/{name}").json()
        rows = c.get(f"/datasets/{name}/beliefs", params={"ids": ",".join(map(str, range(N)))}).json()
        picks = {
            strategy: c.post(
                "/select",
                json={"dataset": name, "step": info["summary"]["open_step"], "batch_size": 8, "strategy": strategy,
                      "seed": 5, "return_scores": True},
            ).json()
            for strategy in ("insight", "learnability", "adarft", "sec", "greso", "mopps", "filter")
        }  # fmt: skip
        for strategy in ("insight", "uniform", "dps"):  # a select's filter, re-checks included
            picks[f"{strategy} filtered"] = c.post(
                "/select",
                json={"dataset": name, "step": info["summary"]["open_step"], "batch_size": 8, "strategy": strategy,
                      "seed": 5, "return_scores": True, "filter": {"solved": 0.4, "recheck": 0.25}},
            ).json()  # fmt: skip
        history = c.get(f"/datasets/{name}/history").json()
    return info["summary"], rows, picks, history


def test_upload_sets_priors_coverage_and_beliefs(http, dsname):
    info = make(http, dsname, prior_strength=4.0, group_decay=0.5)
    assert info["prior_strength"] == 4.0 and info["group_decay"] == 0.5
    r = upload(http, dsname, offset=0, pass_rate=RATES, group=GROUPS)
    assert r.status_code == 200, r.text
    known, grouped = sum(x is not None for x in RATES), sum(g >= 0 for g in GROUPS)
    assert r.json() == {
        "dataset": dsname,
        "offset": 0,
        "count": N,
        "coverage": {
            "prompts_with_pass_rate": known,
            "prompts_with_group": grouped,
            "groups": 5,
            "prompts_with_pass_samples": 0,
        },
        "profile_rollouts": 0,
    }
    summary = http.get(f"/datasets/{dsname}").json()["summary"]
    assert (summary["prompts_with_pass_rate"], summary["prompts_with_group"], summary["groups"]) == (
        known,
        grouped,
        5,
    )
    rows = beliefs(http, dsname)
    for row, rate, group in zip(rows, RATES, GROUPS, strict=True):
        assert row["group"] == group and row["observations"] == 0
        if rate is not None:  # a cold prior Beta(1 + 4 p, 1 + 4 (1 - p)), p stored as float32
            p = float(np.float32(rate))
            assert row["prior_pass_rate"] == pytest.approx(p, abs=1e-7)
            assert (row["alpha"], row["beta"]) == pytest.approx((1 + 4 * p, 1 + 4 * (1 - p)))
        elif group >= 0:  # the group rate, 1/2 before any observation
            assert row["prior_pass_rate"] == 0.5 and (row["alpha"], row["beta"]) == (3.0, 3.0)
        else:
            assert row["prior_pass_rate"] is None and (row["alpha"], row["beta"]) == (1.0, 1.0)
    # An observation of a grouped prompt without a pass rate moves its group's rate for the others.
    group_prompt = next(i for i in range(N) if RATES[i] is None and GROUPS[i] >= 0)
    ack = http.post(
        "/observe",
        json={"dataset": dsname, "step": 0, "request_id": f"{dsname}-0",
              "results": [{"prompt_id": group_prompt, "successes": 8, "trials": 8}]},
    )  # fmt: skip
    assert ack.status_code == 200, ack.text
    rows = beliefs(http, dsname)
    observed = rows[group_prompt]
    assert observed["prior_pass_rate"] == 0.5 and (observed["alpha"], observed["beta"]) == (3.0 + 8, 3.0)
    g = GROUPS[group_prompt]
    rate = (1 + 8) / (2 + 8)
    for i, row in enumerate(rows):
        if i != group_prompt and GROUPS[i] == g and RATES[i] is None:
            assert row["prior_pass_rate"] == pytest.approx(rate)


def test_raw_uploads_equal_json_uploads(http, dsname):
    other = f"{dsname}-raw"
    make(http, dsname)
    make(http, other)
    assert upload(http, dsname, offset=10, pass_rate=RATES[:30], group=GROUPS[:30]).status_code == 200
    rates = struct.pack("<30f", *[math.nan if r is None else r for r in RATES[:30]])
    groups = struct.pack("<30i", *GROUPS[:30])
    headers = {"Content-Type": "application/octet-stream"}
    r = http.put(
        f"/datasets/{other}/metadata/pass_rate", params={"offset": 10}, content=rates, headers=headers
    )
    assert r.status_code == 200 and r.json()["count"] == 30, r.text
    r = http.put(f"/datasets/{other}/metadata/group", params={"offset": 10}, content=groups, headers=headers)
    assert r.status_code == 200, r.text
    strip = [{k: v for k, v in row.items() if k != "prompt_id"} for row in beliefs(http, dsname)]
    assert strip == [{k: v for k, v in row.items() if k != "prompt_id"} for row in beliefs(http, other)]
    assert (
        beliefs(http, dsname, [9])[0]["group"] == -1 and beliefs(http, dsname, [10])[0]["group"] == GROUPS[0]
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"offset": 0, "pass_rate": [0.5, 1.5]}, "pass_rate.1"),
        ({"offset": 0, "pass_rate": [-0.1]}, "pass_rate.0"),
        ({"offset": 0, "group": [65536]}, "group.0"),
        ({"offset": 0, "group": [-2]}, "group.0"),
        ({"offset": 0, "group": [1.5]}, "group.0"),
        ({"offset": 0, "pass_rate": [0.5, 0.5], "group": [1]}, "one per prompt"),
        ({"offset": N - 1, "pass_rate": [0.5, 0.5]}, "runs past"),
        ({"offset": -1, "pass_rate": [0.5]}, "offset"),
        ({"offset": 0}, "send pass_rate, pass_samples, group, or several of them"),
        ({"offset": 0, "pass_rate": []}, "empty"),
        ({"offset": 0, "pass_rate": ["0.5"]}, "pass_rate.0"),
        ({"offset": 0, "pass_rate": [0.5], "extra": 1}, "extra"),
        ({"offset": 0, "pass_samples": [8, 0]}, "pass_samples.1"),
        ({"offset": 0, "pass_samples": [1.5]}, "pass_samples.0"),
        ({"offset": 0, "pass_samples": [-1]}, "pass_samples.0"),
        ({"offset": 0, "pass_samples": [1_000_001]}, "pass_samples.0"),
        ({"offset": 0, "pass_samples": ["8"]}, "pass_samples.0"),
        ({"offset": 0, "pass_rate": [0.5], "pass_samples": [8, 8]}, "one per prompt"),
        ({"offset": 0, "pass_rate": [0.5, 0.5], "group": [1, 1], "pass_samples": [8]}, "one per prompt"),
        ({"offset": 0, "pass_rate": [0.5], "profile": True}, "profile is true but pass_samples is missing"),
        ({"offset": 0, "pass_samples": [8], "profile": "yes"}, "profile"),
        ({"offset": 0, "pass_samples": [8], "profile": 1}, "profile"),
        ({"offset": N - 1, "pass_samples": [8, 8], "profile": True}, "runs past"),
    ],
)
def test_bad_uploads_are_422_and_apply_nothing(http, dsname, body, message):
    make(http, dsname)
    first = upload(http, dsname, offset=0, pass_rate=RATES, group=GROUPS, pass_samples=SAMPLES, profile=True)
    assert first.status_code == 200 and first.json()["profile_rollouts"] > 0
    before_rows, before = beliefs(http, dsname), http.get(f"/datasets/{dsname}").json()["summary"]
    r = upload(http, dsname, **body)
    assert r.status_code == 422 and message in r.json()["detail"], r.text
    assert beliefs(http, dsname) == before_rows
    assert http.get(f"/datasets/{dsname}").json()["summary"] == before


@pytest.mark.parametrize(
    ("field", "content", "offset", "message"),
    [
        ("pass_rate", struct.pack("<2f", 0.5, 2.0), 0, "pass_rate[1] = 2.0: pass rates"),
        ("pass_rate", struct.pack("<f", math.inf), 0, "pass_rate[0]"),
        ("group", struct.pack("<i", 70000), 0, "group[0]"),
        ("group", b"\x01\x02\x03", 0, "4 bytes per prompt"),
        ("group", b"", 0, "4 bytes per prompt"),
        ("group", struct.pack("<2i", 1, 2), N - 1, "runs past"),
        ("pass_samples", struct.pack("<2i", 8, 0), 0, "pass_samples[1] = 0: a sample count"),
        ("pass_samples", struct.pack("<i", -2), 0, "pass_samples[0] = -2"),
        ("pass_samples", struct.pack("<i", 1_000_001), 0, "pass_samples[0] = 1000001"),
    ],
)
def test_bad_raw_uploads_are_422_and_apply_nothing(http, dsname, field, content, offset, message):
    make(http, dsname)
    before = http.get(f"/datasets/{dsname}").json()["summary"]
    r = http.put(f"/datasets/{dsname}/metadata/{field}", params={"offset": offset}, content=content)
    assert r.status_code == 422 and message in r.json()["detail"], r.text
    assert http.get(f"/datasets/{dsname}").json()["summary"] == before
    assert http.put(f"/datasets/{dsname}/metadata/weights", content=b"\0" * 4).status_code == 422
    # A JSON body sent to the raw route: its bytes would read as tiny float32 pass rates inside [0, 1].
    as_json = http.put(f"/datasets/{dsname}/metadata/pass_rate", json=[0.5, 0.25, 0.125, 1.0])
    assert as_json.status_code == 422 and "PUT /datasets/" in as_json.json()["detail"], as_json.text
    assert http.get(f"/datasets/{dsname}").json()["summary"] == before
    assert http.put("/datasets/nope-missing/metadata", json={"pass_rate": [0.5]}).status_code == 404
    # profile counts sample counts: with another array it is refused, whatever the body holds.
    wrong = http.put(f"/datasets/{dsname}/metadata/pass_rate", params={"profile": "true"}, content=b"\0" * 4)
    assert wrong.status_code == 422 and "metadata/pass_samples" in wrong.json()["detail"], wrong.text
    assert http.get(f"/datasets/{dsname}").json()["summary"] == before


def test_spec_fields_are_checked_and_their_defaults_are_the_same_spec(http, dsname):
    assert http.post("/datasets", json={"name": dsname, "size": 5, "prior_strength": -1}).status_code == 422
    assert http.post("/datasets", json={"name": dsname, "size": 5, "group_decay": 0}).status_code == 422
    assert http.post("/datasets", json={"name": dsname, "size": 5, "prior_strength": 2e6}).status_code == 422
    make(http, dsname)
    # The defaults are the same spec: 200, not 409 (and an explicit other value is another spec).
    again = http.post(
        "/datasets", json={"name": dsname, "size": N, "prior_strength": 2.0, "group_decay": 0.9}
    )
    assert again.status_code == 200
    assert http.post("/datasets", json={"name": dsname, "size": N, "group_decay": 0.5}).status_code == 409


def test_sec_needs_groups_and_dataset_level_params_are_the_datasets(http, dsname):
    make(http, dsname, defaults={"sec": {"lr": 0.4}, "adarft": {"eta": 30}})
    body = {"dataset": dsname, "step": 0, "batch_size": 4, "strategy": "sec"}
    r = http.post("/select", json=body)
    assert r.status_code == 422 and "upload groups" in r.json()["detail"], r.text
    assert http.get(f"/datasets/{dsname}").json()["summary"]["open_step"] == 0
    r = http.post("/select", json=dict(body, step=3))
    assert r.status_code == 422 and http.get(f"/datasets/{dsname}").json()["summary"]["open_step"] == 0
    assert upload(http, dsname, group=[0, 1, 2] + [-1] * (N - 3)).status_code == 200
    assert http.post("/select", json=dict(body, batch_size=4)).status_code == 422  # 3 grouped prompts
    r = http.post("/select", json=dict(body, batch_size=3))
    assert r.status_code == 200 and sorted(r.json()["prompt_ids"]) == [0, 1, 2], r.text
    assert (
        http.post("/select", json=dict(body, batch_size=3, params={"lr": 0.4, "tau": 0.2})).status_code == 200
    )
    r = http.post("/select", json=dict(body, batch_size=3, params={"lr": 0.5}))
    assert r.status_code == 422 and "differs from the dataset's 0.4" in r.json()["detail"]
    r = http.post("/select", json={"dataset": dsname, "step": 0, "batch_size": 3, "strategy": "adarft",
                                   "params": {"eta": 50}})  # fmt: skip
    assert r.status_code == 422 and "eta" in r.json()["detail"]
    r = http.post("/score", json={"dataset": dsname, "strategy": "sec", "prompt_ids": [0]})
    assert r.status_code == 422
    bad = http.post("/datasets", json={"name": f"{dsname}-x", "size": 5, "defaults": {"sec": {"lr": 2}}})
    assert bad.status_code == 422 and "lr" in bad.json()["detail"]


def test_every_strategy_serves_a_dataset_with_metadata(http, dsname):
    make(http, dsname)
    assert upload(http, dsname, pass_rate=RATES, group=GROUPS).status_code == 200
    rng = np.random.default_rng(0)
    for step in range(4):
        for strategy in ("insight", "learnability", "adarft", "greso", "sec", "mopps", "dps", "uniform"):
            r = http.post("/select", json={"dataset": dsname, "step": step, "batch_size": 8,
                                           "strategy": strategy, "seed": 1})  # fmt: skip
            assert r.status_code == 200, (strategy, r.text)
            ids = r.json()["prompt_ids"]
            assert len(set(ids)) == 8
        results = [{"prompt_id": i, "successes": int(rng.integers(0, 9)), "trials": 8} for i in ids]
        ack = http.post("/observe", json={"dataset": dsname, "step": step, "request_id": f"{dsname}-{step}",
                                          "results": results})  # fmt: skip
        assert ack.status_code == 200, ack.text


def test_two_replicas_agree_after_a_metadata_upload(redis_url, dsname):
    a = ServiceProcess(redis_url=redis_url).start()
    b = ServiceProcess(redis_url=redis_url, prefix=a.prefix).start()
    try:
        httpx.post(f"{a.url}/datasets", json={"name": dsname, "size": N}).raise_for_status()
        rng = np.random.default_rng(3)
        for step in range(6):
            writer, reader = (a, b) if step % 2 else (b, a)
            # Uploads interleaved with observations, through either replica: all apply in log order.
            if step in (1, 3):
                rates = [None if x < 0.3 else round(float(x), 3) for x in rng.random(N // 2)]
                body = {
                    "offset": step * 5,
                    "pass_rate": rates,
                    "group": [int(g) for g in rng.integers(-1, 4, N // 2)],
                    "pass_samples": [None if x < 0.2 else int(x * 40) + 1 for x in rng.random(N // 2)],
                    "profile": step == 1,
                }
                httpx.put(f"{writer.url}/datasets/{dsname}/metadata", json=body).raise_for_status()
            if step == 4:  # raw sample counts of a profiling pass, through the other route
                counts = struct.pack("<10i", *[8] * 9, -1)
                httpx.put(f"{writer.url}/datasets/{dsname}/metadata/pass_samples", content=counts,
                          params={"offset": 40, "profile": "true"}).raise_for_status()  # fmt: skip
            sel = httpx.post(f"{reader.url}/select", json={"dataset": dsname, "step": step, "batch_size": 8,
                                                          "strategy": "insight", "seed": step}).json()  # fmt: skip
            results = [
                {"prompt_id": p, "successes": int(rng.integers(0, 9)), "trials": 8} for p in sel["prompt_ids"]
            ]
            httpx.post(f"{writer.url}/observe", json={"dataset": dsname, "step": step, "request_id": f"r{step}",
                                                      "results": results}).raise_for_status()  # fmt: skip
            assert state(a.url, dsname) == state(b.url, dsname)
        assert state(a.url, dsname)[0]["profile_rollouts"] > 0
        # A fresh replica starting after all of it (from the log) agrees too.
        c = ServiceProcess(redis_url=redis_url, prefix=a.prefix).start()
        try:
            assert state(c.url, dsname) == state(a.url, dsname)
        finally:
            c.stop()
    finally:
        a.stop()
        b.stop()


def test_snapshots_and_exports_carry_metadata_and_shared_state(redis_url, dsname):
    svc = ServiceProcess(redis_url=redis_url, env={"SELECTOR_SNAPSHOT_EVERY_RECORDS": "3"}).start()
    try:
        base = svc.url
        httpx.post(
            f"{base}/datasets", json={"name": dsname, "size": N, "group_decay": 0.7}
        ).raise_for_status()
        httpx.put(
            f"{base}/datasets/{dsname}/metadata",
            json={"pass_rate": RATES, "group": GROUPS, "pass_samples": SAMPLES, "profile": True},
        ).raise_for_status()
        for step in range(5):
            sel = httpx.post(f"{base}/select", json={"dataset": dsname, "step": step, "batch_size": 6,
                                                     "strategy": "sec", "seed": 0}).json()  # fmt: skip
            results = [
                {"prompt_id": p, "successes": (p * 3 + step) % 9, "trials": 8} for p in sel["prompt_ids"]
            ]
            httpx.post(f"{base}/observe", json={"dataset": dsname, "step": step, "request_id": f"x{step}",
                                                "results": results}).raise_for_status()  # fmt: skip
        before = state(base, dsname)
        meta = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 30
        while not meta.hget(f"{svc.prefix}:v1:{{{dsname}}}:meta", "snap") and time.monotonic() < deadline:
            time.sleep(0.2)  # snapshots are written in the background
        assert meta.hget(f"{svc.prefix}:v1:{{{dsname}}}:meta", "snap"), "no snapshot was written"
        blob = httpx.get(f"{base}/datasets/{dsname}/export").content
        r = httpx.post(f"{base}/datasets/{dsname}-copy/import", content=blob)
        assert r.status_code == 201, r.text
        copy = state(base, f"{dsname}-copy")
        assert copy[0] == before[0] and copy[1] == before[1]  # selections are keyed by the name
        assert copy[3]["rows"] == before[3]["rows"] and before[0]["profile_rollouts"] > 0
        svc.kill()
        again = ServiceProcess(redis_url=redis_url, prefix=svc.prefix).start()
        try:
            assert state(again.url, dsname) == before  # from the snapshot (every 3 records) and the log
        finally:
            again.stop()
    finally:
        svc.kill()


def test_per_group_gauges_follow_the_label_limit(redis_url, dsname):
    svc = ServiceProcess(redis_url=redis_url, env={"SELECTOR_MAX_GROUP_LABELS": "5"}).start()
    try:
        few, many = dsname, f"{dsname}-many"
        for name, groups in ((few, GROUPS), (many, [i % 6 for i in range(N)])):
            httpx.post(f"{svc.url}/datasets", json={"name": name, "size": N}).raise_for_status()
            httpx.put(f"{svc.url}/datasets/{name}/metadata", json={"group": groups}).raise_for_status()
        text = httpx.get(f"{svc.url}/metrics").text
        for metric in (
            "selector_group_posterior_mean",
            "selector_group_observed_share",
            "selector_group_rate",
        ):
            lines = [line for line in text.splitlines() if line.startswith(metric + "{")]
            assert {f'group="{g}"' in " ".join(lines) for g in range(5)} == {True}
            assert all(f'dataset="{few}"' in line for line in lines), lines  # 6 groups > 5: no labels
        assert f'selector_group_rate{{dataset="{few}",group="0"}} 0.5' in text
        assert f'selector_group_observed_share{{dataset="{few}",group="2"}} 0.0' in text
    finally:
        svc.stop()


def test_the_client_uploads_json_and_raw(service, dsname):
    with SelectorClient(service.url) as client:
        client.create_dataset(dsname, N, prior_strength=3.0)
        ack = client.upload_metadata(dsname, pass_rate=RATES, group=GROUPS)
        assert (ack.count, ack.prompts_with_group, ack.groups) == (N, sum(g >= 0 for g in GROUPS), 5)
        json_rows = client.beliefs(dsname, range(N)).beliefs
        ack = client.upload_metadata(dsname, pass_rate=RATES, group=GROUPS, raw=True)
        assert ack.offset == 0 and client.beliefs(dsname, range(N)).beliefs == json_rows
        info = client.get_dataset(dsname)
        assert (
            info.prior_strength == 3.0
            and info.groups == 5
            and info.prompts_with_pass_rate == ack.prompts_with_pass_rate
        )
        assert json_rows[1].group == GROUPS[1] and json_rows[1].prior_pass_rate == pytest.approx(RATES[1])
        with pytest.raises(InvalidRequest, match="runs past"):
            client.upload_metadata(dsname, group=[1, 2], offset=N - 1)


@pytest.mark.parametrize("tau", [5e-324, 1e-320, 1e-310])
def test_sec_with_the_smallest_tau_selects_after_steps_with_observations(http, dsname, tau):
    """A tau anywhere in (0, 1e6], here as the dataset's default, selects once Q is learnt (it used to
    answer 500 from the first select after a closed step with observations, and still advance the step)."""
    make(http, dsname, defaults={"sec": {"tau": tau}})
    assert upload(http, dsname, group=GROUPS).status_code == 200
    for step in range(4):
        r = http.post("/select", json={"dataset": dsname, "step": step, "batch_size": 8, "strategy": "sec"})
        assert r.status_code == 200, r.text
        ids = r.json()["prompt_ids"]
        assert len(set(ids)) == 8 and all(GROUPS[i] >= 0 for i in ids)
        results = [{"prompt_id": i, "successes": (i * 3) % 9, "trials": 8} for i in ids]
        ack = http.post("/observe", json={"dataset": dsname, "step": step, "request_id": f"{dsname}-{step}",
                                          "results": results})  # fmt: skip
        assert ack.status_code == 200, ack.text
    assert http.get(f"/datasets/{dsname}").json()["summary"]["open_step"] == 3
