"""The observe body's fast parser (schemas.decode_observe, msgspec) against the contract (ObserveRequest,
pydantic): over random bodies, both accept exactly the same ones and read the same values, so the
digest that binds a request id to its body is the same whichever parsed it. Over HTTP: a large body
parsed off the event loop applies whole, its retry is a duplicate, and a large body with one bad value
at its end is a 422 that names the value."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from selector_service.contract.schemas import ObserveRequest, decode_observe
from selector_service.dataset.state import DatasetSpec
from selector_service.errors import InvalidRequest
from selector_service.replication.payloads import outcome_payload

SPEC = DatasetSpec(name="ds", size=2**62 + 1)
SMALL = DatasetSpec(name="ds", size=20)
FRACTIONAL = DatasetSpec(name="ds", size=40, reward_mode="fractional")
ODD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**62, 2**62 + 1, 10**12, 10**12 + 1, 10**9, 10**9 + 1, 2**63, 2**64]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1.0, -0.0, 0.5, 1e308, 5e-324, 3.0]),
    st.text(max_size=6),
    st.sampled_from(["", "a", "ds", "x" * 128, "x" * 129, "a\n", "\x7f", "é", "-a", "a.b_c-d"]),
    st.lists(st.integers(-2, 2), max_size=3),
    st.dictionaries(st.sampled_from(["prompt_id", "rewards", "x"]), st.integers(0, 3), max_size=2),
)


@st.composite
def results(draw):
    out = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["rewards", "counts", "both", "none"]))
        r = {"prompt_id": draw(st.integers(0, 50))}
        if kind in ("rewards", "both"):
            r["rewards"] = draw(st.lists(st.one_of(st.integers(-3, 3), st.floats(-2, 2)), max_size=5))
        if kind in ("counts", "both"):
            r["successes"] = draw(st.one_of(st.integers(0, 8), st.floats(0, 8)))
            r["trials"] = draw(st.integers(1, 8))
        out.append(r)
    return out


@st.composite
def bodies(draw):
    """A plausible observe body, then a few of its fields (or of its results' fields) replaced by odd
    values, removed, or joined by unknown ones."""
    body = {"dataset": "ds", "step": draw(st.integers(0, 5)), "request_id": "r-1", "results": draw(results())}
    if draw(st.booleans()):
        body["selected_step"] = draw(st.integers(0, 5))
    for _ in range(draw(st.integers(0, 3))):
        target = body
        rows = body.get("results")
        rows = [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []
        if rows and draw(st.booleans()):
            target = draw(st.sampled_from(rows))
        key = draw(st.sampled_from([*target.keys(), "rewards", "trials", "extra", "selected_step"]))
        action = draw(st.sampled_from(["set", "set", "drop"]))
        if action == "drop":
            target.pop(key, None)
        else:
            target[key] = draw(ODD)
    return body


def same_values(a, b) -> None:
    assert (a.dataset, a.step, a.request_id, a.selected_step) == (
        b.dataset,
        b.step,
        b.request_id,
        b.selected_step,
    )
    assert len(a.results) == len(b.results)
    for x, y in zip(a.results, b.results, strict=True):
        assert (x.prompt_id, x.rewards, x.successes, x.trials) == (
            y.prompt_id,
            y.rewards,
            y.successes,
            y.trials,
        )


def digest(body, spec: DatasetSpec = SPEC) -> tuple[str, str]:
    """("ok", payload digest) or ("refused", the message): the same for both parsers' results."""
    try:
        payload, digest = outcome_payload(spec, body.step, body.results)
        return "ok", f"{digest} {hash(payload)}"
    except InvalidRequest as exc:
        return "refused", exc.detail


@pytest.mark.parametrize("value", [None, 0, 3, 10**12, 10**12 + 1, -1, 1.5, 2.0, "3", True, [], {}], ids=repr)
def test_both_parsers_read_selected_step_alike(value):
    check(json.dumps({"dataset": "ds", "step": 3, "request_id": "r", "results": [{"prompt_id": 1,
                      "rewards": [1]}], "selected_step": value}).encode())  # fmt: skip


def check(raw: bytes) -> None:
    fast, problem = decode_observe(raw)
    try:
        slow = ObserveRequest.model_validate_json(raw)
    except ValidationError:
        assert fast is None, f"the fast parser accepted what the contract refuses: {raw[:300]!r}"
        assert problem
        return
    assert fast is not None, f"the fast parser refused what the contract accepts ({problem}): {raw[:300]!r}"
    same_values(fast, slow)
    for spec in (SPEC, SMALL, FRACTIONAL):  # prompt ids out of range; fractional successes
        assert digest(fast, spec) == digest(slow, spec)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies())
def test_both_parsers_accept_the_same_bodies_and_read_the_same_values(body):
    check(json.dumps(body).encode())


