"""Auth, backup/restore of a dataset, and what the service never writes to its logs."""

from __future__ import annotations

import httpx
import pytest

from tests.utils import ServiceProcess

TOKEN = "s3cret-token-for-tests-0123456789"


@pytest.fixture(scope="module")
def secured(start_service):
    return start_service(SELECTOR_API_TOKEN=TOKEN, SELECTOR_LOG_LEVEL="debug")


DATA_ENDPOINTS = [
    ("POST", "/datasets", {"name": "x", "size": 3}),
    ("GET", "/datasets", None),
    ("GET", "/datasets/x", None),
    ("DELETE", "/datasets/x", None),
    ("POST", "/select", {"dataset": "x", "step": 0, "batch_size": 1}),
    (
        "POST",
        "/observe",
        {"dataset": "x", "step": 0, "request_id": "r", "results": [{"prompt_id": 0, "rewards": [1]}]},
    ),
    ("GET", "/datasets/x/beliefs?ids=0", None),
    ("GET", "/strategies", None),
    ("POST", "/score", {"dataset": "x", "strategy": "insight", "prompt_ids": [0]}),
    ("GET", "/datasets/x/export", None),
    ("POST", "/datasets/x/import", None),
]


@pytest.mark.parametrize(("method", "path", "body"), DATA_ENDPOINTS)
def test_every_data_endpoint_needs_the_token(secured, method, path, body):
    with httpx.Client(base_url=secured.url, timeout=30) as c:
        r = c.request(method, path, json=body)
        assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer"
        r = c.request(method, path, json=body, headers={"Authorization": "Bearer wrong-token-000000"})
        assert r.status_code == 403
        r = c.request(method, path, json=body, headers={"Authorization": f"Basic {TOKEN}"})
        assert r.status_code == 401


DOC_PATHS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
#: The pages that render the document: HTML and scripts without data, open (a browser sends no token).
DOC_PAGES = DOC_PATHS[1:]


def test_the_api_description_needs_the_token_when_one_is_set(secured):
    """docs/api.md: with a token, every endpoint but /healthz, /readyz and /metrics requires it; the
    OpenAPI document is an endpoint too."""
    path = "/openapi.json"
    with httpx.Client(base_url=secured.url, timeout=30) as c:
        r = c.get(path)
        assert r.status_code == 401 and r.headers.get("www-authenticate") == "Bearer"
        assert r.json() == {"detail": "missing bearer token: send 'Authorization: Bearer <token>'"}
        assert c.get(path, headers={"Authorization": "Bearer wrong-token-000000"}).status_code == 403
        assert c.head(path).status_code == 401
        r = c.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        assert "/select" in r.json()["paths"]


@pytest.mark.parametrize("path", DOC_PAGES)
def test_the_pages_that_render_the_description_hold_none_of_it(secured, path):
    """The pages load the document with the token they ask for (tests/service/test_ui.py drives them in
    a browser); their HTML, open to anyone, names no operation."""
    with httpx.Client(base_url=secured.url, timeout=30) as c:
        r = c.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "/select" not in r.text and "/datasets" not in r.text
        assert c.head(path).status_code == 200


@pytest.mark.parametrize("path", DOC_PATHS)
def test_the_api_description_is_open_without_a_token(service, path):
    with httpx.Client(base_url=service.url, timeout=30) as c:
        r = c.get(path)
        assert r.status_code == 200
        assert c.head(path).status_code == 200
        if path == "/openapi.json":
            assert "/select" in r.json()["paths"] and "/openapi.json" not in r.json()["paths"]
        elif path != "/docs/oauth2-redirect":
            assert "/openapi.json" in r.text  # the page loads the document from there


def test_open_endpoints_and_token_never_logged(secured, dsname):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=secured.url, timeout=30) as c:
        for path in ("/healthz", "/readyz", "/metrics"):
            assert c.get(path).status_code == 200, path
        assert c.post("/datasets", json={"name": dsname, "size": 5}, headers=auth).status_code == 201
        assert (
            c.post("/select", json={"dataset": dsname, "step": 0, "batch_size": 2}, headers=auth).status_code
            == 200
        )
        c.post(
            "/select",
            json={"dataset": dsname, "step": 0, "batch_size": 2},
            headers={"Authorization": f"Bearer {TOKEN}x"},
        )
    assert TOKEN not in secured.output()


