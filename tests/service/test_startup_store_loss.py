"""The store lost during start-up (issue 22 item 8): `selector-service serve` that finds its store at
first and loses it (gone, or frozen) while the app starts exits with status 2 and one line that says
why, as docs/api.md promises (3 is for bad settings), with and without --workers. A proxy in front of
Redis serves the start-up check's connection and fails from the next one on (the app's own)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.parse

import pytest

from tests.service.store_proxy import StoreProxy
from tests.utils import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("fail", ["close", "freeze"])
def test_a_store_lost_while_starting_is_exit_2_with_one_line(redis_url, fail, workers):
    up = urllib.parse.urlparse(redis_url)
    proxy = StoreProxy(up.hostname or "127.0.0.1", up.port or 6379, fail_after=1, fail=fail)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SELECTOR_")}
    env.update(SELECTOR_STORE_TIMEOUT_S="1", SELECTOR_KEY_PREFIX="startup-loss")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "selector_service", "serve", "--port", "0", "--redis-url", proxy.url,
             "--workers", str(workers)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        proxy.close()
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out and "Application startup failed" not in out, out
    lines = [line for line in proc.stderr.splitlines() if line.startswith("selector-service:")]
    assert len(lines) == 1 and "store" in lines[0] and proxy.url.split("//")[1].split("/")[0] in lines[0], out
    assert proxy.accepted >= 2  # the check's connection passed; the app's own was the one lost
