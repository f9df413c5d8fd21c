"""Takes docs/dashboard.png, the screenshot in the README, from a real run.

    .venv/bin/python docs/screenshot.py [--out docs/dashboard.png]

Starts `selector-service serve` on its embedded store (a temporary data dir), creates a dataset of 2,000
prompts in 5 groups with max_lag 2, runs 40 steps of DPS selection against a toy learner (prompt i
solves with a rate that grows with the steps it was trained on, by group difficulty; some results come a
step late), opens /ui/<dataset> in headless Chromium and saves the page.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from selector_service.launcher import ServiceProcess  # noqa: E402


def run(url: str, name: str, steps: int = 40, size: int = 2000, batch: int = 64) -> None:
    rnd = random.Random(7)
    with httpx.Client(base_url=url, timeout=300) as c:
        c.post("/datasets", json={"name": name, "size": size, "max_lag": 2}).raise_for_status()
        groups = [i % 5 for i in range(size)]
        c.put(f"/datasets/{name}/metadata", json={"offset": 0, "group": groups}).raise_for_status()
        trained = [0] * size
        held: list[dict] = []
        for t in range(steps):
            body = {"dataset": name, "step": t, "batch_size": batch, "strategy": "dps"}
            ids = c.post("/select", json=body).raise_for_status().json()["prompt_ids"]
            results = []
            for i in ids:
                rate = min(0.95, 0.05 + 0.18 * (4 - groups[i]) / 4 + 0.12 * trained[i])
                results.append({"prompt_id": i, "rewards": [float(rnd.random() < rate) for _ in range(8)]})
                trained[i] += 1
            late, now = results[-6:], results[:-6]
            c.post(
                "/observe", json={"dataset": name, "step": t, "request_id": f"{name}-{t}", "results": now}
            ).raise_for_status()
            for step, rows in held:
                c.post(
                    "/observe",
                    json={
                        "dataset": name,
                        "step": step,
                        "request_id": f"{name}-{step}-late",
                        "results": rows,
                    },
                )
            held = [(t, late)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = p.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    data = tempfile.mkdtemp(prefix="rlvr-shot-")
    service = ServiceProcess(data_dir=data, env={"SELECTOR_API_TOKEN": None}).start(timeout_s=180)
    profile = tempfile.mkdtemp(prefix="rlvr-chromium-")
    try:
        name = "dps-toy-run"
        run(service.url, name)
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or "chromium"
        for flag in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1400,1500",
            f"--user-data-dir={profile}",
        ):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver")))
        try:
            driver.get(f"{service.url}/ui/{name}")
            for _ in range(300):
                if driver.execute_script("return document.body.dataset.loaded"):
                    break
                time.sleep(0.2)
            time.sleep(1.5)  # plots finish drawing
            driver.save_screenshot(str(args.out))
        finally:
            driver.quit()
        print(f"wrote {args.out}")
    finally:
        service.stop()
        shutil.rmtree(profile, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
