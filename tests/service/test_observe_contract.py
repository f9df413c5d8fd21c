"""The observe contract's edges through a real service: request ids bound to one body, late
observations within max_lag, whole-file checks on imports, strict id lists."""

from __future__ import annotations

import pytest


def make(http, name, **kw):
    r = http.post("/datasets", json={"name": name, "size": 10, "rollouts_per_prompt": 2, **kw})
    assert r.status_code == 201, r.text


def observe(http, name, step, rid, results):
    return http.post("/observe", json={"dataset": name, "step": step, "request_id": rid, "results": results})


def summary(http, name):
    return http.get(f"/datasets/{name}").json()["summary"]


def test_a_request_id_names_one_body(http, dsname):
    make(http, dsname)
    first = [{"prompt_id": 1, "rewards": [1, 0]}]
    rid = f"{dsname}-shared"
    assert observe(http, dsname, 0, rid, first).json() == {"applied": 1, "duplicate": False, "lag": 0}
    # the identical retry (1 and 1.0 are the same number) is a duplicate
    same = [{"prompt_id": 1, "rewards": [1.0, 0.0]}]
    assert observe(http, dsname, 0, rid, same).json() == {"applied": 0, "duplicate": True, "lag": 0}
    # another prompt, other rewards, the same outcome as counts, another step: 409, nothing applied
    for other_step, other in [
        (0, [{"prompt_id": 3, "rewards": [1, 0]}]),
        (0, [{"prompt_id": 1, "rewards": [0, 1]}]),
        (0, [{"prompt_id": 1, "successes": 1, "trials": 2}]),
        (0, [*first, {"prompt_id": 2, "rewards": [1, 1]}]),
        (1, first),
    ]:
        r = observe(http, dsname, other_step, rid, other)
        assert r.status_code == 409, r.text
        assert "different body" in r.json()["detail"]
    s = summary(http, dsname)
    assert (s["observations"], s["open_step"]) == (1, 0)
    # another dataset: 409 too, and nothing applied there
    other_ds = f"{dsname}-b"
    make(http, other_ds)
    r = observe(http, other_ds, 0, rid, first)
    assert r.status_code == 409 and dsname in r.json()["detail"], r.text
    assert summary(http, other_ds)["observations"] == 0