@settings(max_examples=300, deadline=None)
@given(raw=st.one_of(st.binary(max_size=40), st.text(max_size=40).map(str.encode)))
def test_both_parsers_refuse_what_is_not_an_observe_body(raw):
    check(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"dataset": "ds", "step": 1, "request_id": "r", "results": [{"prompt_id": 1, "rewards": [1]}], "step": 2}',
        b'{"dataset": "ds", "step": 1, "request_id": "r", "results": [{"prompt_id": 1, "rewards": [1e400]}]}',
        b'{"dataset": "ds", "step": 1, "request_id": "r", "results": [{"prompt_id": 1, "rewards": [NaN]}]}',
        b'{"dataset": "ds", "step": 1.0, "request_id": "r", "results": [{"prompt_id": 1, "rewards": [1]}]}',
        b'{"dataset": "ds", "step": true, "request_id": "r", "results": [{"prompt_id": 1, "rewards": [1]}]}',
        b'{"dataset": "ds", "step": 1, "request_id": "r", "results": [{"prompt_id": 1, "rewards": [true]}]}',
        b'{"dataset": "ds", "step": 1, "request_id": "r\\u0000", "results": [{"prompt_id": 1, "rewards": [1]}]}',
        # Python's `$` also matches before a final newline; pydantic's (Rust) regex does not.
        b'{"dataset": "ds\\n", "step": 1, "request_id": "r", "results": [{"prompt_id": 1, "rewards": [1]}]}',
        b'{"dataset": "ds", "step": 1, "request_id": "r\\n", "results": [{"prompt_id": 1, "rewards": [1]}]}',
        b'{"dataset": "ds", "step": 1, "request_id": "\\ud83d\\ude00", "results": [{"prompt_id": 1, "rewards": []}]}',
        b'{"dataset": "ds", "step": 1, "request_id": "r", "results": [{"prompt_id": 1, "rewards": null}]}',
        b'{"dataset": "ds", "step": 1, "request_id": "r", "results": []}',
        b'\xef\xbb\xbf{"dataset": "ds", "step": 1, "request_id": "r", "results": [{"prompt_id": 1}]}',
        b'{"dataset": "ds", "step": 1, "request_id": "r", "results": [{"prompt_id": 1, "rewards": [1]}]} x',
        b'  {"dataset": "ds", "step": 1, "request_id": "r", "results": [{"prompt_id": 1, "rewards": [1]}]}\n',
        b'{"dataset": "ds", "step": 1, "request_id": "r", "results": [{"prompt_id": 1, "x": "a\\",]}{"}]}',
        b'{"dataset": "ds", "step": 1, "request_id": ",]", "results": [1, [2], "a,]"]}',
        b'{"dataset": "ds", "step": 1, "request_id": "r", "results": "[{}]"}',
        b'{"dataset": "ds", "step": 1, "request_id": "r", "results": [\n {"prompt_id": 1,\n "rewards": [1, 0]} ,\n\t{"trials": 2, "successes": 1, "prompt_id": 3}\n]}',
        json.dumps(
            {
                "dataset": "ds",
                "step": 2,
                "request_id": "r",
                "results": [{"prompt_id": i, "rewards": [i % 2] * (i % 3 + 1)} for i in range(20000)],
            },
            indent=1,
        ).encode(),
    ],
)
def test_edge_bodies_are_read_alike(raw):
    check(raw)


def test_a_large_body_applies_whole_and_its_retry_is_a_duplicate(http, dsname):
    n = 200_000
    assert http.post("/datasets", json={"name": dsname, "size": n}).status_code == 201
    body = {"dataset": dsname, "step": 0, "request_id": f"{dsname}-big",
            "results": [{"prompt_id": i, "rewards": [i % 2]} for i in range(n)]}  # fmt: skip
    raw = json.dumps(body).encode()
    assert len(raw) > 4 * 2**20
    headers = {"content-type": "application/json"}
    r = http.post("/observe", content=raw, headers=headers)
    assert r.status_code == 200 and r.json() == {"applied": n, "duplicate": False, "lag": 0}, r.text
    r = http.post("/observe", content=raw, headers=headers)
    assert r.json() == {"applied": 0, "duplicate": True, "lag": 0}
    assert http.get(f"/datasets/{dsname}").json()["summary"]["observations"] == n
    # one bad value at the very end of a large body: refused whole, named, nothing applied
    body["request_id"] = f"{dsname}-bad"
    body["results"][-1]["prompt_id"] = -1
    r = http.post("/observe", content=json.dumps(body).encode(), headers=headers)
    assert r.status_code == 422 and f"results.{n - 1}.prompt_id" in r.json()["detail"], r.text
    assert http.get(f"/datasets/{dsname}").json()["summary"]["observations"] == n
    assert http.delete(f"/datasets/{dsname}").status_code == 204


def test_small_bodies_keep_the_contract_s_messages(http):
    name = f"ds-{uuid.uuid4().hex[:8]}"
    r = http.post("/observe", json={"dataset": name, "step": 0, "request_id": "r", "results": [], "x": 1})
    assert r.status_code == 422 and "unknown field" in r.json()["detail"]
    r = http.post("/observe", content=b'{"dataset": ', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"].startswith("body is not valid JSON")
