"""The service launcher (selector_service.launcher) that the demo, the benchmarks and the tests share."""

from __future__ import annotations

import httpx
import pytest

from selector_service.launcher import ServiceProcess, ServiceStartError
from tests.utils import ROOT, RedisServer, shared_redis_url


def test_env_none_removes_a_variable_and_the_log_file_gets_everything(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("SELECTOR_API_TOKEN", "inherited-token")
    log = tmp_path / "service.log"
    prefix = "launcher-" + tmp_path.name[-8:]
    service = ServiceProcess(
        redis_url=shared_redis_url(),
        env={"SELECTOR_API_TOKEN": None, "SELECTOR_KEY_PREFIX": prefix},
        log_path=log,
        cwd=ROOT,
    )
    with service:
        assert service.url.startswith("http://127.0.0.1:")
        # No token in the child's environment: the service is open.
        assert httpx.get(f"{service.url}/datasets").status_code == 200
        assert "ready at" in log.read_text()
    assert service.proc is not None and service.proc.poll() is not None  # stopped on exit
    assert service.output() in log.read_text()


def test_a_failed_start_raises_with_the_childs_output() -> None:
    dead = RedisServer()  # never started: nothing listens on its port
    service = ServiceProcess(redis_url=dead.url, cwd=ROOT)
    with pytest.raises(ServiceStartError, match="exited with status 2 during start-up") as error:
        service.start(timeout_s=30)
    assert "cannot reach the store" in str(error.value)
    assert isinstance(error.value, RuntimeError)
