"""The step history over HTTP (a real service on Redis, replicas, export and import) and the pages in a
real browser (headless Chromium): /ui loads nothing from off this machine, draws its plots after a few
observed steps and shows the figures /history serves, refreshes itself; with a token it asks for it,
refuses a wrong one and shows nothing before; /docs and /redoc render offline and Swagger UI's requests
carry the token."""

from __future__ import annotations

import io
import random
import uuid

import httpx
import numpy as np
import pytest

from tests.service.browser import (
    chromium,
    network_events,
    requested_urls,
    requests_off_this_machine,
    wait_for,
)
from tests.utils import ServiceProcess

TOKEN = "ui-test-token-4f2a9c"
pytestmark = pytest.mark.slow


def run_steps(client: httpx.Client, name: str, steps: range, *, batch: int = 12, seed: int = 0) -> None:
    """Select and observe `steps` of dataset `name` (a toy world: prompt i solves with rate (i % 10) / 10)."""
    rnd = random.Random(seed)
    for t in steps:
        body = {"dataset": name, "step": t, "batch_size": batch, "strategy": "insight"}
        ids = client.post("/select", json=body).raise_for_status().json()["prompt_ids"]
        assert client.post("/select", json=body).status_code == 200  # sent again: counted once
        results = [
            {"prompt_id": i, "rewards": [float(rnd.random() < (i % 10) / 10) for _ in range(8)]} for i in ids
        ]
        late = [{"prompt_id": ids[0], "rewards": [1.0] * 8}] if t else []
        client.post(
            "/observe", json={"dataset": name, "step": t, "request_id": f"{name}-{t}", "results": results}
        ).raise_for_status()
        if late:
            req = {"dataset": name, "step": t - 1, "request_id": f"{name}-{t}-late", "results": late}
            client.post("/observe", json=req).raise_for_status()


def create(client: httpx.Client, name: str, size: int = 300, **spec) -> None:
    client.post("/datasets", json={"name": name, "size": size, "max_lag": 2, **spec}).raise_for_status()


@pytest.fixture(scope="module")
def open_service(start_service) -> ServiceProcess:
    return start_service(SELECTOR_API_TOKEN=None)


@pytest.fixture(scope="module")
def locked_service(start_service) -> ServiceProcess:
    return start_service(SELECTOR_API_TOKEN=TOKEN)


@pytest.fixture
def client(open_service) -> httpx.Client:
    with httpx.Client(base_url=open_service.url, timeout=120) as c:
        yield c


# ---- the history route ---------------------------------------------------------------------------
def test_history_rows_over_http(client, dsname):
    create(client, dsname)
    run_steps(client, dsname, range(4))
    client.post("/select", json={"dataset": dsname, "step": 4, "batch_size": 5, "strategy": "dps", "seed": 1})
    doc = client.get(f"/datasets/{dsname}/history").json()
    assert doc["dataset"] == dsname and doc["open_step"] == 4 and doc["next"] == 4
    rows = doc["rows"]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows:
        assert r["selected"] == 12 and r["selects"] == 1 and r["strategies"] == {"insight": 1}
        assert (
            r["results"] == 12 + (r["step"] > 0) and r["observed"] == 12 and r["rollouts"] == 8 * r["results"]
        )
        assert r["late"] == ({"1": 1} if r["step"] else {})
        assert r["all_solved"] + r["mixed"] + r["none_solved"] == pytest.approx(1.0)
        assert sum(r["dps_predicted"]) == pytest.approx(1.0) and 0 <= r["dps_accuracy"] <= 1
        assert r["groups"] is None
    assert [r["prompts_observed"] for r in rows] == sorted(r["prompts_observed"] for r in rows)
    info = client.get(f"/datasets/{dsname}").json()["summary"]
    assert info["last_step_dps_accuracy"] == rows[-1]["dps_accuracy"]
    assert (
        client.get(f"/datasets/{dsname}/history", params={"since": 2, "limit": 1}).json()["rows"] == rows[2:3]
    )
    assert client.get(f"/datasets/{dsname}/history", params={"since": 9}).json() == {
        "dataset": dsname,
        "open_step": 4,
        "rows": [],
        "next": 9,
        "profile_rollouts": 0,
        "total_rollouts": info["rollouts"],
    }
    assert [r["total_rollouts"] for r in rows] == list(np.cumsum([r["rollouts"] for r in rows]))
    assert {r["profile_rollouts"] for r in rows} == {0}
    for bad in ({"limit": 0}, {"limit": 10_001}, {"since": -1}, {"since": "x"}):
        answer = client.get(f"/datasets/{dsname}/history", params=bad)
        assert answer.status_code == 422 and isinstance(answer.json()["detail"], str), bad
    assert client.get("/datasets/no-such-dataset-here/history").status_code == 404
    # The open step's selects (one dps select of 5) show in its row once it closes.
    run_steps(client, dsname, range(5, 6))
    (row4,) = client.get(f"/datasets/{dsname}/history", params={"since": 4, "limit": 1}).json()["rows"]
    assert row4["selected"] == 5 and row4["strategies"] == {"dps": 1} and row4["results"] == 0


