"""Hostile or broken clients: oversized bodies (also streamed without Content-Length), huge lists and
batches, steps far ahead, crafted exports, names that try to leave their Redis key namespace, and
malformed credentials. Whatever they send, the service answers a 4xx quickly, applies nothing, writes
no key outside its prefix, and keeps serving everyone else.

The service here runs on a private Redis (so a SCAN sees every key it wrote) with small limits (so the
limits are reached with small requests on a shared test machine).
"""

from __future__ import annotations

import json
import select
import shutil
import socket
import struct
import time
import urllib.parse
import uuid
from http.client import HTTPConnection

import httpx
import pytest
import redis
import zstandard

from tests.utils import RedisServer, ServiceProcess

pytestmark = pytest.mark.slow

MAX_BODY = 64 * 1024
MAX_IMPORT = 256 * 1024
MAX_IDS = 1000
MAX_BATCH = 1000
MAX_STEP_GAP = 50
TOKEN = "abuse-test-token-0123456789abcdef"
# A response slower than this is a stall (every request here is answered in milliseconds when healthy).
STALL_S = 10.0
LIMITS = {
    "SELECTOR_MAX_BODY_BYTES": str(MAX_BODY),
    "SELECTOR_MAX_IMPORT_BYTES": str(MAX_IMPORT),
    "SELECTOR_MAX_IDS_PER_REQUEST": str(MAX_IDS),
    "SELECTOR_MAX_BATCH_SIZE": str(MAX_BATCH),
    "SELECTOR_MAX_DATASET_SIZE": "100000",
    "SELECTOR_MAX_STEP_GAP": str(MAX_STEP_GAP),
}


@pytest.fixture(scope="module")
def private_redis():
    server = RedisServer().start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def svc(private_redis):
    proc = ServiceProcess(redis_url=private_redis.url, env=LIMITS).start()
    yield proc
    proc.stop()


@pytest.fixture
def http(svc):
    with httpx.Client(base_url=svc.url, timeout=STALL_S) as client:
        yield client


@pytest.fixture
def dataset(http) -> str:
    """A dataset of 100 prompts with one observed step."""
    name = f"ab-{uuid.uuid4().hex[:10]}"
    assert http.post("/datasets", json={"name": name, "size": 100}).status_code == 201
    observe(http, name, step=0, request_id=f"first-{name}", ids=range(10))
    return name


def observe(http: httpx.Client, name: str, step: int, request_id: str, ids) -> httpx.Response:
    results = [{"prompt_id": i, "successes": i % 3, "trials": 4} for i in ids]
    r = http.post(
        "/observe", json={"dataset": name, "step": step, "request_id": request_id, "results": results}
    )
    assert r.status_code == 200, r.text
    return r


def summary(http: httpx.Client, name: str) -> dict:
    r = http.get(f"/datasets/{name}")
    assert r.status_code == 200, r.text
    return r.json()["summary"]


def keys_outside(redis_url: str, prefix: str) -> list[bytes]:
    """Every key in the (private) Redis that is not under the service's namespace."""
    r = redis.Redis.from_url(redis_url)
    try:
        return [k for k in r.scan_iter(count=1000) if not k.startswith(f"{prefix}:v1:".encode())]
    finally:
        r.close()


def raw_chunked_post(url: str, path: str, chunk: bytes, max_bytes: int) -> tuple[int, int]:
    """Streams a chunked body (no Content-Length) until the server answers; returns (status, bytes sent).

    A raw socket, because an HTTP client would insist on sending the whole body before it reads.
    """
    parsed = urllib.parse.urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=STALL_S)
    sent = 0
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {parsed.hostname}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        )
        sock.sendall(head.encode())
        frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        while sent < max_bytes:
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        reply = b""
        deadline = time.monotonic() + STALL_S
        while b"\r\n" not in reply and time.monotonic() < deadline:
            part = sock.recv(4096)
            if not part:
                break
            reply += part
        status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else -1
        return status, sent
    finally:
        sock.close()


# ---- bodies over the limit -------------------------------------------------------------------------
JSON_ENDPOINTS = ["/datasets", "/select", "/observe", "/score"]