def test_late_observations_within_max_lag(http, dsname):
    make(http, dsname, max_lag=2, hmm_decay=0.5)
    ontime = f"{dsname}-ontime"
    make(http, ontime, hmm_decay=0.5)
    for name in (dsname, ontime):
        assert http.post("/select", json={"dataset": name, "step": 3, "batch_size": 2}).status_code == 200
    # step 2 and step 1 are late by 1 and 2: applied, answered with their lag
    late1 = observe(http, dsname, 2, f"{dsname}-l1", [{"prompt_id": 4, "rewards": [1, 0]}])
    assert late1.json() == {"applied": 1, "duplicate": False, "lag": 1}
    late2 = observe(http, dsname, 1, f"{dsname}-l2", [{"prompt_id": 5, "rewards": [1, 1]}])
    assert late2.json() == {"applied": 1, "duplicate": False, "lag": 2}
    # a retry answers the first call's lag
    again = observe(http, dsname, 2, f"{dsname}-l1", [{"prompt_id": 4, "rewards": [1, 0]}])
    assert again.json() == {"applied": 0, "duplicate": True, "lag": 1}
    # older than max_lag: 409 that says how late is accepted
    r = observe(http, dsname, 0, f"{dsname}-l3", [{"prompt_id": 6, "rewards": [1, 0]}])
    assert r.status_code == 409 and "2 steps late" in r.json()["detail"], r.text
    # the strict dataset refuses the same late result
    r = observe(http, ontime, 2, f"{ontime}-l1", [{"prompt_id": 4, "rewards": [1, 0]}])
    assert r.status_code == 409, r.text
    # Beta at once; DPS as if observed at the open step: the strict dataset gets the same results on time
    observe(http, ontime, 3, f"{ontime}-a", [{"prompt_id": 4, "rewards": [1, 0]}]).raise_for_status()
    observe(http, ontime, 3, f"{ontime}-b", [{"prompt_id": 5, "rewards": [1, 1]}]).raise_for_status()
    ids = {"ids": "4,5,6"}
    late_b = http.get(f"/datasets/{dsname}/beliefs", params=ids).json()["beliefs"]
    ontime_b = http.get(f"/datasets/{ontime}/beliefs", params=ids).json()["beliefs"]
    assert [(b["alpha"], b["beta"]) for b in late_b] == [(2.0, 2.0), (3.0, 1.0), (1.0, 1.0)]
    assert [(b["alpha"], b["beta"]) for b in late_b] == [(b["alpha"], b["beta"]) for b in ontime_b]
    for name in (dsname, ontime):
        assert http.post("/select", json={"dataset": name, "step": 4, "batch_size": 2}).status_code == 200
    late_b = http.get(f"/datasets/{dsname}/beliefs", params=ids).json()["beliefs"]
    ontime_b = http.get(f"/datasets/{ontime}/beliefs", params=ids).json()["beliefs"]
    assert [b["hmm_prior"] for b in late_b] == [b["hmm_prior"] for b in ontime_b]
    assert late_b[0]["hmm_prior"] != late_b[2]["hmm_prior"]  # the late result did move DPS
    # metrics count results by lag
    text = http.get("/metrics").text
    for lag, count in (("0", 0), ("1", 1), ("2", 1)):
        line = f'selector_dataset_results_by_lag_total{{dataset="{dsname}",lag="{lag}"}} {float(count)}'
        assert (line in text) == (count > 0), line


@pytest.mark.parametrize("max_lag", [-1, 1001, 1.5, "1"])
def test_max_lag_out_of_domain_is_422(http, dsname, max_lag):
    r = http.post("/datasets", json={"name": dsname, "size": 5, "max_lag": max_lag})
    assert r.status_code == 422, r.text


def test_spec_without_max_lag_is_the_same_spec(http, dsname):
    make(http, dsname)
    again = http.post("/datasets", json={"name": dsname, "size": 10, "rollouts_per_prompt": 2, "max_lag": 0})
    assert again.status_code == 200, again.text
    other = http.post("/datasets", json={"name": dsname, "size": 10, "rollouts_per_prompt": 2, "max_lag": 1})
    assert other.status_code == 409, other.text


def test_a_truncated_or_extended_export_is_refused(http, dsname):
    make(http, dsname)
    observe(http, dsname, 0, f"{dsname}-e", [{"prompt_id": 1, "rewards": [1, 0]}]).raise_for_status()
    blob = http.get(f"/datasets/{dsname}/export").content
    for cut in (1, 2, 3, 4, 17):
        r = http.post(f"/datasets/{dsname}-c{cut}/import", content=blob[:-cut])
        assert r.status_code == 422, (cut, r.text)
        assert http.get(f"/datasets/{dsname}-c{cut}").status_code == 404
    r = http.post(f"/datasets/{dsname}-x/import", content=blob + b"\0")
    assert r.status_code == 422 and "trailing" in r.json()["detail"], r.text
    r = http.post(f"/datasets/{dsname}-ok/import", content=blob)
    assert r.status_code == 201, r.text