def test_replicas_agree_and_exports_carry_the_history(open_service, client, dsname):
    create(client, dsname, size=200)
    groups = [i % 11 for i in range(200)]
    client.put(f"/datasets/{dsname}/metadata", json={"offset": 0, "group": groups}).raise_for_status()
    run_steps(client, dsname, range(6), batch=40)
    replica = ServiceProcess(redis_url=open_service.redis_url, prefix=open_service.prefix).start()
    try:
        with httpx.Client(base_url=replica.url, timeout=120) as other:
            run_steps(other, dsname, range(6, 9), batch=40, seed=1)
            mine = client.get(f"/datasets/{dsname}/history").json()
            theirs = other.get(f"/datasets/{dsname}/history").json()
            assert mine == theirs and len(mine["rows"]) == 8
            row = mine["rows"][-1]
            assert len(row["groups"]) + row["groups_omitted"] <= 11
            assert len(row["groups"]) == 8 or row["groups_omitted"] == 0
            assert sum(f["results"] for f in row["groups"].values()) <= row["results"]
            blob = client.get(f"/datasets/{dsname}/export").content
            copy = f"{dsname}-copy"
            other.post(
                f"/datasets/{copy}/import", content=blob, headers={"Content-Type": "application/octet-stream"}
            ).raise_for_status()
            imported = other.get(f"/datasets/{copy}/history").json()
            assert imported["rows"] == mine["rows"]
    finally:
        replica.stop()


def test_the_history_wants_the_token(locked_service):
    with httpx.Client(base_url=locked_service.url, timeout=60) as c:
        assert c.get("/datasets/x/history").status_code == 401
        assert c.get("/datasets/x/history", headers={"Authorization": "Bearer nope"}).status_code == 403
        assert c.get("/openapi.json").status_code == 401
        # The pages' HTML and scripts hold no data: open, so that a browser can load them.
        for path in ("/ui", "/ui/x", "/docs", "/redoc", "/ui/assets/ui.js", "/ui/assets/plotly.min.js"):
            assert c.get(path).status_code == 200, path
        assert c.get("/ui/assets/..%2F..%2Fhistory.py").status_code == 404
        assert c.get("/ui/assets/history.py").status_code == 404


def test_assets_come_from_the_installed_packages_with_etags(client):
    import importlib.util
    from pathlib import Path

    plotly = (
        Path(importlib.util.find_spec("plotly").submodule_search_locations[0])
        / "package_data"
        / "plotly.min.js"
    )
    answer = client.get("/ui/assets/plotly.min.js")
    assert answer.content == plotly.read_bytes() and answer.headers["content-encoding"] == "gzip"
    again = client.get("/ui/assets/plotly.min.js", headers={"If-None-Match": answer.headers["etag"]})
    assert again.status_code == 304 and not again.content


# ---- the pages in Chromium -----------------------------------------------------------------------
def _nonblank(png: bytes, box: dict) -> float:
    """Share of the pixels of `box` (element rect, CSS pixels at scale 1) that are not white."""
    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("RGB")).astype(int)
    x, y, w, h = (int(box[k]) for k in ("x", "y", "width", "height"))
    crop = img[y : y + h, x : x + w]
    return float(((crop < 235).any(axis=2)).mean())


