"""Headless Chromium for the page tests: Debian's `chromium` and `chromium-driver` (apt; `make test`
installs them) driven by selenium, each browser with a fresh profile, and what it sent over the network
read from its performance log."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-default-apps",
    "--window-size=1400,1900",
)
#: Schemes of requests that go over a network (chrome://, data:, blob: stay inside the browser).
NETWORK_SCHEMES = {"http", "https", "ws", "wss", "ftp"}
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}


def require_chromium() -> None:
    if not (CHROMIUM and DRIVER):
        pytest.skip(
            "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
        )
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[test]')")


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium with a fresh profile, logging its network events."""
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="rlvr-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(DRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def network_events(driver: Any) -> list[dict[str, Any]]:
    """The Network.* events of the performance log since the last call."""
    events = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method", "").startswith("Network."):
            events.append(message)
    return events


def requests_off_this_machine(events: list[dict[str, Any]]) -> list[str]:
    """URLs of requests sent to a host other than loopback. A request the page's Content-Security-Policy
    blocked never left the browser (Chromium reports it as failed with blockedReason "csp")."""
    blocked = {
        e["params"]["requestId"]
        for e in events
        if e["method"] == "Network.loadingFailed" and e["params"].get("blockedReason") == "csp"
    }
    out = []
    for e in events:
        if e["method"] != "Network.requestWillBeSent":
            continue
        url = e["params"]["request"]["url"]
        parts = urlsplit(url)
        if parts.scheme not in NETWORK_SCHEMES or parts.hostname in LOCAL_HOSTS:
            continue
        if e["params"]["requestId"] not in blocked:
            out.append(url)
    return out


def requested_urls(events: list[dict[str, Any]]) -> list[str]:
    return [e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"]


def wait_for(check: Callable[[], Any], timeout_s: float = 60.0, what: str = "the page") -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as exc:  # a page still building raises (stale or missing element)
            last = exc
        else:
            if last:
                return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")