def test_export_import_roundtrip(service, dsname):
    with httpx.Client(base_url=service.url, timeout=60) as c:
        c.post(
            "/datasets", json={"name": dsname, "size": 300, "hmm_decay": 0.5, "beta_decay": 0.9}
        ).raise_for_status()
        for step in range(5):
            ids = c.post(
                "/select", json={"dataset": dsname, "step": step, "batch_size": 32, "strategy": "dps"}
            ).json()
            results = [
                {"prompt_id": p, "successes": (p * 7 + step) % 9, "trials": 8} for p in ids["prompt_ids"]
            ]
            c.post(
                "/observe",
                json={"dataset": dsname, "step": step, "request_id": f"e{step}", "results": results},
            ).raise_for_status()
        blob = c.get(f"/datasets/{dsname}/export")
        assert blob.status_code == 200 and blob.headers["content-type"] == "application/octet-stream"
        copy = f"{dsname}-copy"
        r = c.post(f"/datasets/{copy}/import", content=blob.content)
        assert r.status_code == 201, r.text
        assert r.json()["hmm_decay"] == 0.5 and r.json()["beta_decay"] == 0.9
        ids = ",".join(map(str, range(300)))
        a = c.get(f"/datasets/{dsname}/beliefs", params={"ids": ids}).json()
        b = c.get(f"/datasets/{copy}/beliefs", params={"ids": ids}).json()
        assert a == b and a["open_step"] == 4
        sa = c.get(f"/datasets/{dsname}").json()["summary"]
        sb = c.get(f"/datasets/{copy}").json()["summary"]
        assert sa == sb
        sel = {"step": 5, "batch_size": 16, "strategy": "dps", "seed": 1, "return_scores": True}
        original = c.post("/select", json={"dataset": dsname, **sel}).json()
        # tie-breaking is seeded by the dataset's name: the copy ranks identically, ties may differ
        assert original["scores"] == c.post("/select", json={"dataset": copy, **sel}).json()["scores"]
        # the copy takes new observations like any dataset; a request id names one request, so the
        # original's ids are refused on the copy (409, nothing applied) and new ones are applied
        body = {"dataset": copy, "step": 5, "results": [{"prompt_id": 1, "successes": 1, "trials": 2}]}
        assert c.post("/observe", json={**body, "request_id": "e0"}).status_code == 409
        ack = c.post("/observe", json={**body, "request_id": "copy-e0"}).json()
        assert ack == {"applied": 1, "duplicate": False, "lag": 0}
        # taken names, replace, and garbage
        assert c.post(f"/datasets/{copy}/import", content=blob.content).status_code == 409
        assert (
            c.post(f"/datasets/{copy}/import", params={"replace": "true"}, content=blob.content).status_code
            == 201
        )
        assert c.get(f"/datasets/{copy}").json()["summary"] == sa
        # restoring a backup under the dataset's own name gives back the very same batches
        c.post(
            f"/datasets/{dsname}/import", params={"replace": "true"}, content=blob.content
        ).raise_for_status()
        assert c.post("/select", json={"dataset": dsname, **sel}).json() == original
        assert c.post(f"/datasets/{dsname}-bad/import", content=b"RLVRSNAP garbage").status_code == 422
        assert c.post(f"/datasets/{dsname}-bad/import", content=blob.content[:-10]).status_code == 422
        assert c.post(f"/datasets/{dsname}-bad/import", content=b"").status_code == 422
        assert c.get(f"/datasets/{dsname}-bad").status_code == 404


@pytest.mark.parametrize(
    "bad",
    [
        {"hmm_decay": 1.5},
        {"beta_prior": [0.0, 1.0]},
        {"rollouts_per_prompt": 0},
        {"defaults": {"insight": {"eta": -1}}},
    ],
)
def test_import_checks_the_spec_it_carries(service, dsname, bad):
    """An export is outside input: its spec gets the same range checks as POST /datasets."""
    from selector_service.dataset.state import DatasetSpec, DatasetState
    from selector_service.storage.snapshot import serialize_snapshot

    state = DatasetState(DatasetSpec(name="x", size=8, uid="u"))
    header, arrays = state.copy_for_snapshot()
    header["spec"].update(bad)
    r = httpx.post(f"{service.url}/datasets/{dsname}/import", content=serialize_snapshot(header, arrays))
    assert r.status_code == 422, r.text
    assert "spec" in r.json()["detail"] or "eta" in r.json()["detail"]
    assert httpx.get(f"{service.url}/datasets/{dsname}").status_code == 404


def test_several_workers_share_metrics(redis_url, dsname):
    """--workers N: request counters are aggregated over every worker process (Prometheus multiprocess)."""
    proc = ServiceProcess(redis_url=redis_url, extra_args=["--workers", "2"]).start()
    try:
        with httpx.Client(base_url=proc.url, timeout=30) as c:
            statuses = [c.post("/datasets", json={"name": dsname, "size": 10}).status_code for _ in range(12)]
            assert statuses.count(201) == 1 and statuses.count(200) == 11
            text = c.get("/metrics").text
        counts = {
            line.split('status="')[1][:3]: float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith('selector_http_requests_total{endpoint="/datasets",method="POST"')
        }
        assert counts == {"201": 1.0, "200": 11.0}
        assert f'selector_dataset_prompts{{dataset="{dsname}"}} 10.0' in text
    finally:
        proc.stop()


def test_an_export_sent_as_form_data_is_refused_with_the_fix(service, dsname):
    """curl -d @file sends form data without the file's CR and LF bytes: the import must say so."""
    with httpx.Client(base_url=service.url, timeout=60) as c:
        c.post("/datasets", json={"name": dsname, "size": 5000}).raise_for_status()
        blob = c.get(f"/datasets/{dsname}/export").content
        assert b"\n" in blob or b"\r" in blob  # else this test shows nothing
        mangled = blob.replace(b"\r", b"").replace(b"\n", b"")
        form = {"content-type": "application/x-www-form-urlencoded"}
        r = c.post(f"/datasets/{dsname}-form/import", content=mangled, headers=form)
        assert r.status_code == 422, r.text
        assert "--data-binary" in r.json()["detail"] and "not a valid dataset export" in r.json()["detail"]
        assert c.get(f"/datasets/{dsname}-form").status_code == 404  # nothing applied
        r = c.post(f"/datasets/{dsname}-octet/import", content=mangled)  # no form type: no such guess
        assert r.status_code == 422 and "--data-binary" not in r.json()["detail"]
        r = c.post(f"/datasets/{dsname}-form/import", content=blob, headers=form)  # intact bytes still import
        assert r.status_code == 201, r.text