def test_the_dashboard_plots_a_run_offline_and_shows_the_history(open_service, client, dsname):
    from selenium.webdriver.common.by import By

    create(client, dsname)
    profile = {"pass_rate": [0.5] * 300, "pass_samples": [4] * 300, "profile": True}
    client.put(f"/datasets/{dsname}/metadata", json=profile).raise_for_status()
    run_steps(client, dsname, range(6))
    with chromium() as driver:
        driver.get(f"{open_service.url}/ui/{dsname}?refresh=1")
        wait_for(
            lambda: driver.execute_script("return document.body.dataset.loaded"), what="the first refresh"
        )
        plots = ("plot-signal", "plot-dps", "plot-beliefs", "plot-coverage", "plot-rollouts")
        for plot in plots:
            wait_for(lambda p=plot: driver.find_elements(By.CSS_SELECTOR, f"#{p} .main-svg"), what=plot)
        png = driver.get_screenshot_as_png()
        # The run's rollouts, the profiling pass's 300 x 4 included.
        summary = client.get(f"/datasets/{dsname}").json()["summary"]
        for field, value in (("profile_rollouts", 1200), ("total_rollouts", summary["rollouts"] + 1200)):
            shown = driver.find_element(By.CSS_SELECTOR, f"[data-field={field}]").get_attribute("data-value")
            assert shown == str(value), field
        for plot in plots:
            box = driver.find_element(By.ID, plot).rect
            assert _nonblank(png, box) > 0.02, f"{plot} looks blank"
        # The signal plot has one point per closed step on each line.
        points = driver.execute_script(
            "return document.getElementById('plot-signal').data.map(t => t.x.length)"
        )
        assert points == [5, 5]
        rows = client.get(f"/datasets/{dsname}/history").json()["rows"]
        shown = _recent_table(driver)
        assert shown == [_cells(r) for r in reversed(rows)]
        # It refreshes itself: a further step shows up without a reload.
        run_steps(client, dsname, range(6, 7))
        wait_for(lambda: _recent_table(driver)[0]["step"] == "5", what="step 5 in the table")
        rows = client.get(f"/datasets/{dsname}/history").json()["rows"]
        assert _recent_table(driver) == [_cells(r) for r in reversed(rows)][:10]
        assert (
            driver.find_element(By.CSS_SELECTOR, "[data-field=open_step]").get_attribute("data-value") == "6"
        )
        driver.get(f"{open_service.url}/ui")
        wait_for(
            lambda: driver.find_elements(By.CSS_SELECTOR, f"tr[data-dataset='{dsname}']"), what="the list"
        )
        events = network_events(driver)
        assert requests_off_this_machine(events) == []
        urls = requested_urls(events)
        assert any(u.endswith("/ui/assets/plotly.min.js") for u in urls)
        assert any(f"/datasets/{dsname}/history" in u for u in urls)
        severe = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert severe == [], severe


def _recent_table(driver) -> list[dict[str, str]]:
    """The table of recent steps, read in one script (the page redraws it at every refresh)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#recent-steps tbody tr')].map(tr => Object.fromEntries("
        "[...tr.querySelectorAll('td')].map(td => [td.dataset.field, td.dataset.value])))"
    )


def _cells(row: dict) -> dict[str, str]:
    """What the page's table of recent steps carries for a /history row (data-value attributes)."""
    import json

    def raw(v):
        if v is None:
            return ""
        if isinstance(v, dict):
            return json.dumps(v, separators=(",", ":"))
        if isinstance(v, float) and v.is_integer():
            return str(int(v))
        return repr(v) if isinstance(v, float) else str(v)

    fields = (
        "step",
        "selected",
        "observed",
        "rollouts",
        "total_rollouts",
        "mean_reward",
        "all_solved",
        "mixed",
        "none_solved",
        "dps_accuracy",
        "late",
        "strategies",
    )
    return {f: raw(row[f]) for f in fields}