@pytest.mark.parametrize(
    "ids", ["1,,2", "1,2,", ",1", "", " ", "1;2", "0x1", "1_0", "+1", "\u0661", " 1", "1.0"]
)
def test_malformed_id_lists_are_422(http, dsname, ids):
    make(http, dsname)
    r = http.get(f"/datasets/{dsname}/beliefs", params={"ids": ids})
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("value", [" 1", "1 ", "1_0", "+1", "\u0661", "1.0", "0x1", "1e1", ""])
@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/datasets/{}/history", "since"),
        ("/datasets/{}/history", "limit"),
        ("/datasets/{}/metadata/group", "offset"),
    ],
)
def test_integer_query_parameters_are_digits_only(http, dsname, path, param, value):
    """An integer in a query string is ASCII digits, as the ids of /beliefs are: ` 1` or `1_0` is a 422
    naming the parameter, never read as 1 or 10, and nothing is applied."""
    make(http, dsname)
    url = path.format(dsname)
    if param == "offset":
        body, kind = (3).to_bytes(4, "little"), {"content-type": "application/octet-stream"}
        r = http.put(url, params={param: value}, content=body, headers=kind)
    else:
        r = http.get(url, params={param: value})
    assert r.status_code == 422 and param in r.json()["detail"], r.text
    assert http.get(f"/datasets/{dsname}").json()["summary"]["groups"] == 0


def test_ids_given_twice_are_422(http, dsname):
    make(http, dsname)
    r = http.get(f"/datasets/{dsname}/beliefs", params=[("ids", "1"), ("ids", "2")])
    assert r.status_code == 422 and "once" in r.json()["detail"], r.text


def test_a_spec_conflict_names_the_stored_spec_in_full(http, dsname):
    make(http, dsname, max_lag=2, success_threshold=0.0)
    # -0.0 is the same threshold as 0.0
    same = http.post(
        "/datasets",
        json={"name": dsname, "size": 10, "rollouts_per_prompt": 2, "max_lag": 2, "success_threshold": -0.0},
    )
    assert same.status_code == 200, same.text
    r = http.post(
        "/datasets", json={"name": dsname, "size": 10, "rollouts_per_prompt": 2, "success_threshold": 0.0}
    )
    assert r.status_code == 409 and '"max_lag": 2' in r.json()["detail"], r.text


def test_a_refused_observe_leaves_its_request_id_unclaimed(http, dsname):
    """An observe refused for its step (closed: 409, too far ahead: 422) or its dataset (deleted: 404)
    applies nothing and binds nothing: its request id is free for any dataset afterwards."""
    make(http, dsname)
    other = f"{dsname}-other"
    make(http, other)
    assert http.post("/select", json={"dataset": dsname, "step": 2, "batch_size": 2}).status_code == 200
    gone = f"{dsname}-gone"
    make(http, gone)
    assert http.delete(f"/datasets/{gone}").status_code == 204
    result = [{"prompt_id": 1, "rewards": [1, 0]}]
    for rid, name, step, status in [
        (f"{dsname}-closed", dsname, 0, 409),
        (f"{dsname}-ahead", dsname, 10**9, 422),
        (f"{dsname}-deleted", gone, 0, 404),
    ]:
        r = observe(http, name, step, rid, result)
        assert r.status_code == status, r.text
        # the same id, now for another dataset: applied, not "already used for dataset ..."
        r = observe(http, other, 0, rid, result)
        assert r.json() == {"applied": 1, "duplicate": False, "lag": 0}, r.text
    assert summary(http, dsname)["observations"] == 0
    assert summary(http, other)["observations"] == 3


