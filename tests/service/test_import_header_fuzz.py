"""Forged export headers: whatever JSON a header holds (with a valid digest, as anyone can compute one),
the import answers a 422 and never a 500.

The header is the one part of an export the codec parses before it checks anything else, so it is
fuzzed on its own: a genuine export's header with one node anywhere in it (the spec, the per-strategy
defaults, the counters, the shared state, the array layout) replaced by arbitrary JSON (deep nesting,
huge or non-finite numbers, wrong types), checked by the same function the import route runs
(`backup.read_export`). Then over HTTP: a header nested 2,000 levels deep, and a few forged headers, are
422 and leave the service serving."""

from __future__ import annotations

import json
import struct
import uuid

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from selector_service.dataset.state import DatasetSpec, DatasetState
from selector_service.errors import InvalidRequest
from selector_service.replication.backup import read_export
from selector_service.storage.snapshot import SNAPSHOT_MAGIC, _header_digest, serialize_snapshot

N = 64


def _genuine() -> tuple[dict, bytes]:
    """(header, body) of an export of a small dataset with results, groups and strategy defaults."""
    spec = DatasetSpec(name="fuzz", size=N, defaults={"insight": {"eta": 2.0}, "sec": {"lr": 0.4}}, uid="u1")
    state = DatasetState(spec)
    ids = np.arange(0, N, 3, dtype=np.int64)
    succ = (ids % 4).astype(np.float64)
    state.apply_outcomes(ids, succ, np.full(ids.size, 4.0), np.where(succ == 0, 1, 2).astype(np.int8))
    state.close_until(1)
    blob = serialize_snapshot(state.snapshot_header(), state.snapshot_arrays())
    (hlen,) = struct.unpack("<I", blob[8:12])
    return json.loads(blob[12 : 12 + hlen]), blob[12 + hlen + 16 :]


HEADER, BODY = _genuine()


NESTED = "__nested__"


def forge(header: object, body: bytes = BODY, depth: int = 0) -> bytes:
    """An export whose header is `header` (any JSON value; the string NESTED in it stands for a value
    nested `depth` levels deep, written as text), with a valid header digest."""
    head = json.dumps(header).replace(json.dumps(NESTED), nested_text(depth)).encode()
    prefix = SNAPSHOT_MAGIC + struct.pack("<I", len(head)) + head
    return prefix + _header_digest(prefix) + body


def nested_text(depth: int) -> str:
    """JSON text of lists and objects nested `depth` levels deep (as text: encoding or printing such a
    value recurses once per level)."""
    opening = "".join("[" if i % 2 else '{"x": ' for i in range(depth))
    return opening + "1" + "".join("]" if i % 2 else "}" for i in reversed(range(depth)))


def paths(node: object, prefix: tuple = ()) -> list[tuple]:
    """Every path (keys and indices) to a node of a JSON document, the root included."""
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += paths(v, (*prefix, i))
    return out


PATHS = paths(HEADER)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**400, -(10**400)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 5e-324, float("inf"), float("nan")]),
    st.text(max_size=20),
    st.sampled_from(["<f8", "O", "V0", "S0", "<i8", "U3", "|b1", "(2,)f4", "M8", "object", "a" * 200]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
# ("json", value) or ("nested", depth): a deep value is built in the test (hypothesis would recurse
# once per level printing it).
VALUES = st.one_of(st.tuples(st.just("json"), JSON), st.tuples(st.just("nested"), st.integers(17, 3000)))


def replaced(path: tuple, value: object) -> object:
    if not path:
        return value
    doc = json.loads(json.dumps(HEADER))
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def check(blob: bytes) -> None:
    """read_export either accepts the export or refuses it with InvalidRequest (a 422), nothing else."""
    try:
        read_export([blob], max_prompts=10**6)
    except InvalidRequest as exc:
        assert exc.detail


def test_the_genuine_header_is_read():
    state = read_export([forge(HEADER)], max_prompts=10**6)
    assert state.spec.size == N and state.open_step == 1


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=VALUES)
def test_any_node_of_a_header_replaced_by_any_json_is_accepted_or_422(path, value):
    kind, arg = value
    if kind == "nested":
        check(forge(replaced(path, NESTED), depth=arg))
    else:
        check(forge(replaced(path, arg)))


@settings(max_examples=200, deadline=None)
@given(extra=st.dictionaries(st.text(max_size=10), JSON, min_size=1, max_size=3), path=st.sampled_from(PATHS))
def test_extra_keys_anywhere_are_accepted_or_422(extra, path):
    doc = json.loads(json.dumps(HEADER))
    node = doc
    for key in path:
        node = node[key]
    if isinstance(node, dict):
        node.update(extra)
    check(forge(doc))


@pytest.mark.parametrize("depth", [100, 162, 500, 2000, 100_000])
def test_a_deeply_nested_header_is_422(depth):
    for doc in (NESTED, replaced(("spec", "defaults"), {"insight": NESTED})):
        with pytest.raises(InvalidRequest, match="nest"):
            read_export([forge(doc, depth=depth)], max_prompts=10**6)


def test_forged_headers_over_http_are_422_and_the_service_keeps_serving(service):
    name = f"fz-{uuid.uuid4().hex[:10]}"
    forged = [
        forge(NESTED, depth=2000),
        forge(replaced(("spec", "defaults"), NESTED), depth=162),
        forge(replaced(("spec", "success_threshold"), 10**400)),
        forge(replaced(("spec", "defaults"), {"insight": [1, 2]})),
        forge(replaced(("arrays", 0, 1), "O")),
    ]
    with httpx.Client(base_url=service.url, timeout=60) as http:
        for blob in forged:
            r = http.post(f"/datasets/{name}/import", content=blob)
            assert r.status_code == 422, r.text
            assert http.get(f"/datasets/{name}").status_code == 404
        assert http.get("/healthz").status_code == 200
        assert http.post(f"/datasets/{name}/import", content=forge(HEADER)).status_code == 201
        assert http.get(f"/datasets/{name}").json()["size"] == N
        http.delete(f"/datasets/{name}")
