"""The numerics core and the contract it reads load no web, store or HTTP library: a fresh interpreter
imports them and the test lists what came with them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: What the service's upper layers and the client use; none of it belongs under the kernels.
FORBIDDEN = ("httpx", "httpcore", "fastapi", "starlette", "redis", "pydantic", "msgspec", "prometheus_client")


def _loaded_after(module: str) -> list[str]:
    code = (
        f"import json, sys; import {module}; "
        f"print(json.dumps(sorted(m for m in {FORBIDDEN!r} if m in sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return list(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", ["selector_service.core", "rlvr_selector_client.contract"])
def test_importing_loads_no_http_web_or_store_library(module: str) -> None:
    assert _loaded_after(module) == []


def test_the_client_package_still_hands_out_the_client_by_name() -> None:
    """The package's names resolve when first used (the lazy import must not lose one)."""
    import rlvr_selector_client

    for name in rlvr_selector_client.__all__:
        assert getattr(rlvr_selector_client, name) is not None, name