def test_the_dashboard_asks_for_the_token_and_shows_nothing_before(locked_service):
    from selenium.webdriver.common.by import By

    name = f"ui-{uuid.uuid4().hex[:8]}"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=locked_service.url, timeout=120, headers=auth) as c:
        create(c, name)
        run_steps(c, name, range(3))
    with chromium() as driver:
        driver.get(f"{locked_service.url}/ui/{name}")
        gate = driver.find_element(By.ID, "gate")
        wait_for(gate.is_displayed, what="the token form")
        assert driver.find_element(By.ID, "main").text == ""
        assert "plot-signal" not in driver.page_source
        box = driver.find_element(By.CSS_SELECTOR, "#gate input")
        box.send_keys("wrong-token")
        box.submit()
        wait_for(
            lambda: gate.get_attribute("data-status") == "403" and gate.is_displayed(), what="the refusal"
        )
        assert "refused" in gate.text
        assert driver.find_element(By.ID, "main").text == ""
        assert driver.execute_script("return sessionStorage.length") == 0
        box = driver.find_element(By.CSS_SELECTOR, "#gate input")
        box.send_keys(TOKEN)
        box.submit()
        wait_for(lambda: _recent_table(driver), what="the history after the token")
        assert not gate.is_displayed()
        assert [r["step"] for r in _recent_table(driver)] == ["1", "0"]
        # Kept for the browser session: a reload asks nothing.
        driver.refresh()
        wait_for(lambda: _recent_table(driver), what="the history after a reload")
        assert not driver.find_element(By.ID, "gate").is_displayed()
        # Every API request carried the header; none went elsewhere.
        assert requests_off_this_machine(network_events(driver)) == []


def test_the_api_docs_render_offline_and_authorize_with_the_token(locked_service):
    from selenium.webdriver.common.by import By

    spec = httpx.get(
        f"{locked_service.url}/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}
    ).json()
    operations = sum(
        1 for ops in spec["paths"].values() for m in ops if m in ("get", "post", "put", "delete")
    )
    with chromium() as driver:
        driver.get(f"{locked_service.url}/docs")
        wait_for(driver.find_element(By.ID, "gate").is_displayed, what="the token form")
        box = driver.find_element(By.CSS_SELECTOR, "#gate input")
        box.send_keys(TOKEN)
        box.submit()
        wait_for(
            lambda: len(driver.find_elements(By.CSS_SELECTOR, ".opblock")) == operations,
            what="the operations",
        )
        # Swagger UI is authorized with the token: "Try it out" on GET /datasets gets a 200.
        locked = driver.find_elements(By.CSS_SELECTOR, ".auth-wrapper .authorize.locked")
        assert locked, "the Authorize button does not show the token"
        block = driver.find_element(By.ID, "operations-datasets-listDatasets")  # tag, operation id
        block.find_element(By.CSS_SELECTOR, ".opblock-summary").click()
        wait_for(lambda: block.find_elements(By.CSS_SELECTOR, ".try-out__btn"), what="Try it out")
        block.find_element(By.CSS_SELECTOR, ".try-out__btn").click()
        block.find_element(By.CSS_SELECTOR, ".execute").click()
        codes = wait_for(
            lambda: [
                e.text.strip()
                for e in block.find_elements(By.CSS_SELECTOR, ".live-responses-table .response-col_status")
                if e.text.strip()[:3].isdigit()
            ],
            what="a response",
        )
        assert codes[0].startswith("200"), codes
        driver.get(f"{locked_service.url}/redoc")  # the token is kept for the tab: no form this time
        wait_for(
            lambda: (
                len(driver.find_elements(By.CSS_SELECTOR, "[role=menuitem], li[data-item-id]")) >= operations
            ),
            what="ReDoc's menu",
        )
        assert not driver.find_element(By.ID, "gate").is_displayed()
        events = network_events(driver)
        assert requests_off_this_machine(events) == []
        assert any(u.endswith("/ui/assets/swagger-ui-bundle.js") for u in requested_urls(events))
        assert any(u.endswith("/ui/assets/redoc.standalone.js") for u in requested_urls(events))