def test_selected_step_files_a_late_group_at_the_open_step(http, dsname):
    """A group reported with the step it was selected at (`selected_step`) is never refused for coming
    late: past max_lag it is filed at the open step, its lag counted from `selected_step`; a retry is a
    duplicate with the same lag, the same id with another selected_step a 409, and the history, the
    export and its import count it once, as late by that lag."""
    make(http, dsname, max_lag=1)
    assert http.post("/select", json={"dataset": dsname, "step": 5, "batch_size": 2}).status_code == 200
    group = [{"prompt_id": 1, "rewards": [1, 0]}]

    def late(rid, step, selected):
        body = {
            "dataset": dsname,
            "step": step,
            "request_id": rid,
            "results": group,
            "selected_step": selected,
        }
        return http.post("/observe", json=body)

    assert observe(http, dsname, 2, f"{dsname}-a", group).status_code == 409  # as before
    r = late(f"{dsname}-a", 2, 2)
    assert r.status_code == 200 and r.json() == {"applied": 1, "duplicate": False, "lag": 3}, r.text
    assert late(f"{dsname}-a", 2, 2).json() == {"applied": 0, "duplicate": True, "lag": 3}
    r = late(f"{dsname}-a", 2, 1)
    assert r.status_code == 409 and "different body" in r.json()["detail"], r.text
    r = late(f"{dsname}-b", 2, 3)
    assert r.status_code == 422 and "selected_step" in r.json()["detail"], r.text
    r = late(f"{dsname}-c", 4, 0)  # within max_lag: filed at its step, late by 5 from its selection
    assert r.json() == {"applied": 1, "duplicate": False, "lag": 5}, r.text
    assert late(f"{dsname}-d", 5, 5).json()["lag"] == 0
    assert summary(http, dsname)["observations"] == 3
    assert http.post("/select", json={"dataset": dsname, "step": 6, "batch_size": 2}).status_code == 200
    (row,) = http.get(f"/datasets/{dsname}/history", params={"since": 5}).json()["rows"]
    assert (row["results"], row["late"]) == (3, {"3": 1, "5": 1}), row
    blob = http.get(f"/datasets/{dsname}/export").content
    assert http.post(f"/datasets/{dsname}-copy/import", content=blob).status_code == 201
    copy = http.get(f"/datasets/{dsname}-copy/history").json()["rows"]
    assert copy == http.get(f"/datasets/{dsname}/history").json()["rows"]


def test_a_call_id_answers_its_own_retry_with_what_it_applied(http, dsname):
    """The Selector-Call header (docs/api.md section 4): an attempt of a call whose earlier attempt was
    applied (its answer lost) is answered with what that attempt applied, so a client that sums `applied`
    over its calls counts every result; any other send of the request id is a duplicate."""
    make(http, dsname, max_lag=2)
    body = {
        "dataset": dsname,
        "step": 0,
        "request_id": f"{dsname}-c",
        "results": [{"prompt_id": 1, "rewards": [1, 0]}],
    }

    def send(call=None, **changes):
        headers = {} if call is None else {"Selector-Call": call}
        return http.post("/observe", json={**body, **changes}, headers=headers)

    assert send("call-a").json() == {"applied": 1, "duplicate": False, "lag": 0}
    http.post("/select", json={"dataset": dsname, "step": 1, "batch_size": 2}).raise_for_status()
    # its retry, after a step closed: what the first attempt applied, at its lag
    assert send("call-a").json() == {"applied": 1, "duplicate": False, "lag": 0}
    assert send("call-b").json() == {"applied": 0, "duplicate": True, "lag": 0}  # another call: a resend
    assert send().json() == {"applied": 0, "duplicate": True, "lag": 0}  # no call id: as before
    # the same call with another body is still a conflict: a request id names one body
    r = send("call-a", results=[{"prompt_id": 2, "rewards": [1, 0]}])
    assert r.status_code == 409 and "different body" in r.json()["detail"], r.text
    assert summary(http, dsname)["observations"] == 1
    # a call id outside its domain is refused before anything is read or applied
    for bad in [b"", b"a b", b"x" * 65, b"call/1", "caf\u00e9".encode()]:
        r = http.post(
            "/observe", json={**body, "request_id": f"{dsname}-bad"}, headers={"Selector-Call": bad}
        )
        assert r.status_code == 422 and "Selector-Call" in r.text, (bad, r.text)
    r = http.post(
        "/observe", json={**body, "request_id": f"{dsname}-bad"}, headers={"Selector-Call": "ok_1-A"}
    )
    assert r.json() == {"applied": 1, "duplicate": False, "lag": 1}  # the id was not taken by the refusals
    assert summary(http, dsname)["observations"] == 2