@pytest.mark.parametrize("path", JSON_ENDPOINTS)
def test_body_over_limit_with_content_length_is_413(http, path):
    big = b'{"pad": "' + b"a" * (MAX_BODY + 1) + b'"}'
    r = http.post(path, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413, r.text
    assert f"{MAX_BODY} bytes (SELECTOR_MAX_BODY_BYTES)" in r.json()["detail"]


@pytest.mark.parametrize("path", JSON_ENDPOINTS)
def test_chunked_body_over_limit_is_413(http, dataset, path):
    """Without Content-Length the limit is enforced while the body streams in."""

    def body():
        yield f'{{"dataset": "{dataset}", "step": 0, "request_id": "big-{dataset}", "results": ['.encode()
        row = b'{"prompt_id": 1, "successes": 1, "trials": 2},'
        for _ in range(MAX_BODY // len(row) + 10):
            yield row
        yield b'{"prompt_id": 1, "successes": 1, "trials": 2}]}'

    r = http.post(path, content=body(), headers={"content-type": "application/json"})
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in r.request.headers
    assert r.status_code == 413, r.text
    assert f"{MAX_BODY} bytes" in r.json()["detail"]
    assert summary(http, dataset)["observations"] == 10  # nothing of it was applied


def test_chunked_body_under_limit_is_accepted(http, dataset):
    """The control for the test above: streaming itself is fine."""
    results = [{"prompt_id": i, "successes": 1, "trials": 2} for i in range(20)]
    payload = json.dumps(
        {"dataset": dataset, "step": 0, "request_id": f"small-{dataset}", "results": results}
    ).encode()
    r = http.post(
        "/observe", content=iter([payload[:100], payload[100:]]), headers={"content-type": "application/json"}
    )
    assert r.request.headers.get("transfer-encoding") == "chunked"
    assert r.json() == {"applied": 20, "duplicate": False, "lag": 0}


def test_chunked_import_over_its_own_limit_is_413(http):
    chunks = (b"x" * 16384 for _ in range(MAX_IMPORT // 16384 + 2))
    r = http.post(f"/datasets/imp-{uuid.uuid4().hex[:8]}/import", content=chunks)
    assert r.status_code == 413, r.text
    detail = r.json()["detail"]
    assert f"{MAX_IMPORT} bytes" in detail and "SELECTOR_MAX_IMPORT_BYTES" in detail  # a file has no pieces
    assert "smaller requests" not in detail


def test_endless_stream_is_cut_off_early(svc, http):
    """An endless chunked upload is answered with 413 long before it ends (not buffered to the end)."""
    total = 256 * 2**20
    status, sent = raw_chunked_post(svc.url, "/observe", b"a" * 65536, max_bytes=total)
    assert status == 413
    assert sent < total
    assert http.get("/healthz").status_code == 200


# ---- huge batches, id lists and steps --------------------------------------------------------------
@pytest.mark.parametrize(
    ("batch_size", "status"),
    [(MAX_BATCH + 1, 413), (10**30, 413), (2**63, 413), (101, 422), (0, 422), (-(10**30), 422)],
)
def test_huge_batch_size_is_refused(http, dataset, batch_size, status):
    r = http.post("/select", json={"dataset": dataset, "step": 0, "batch_size": batch_size})
    assert r.status_code == status, r.text


def test_id_lists_over_the_limit_are_413(http, dataset):
    ids = [i % 100 for i in range(MAX_IDS + 1)]
    r = http.post("/score", json={"dataset": dataset, "strategy": "insight", "prompt_ids": ids})
    assert r.status_code == 413, r.text
    r = http.get(f"/datasets/{dataset}/beliefs", params={"ids": ",".join(map(str, ids))})
    assert r.status_code == 413, r.text
    results = [{"prompt_id": i, "successes": 0, "trials": 1} for i in ids]
    r = http.post(
        "/observe", json={"dataset": dataset, "step": 0, "request_id": f"many-{dataset}", "results": results}
    )
    assert r.status_code == 413, r.text
    assert summary(http, dataset)["observations"] == 10
    # at the limit, all three work
    ok = ids[:MAX_IDS]
    assert (
        http.post("/score", json={"dataset": dataset, "strategy": "insight", "prompt_ids": ok}).status_code
        == 200
    )
    assert http.get(f"/datasets/{dataset}/beliefs", params={"ids": ",".join(map(str, ok))}).status_code == 200


def test_over_long_urls_are_refused_by_the_server(svc, http, dataset):
    """A query string beyond what the HTTP server parses (~64 KiB) is a 4xx, never a 5xx or a hang."""
    parsed = urllib.parse.urlparse(svc.url)
    conn = HTTPConnection(parsed.hostname, parsed.port, timeout=STALL_S)
    try:
        conn.request("GET", f"/datasets/{dataset}/beliefs?ids=" + "1," * 2_000_000 + "1")
        response = conn.getresponse()
        response.read()
    finally:
        conn.close()
    assert 400 <= response.status < 500
    assert http.get(f"/datasets/{dataset}/beliefs", params={"ids": "1"}).status_code == 200


def test_step_far_ahead_is_refused_and_the_dataset_keeps_working(http, dataset):
    """Each skipped step is closed with a DPS update of every prompt: a typo'd step (10**12) must not
    make the service close steps for days while it holds the dataset."""
    for step in (10**12, MAX_STEP_GAP + 1):
        r = http.post("/select", json={"dataset": dataset, "step": step, "batch_size": 4})
        assert r.status_code == 422, r.text
        assert "SELECTOR_MAX_STEP_GAP" in r.json()["detail"]
        results = [{"prompt_id": 1, "successes": 1, "trials": 2}]
        body = {"dataset": dataset, "step": step, "request_id": f"far-{step}", "results": results}
        r = http.post("/observe", json=body)
        assert r.status_code == 422, r.text
    assert summary(http, dataset)["open_step"] == 0
    # within the gap it advances, and the refused request ids were not consumed
    r = http.post("/select", json={"dataset": dataset, "step": MAX_STEP_GAP, "batch_size": 4})
    assert r.status_code == 200, r.text
    observe(http, dataset, step=MAX_STEP_GAP, request_id=f"far-{MAX_STEP_GAP + 1}", ids=[1])
    assert summary(http, dataset)["open_step"] == MAX_STEP_GAP


# ---- crafted exports -------------------------------------------------------------------------------
def _export_parts(blob: bytes) -> tuple[dict, bytes]:
    (hlen,) = struct.unpack_from("<I", blob, 8)
    return json.loads(blob[12 : 12 + hlen]), blob[12 + hlen :]


def _assemble(header: dict, body: bytes) -> bytes:
    head = json.dumps(header).encode()
    return b"RLVRSNAP" + struct.pack("<I", len(head)) + head + body


def test_crafted_exports_are_422(http, dataset):
    blob = http.get(f"/datasets/{dataset}/export").content
    header, body = _export_parts(blob)
    lying_size = dict(header, spec=dict(header["spec"], size=100_000))  # arrays hold 100 prompts
    too_big = dict(header, spec=dict(header["spec"], size=10**9))
    inflating = zstandard.ZstdCompressor().compress(b"\0" * (64 * 2**20))  # ~2 KB that inflate to 64 MB
    crafted = {
        "truncated magic": b"RLVRSNAP\x01",
        "header not an object": _assemble([1, 2], body),  # type: ignore[arg-type]
        "header without spec": _assemble({k: v for k, v in header.items() if k != "spec"}, body),
        "size does not match the arrays": _assemble(lying_size, body),
        "size over the limit": _assemble(too_big, body),
        "body inflates beyond the header": _assemble(header, inflating),
        "body truncated": blob[:-10],
    }
    for what, bad in crafted.items():
        r = http.post(f"/datasets/{dataset}-bad/import", content=bad)
        assert r.status_code == 422, f"{what}: {r.status_code} {r.text}"
        assert r.json()["detail"].startswith("not a valid dataset export"), what
    assert http.get(f"/datasets/{dataset}-bad").status_code == 404
    # the genuine export still imports
    assert http.post(f"/datasets/{dataset}-copy/import", content=blob).status_code == 201


# ---- key namespace ---------------------------------------------------------------------------------
BODY_NAMES = [
    "*",
    "a*",
    "{x}",
    "a}b",
    "a:b",
    "..",
    "../x",
    "a/b",
    "a b",
    "[ab]",
    "a?",
    "a\nb",
    "ü",
    "",
    "x" * 129,
]
# As they appear in a URL path (percent-encoded where a raw character would not reach the route).
PATH_NAMES = [
    "%2A",
    "a%2A",
    "%7Bx%7D",
    "a%7Db",
    "a%3Ab",
    "a:b",
    "%5Bab%5D",
    "a%3F",
    "a%0Ab",
    "%C3%BC",
    "-x",
    "x" * 129,
]
PATH_NAMES_WITH_SLASH = ["a%2Fb", "..%2F..%2Fx", "%2E%2E%2Fx", "a%2F%2A"]
PATH_ENDPOINTS = [
    ("GET", "/datasets/{}"),
    ("DELETE", "/datasets/{}"),
    ("GET", "/datasets/{}/export"),
    ("POST", "/datasets/{}/import"),
    ("GET", "/datasets/{}/beliefs?ids=0"),
]


def test_names_cannot_leave_the_namespace(svc, http, private_redis, dataset):
    """Names with glob, hash-tag, separator or path characters are refused everywhere, and nothing is
    written outside the service's prefix (a `*` reaching a SCAN pattern would delete other datasets)."""
    before = summary(http, dataset)
    blob = http.get(f"/datasets/{dataset}/export").content
    for name in BODY_NAMES:
        requests = [
            ("/datasets", {"name": name, "size": 5}),
            ("/select", {"dataset": name, "step": 0, "batch_size": 1}),
            ("/score", {"dataset": name, "strategy": "insight", "prompt_ids": [0]}),
            (
                "/observe",
                {
                    "dataset": name,
                    "step": 0,
                    "request_id": "n",
                    "results": [{"prompt_id": 0, "rewards": [1]}],
                },
            ),
        ]
        for path, body in requests:
            r = http.post(path, json=body)
            assert r.status_code == 422, f"{path} {name!r}: {r.status_code} {r.text}"
    for names, allowed in ((PATH_NAMES, {422}), (PATH_NAMES_WITH_SLASH, {404, 422})):
        for name in names:
            for method, template in PATH_ENDPOINTS:
                content = blob if method == "POST" else None
                r = http.request(method, template.format(name), content=content)
                assert r.status_code in allowed, f"{method} {template.format(name)}: {r.status_code} {r.text}"
    assert keys_outside(private_redis.url, svc.prefix) == []
    assert summary(http, dataset) == before
    assert http.get("/datasets").json()["datasets"].count(dataset) == 1


def test_request_ids_with_special_characters_stay_inside_and_are_deleted(svc, http, private_redis):
    """Request ids are free text (printable); they become part of a key, never of a pattern."""
    name = f"rid-{uuid.uuid4().hex[:8]}"
    assert http.post("/datasets", json={"name": name, "size": 10}).status_code == 201
    rids = ["*", "{x}", "a:b", "[a-z]?", "..%2F", "}{", "\\*", "ü ☃"]
    for i, rid in enumerate(rids):
        body = {
            "dataset": name,
            "step": 0,
            "request_id": rid,
            "results": [{"prompt_id": i, "rewards": [1, 0]}],
        }
        assert http.post("/observe", json=body).json() == {"applied": 1, "duplicate": False, "lag": 0}
        assert http.post("/observe", json=body).json() == {"applied": 0, "duplicate": True, "lag": 0}
    assert summary(http, name)["observations"] == len(rids)
    assert keys_outside(private_redis.url, svc.prefix) == []
    assert http.delete(f"/datasets/{name}").status_code == 204
    r = redis.Redis.from_url(private_redis.url)
    try:
        left = [k for k in r.scan_iter(match=f"{svc.prefix}:v1:{{{name}}}:*".encode(), count=1000)]
    finally:
        r.close()
    assert left == []


# ---- malformed bodies and credentials --------------------------------------------------------------
@pytest.mark.parametrize("raw", [b"\xff\xfe\x00{", b'{"dataset": "\xc3"}', b"\x1f\x8b\x08\x00"])
def test_undecodable_body_is_422_not_400(http, raw):
    r = http.post("/observe", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "not valid JSON" in r.json()["detail"]


@pytest.mark.parametrize(
    ("path", "raw", "where"),
    [
        ("/datasets", b'{"name": x}', "(expecting value at character 10)"),
        (
            "/select",
            b'{"dataset": "d",}',
            "(expecting property name enclosed in double quotes at character 17)",
        ),
        ("/observe", b'{"dataset": x}', "(expected value at line 1 column 13)"),
    ],
)
def test_invalid_json_says_where_in_words(http, path, raw, where):
    r = http.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"].startswith(f"body is not valid JSON {where}: "), r.json()


@pytest.fixture(scope="module")
def secured(private_redis):
    proc = ServiceProcess(redis_url=private_redis.url, env={"SELECTOR_API_TOKEN": TOKEN}).start()
    yield proc
    proc.stop()


@pytest.mark.parametrize(
    ("header", "status"),
    [
        ("Bearer", 401),
        ("Token " + TOKEN, 401),
        (TOKEN, 401),
        ("Bearer " + TOKEN[:-1], 403),
        ("Bearer " + TOKEN + "x", 403),
        ("Bearer " + TOKEN.upper(), 403),
        ("Bearer " + TOKEN[:8], 403),
        ("Bearer " + TOKEN + "," + TOKEN, 403),
    ],
)
def test_malformed_credentials_are_refused(secured, header, status):
    with httpx.Client(base_url=secured.url, timeout=STALL_S) as c:
        assert c.get("/datasets", headers={"Authorization": header}).status_code == status
        assert c.post("/select", json={}, headers={"Authorization": header}).status_code == status


def test_token_outside_the_authorization_header_is_refused(secured):
    with httpx.Client(base_url=secured.url, timeout=STALL_S) as c:
        assert c.get("/datasets", params={"token": TOKEN, "access_token": TOKEN}).status_code == 401
        assert c.get("/datasets", headers={"Cookie": f"token={TOKEN}"}).status_code == 401
        assert c.get("/datasets", headers={"X-API-Token": TOKEN}).status_code == 401
        assert c.get("/datasets", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
