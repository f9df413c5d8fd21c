"""Shared fixtures: real Redis, real service processes, unique names so tests never collide."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.utils import ServiceProcess, shared_redis_url


@pytest.fixture(scope="session")
def redis_url() -> str:
    return shared_redis_url()


@pytest.fixture(scope="module")
def start_service(redis_url: str) -> Iterator[Callable[..., ServiceProcess]]:
    """Starts service processes on the shared Redis, each under its own key prefix, with the given
    SELECTOR_* environment; stops them and deletes their keys when the test module ends."""
    import redis

    started: list[ServiceProcess] = []

    def start(**env: str) -> ServiceProcess:
        proc = ServiceProcess(redis_url=redis_url, env=env).start()
        started.append(proc)
        return proc

    yield start
    store = redis.Redis.from_url(redis_url)
    for proc in started:
        proc.stop()
        keys = list(store.scan_iter(match=f"{proc.prefix}*", count=1000))
        if keys:
            store.delete(*keys)


@pytest.fixture(scope="module")
def service(start_service: Callable[..., ServiceProcess]) -> ServiceProcess:
    """One service process on the shared Redis for a test module (tests use unique dataset names)."""
    return start_service()


@pytest.fixture
def http(service: ServiceProcess) -> Iterator[httpx.Client]:
    """A client of the module's service."""
    with httpx.Client(base_url=service.url, timeout=60) as client:
        yield client


@pytest.fixture
def dsname() -> str:
    return f"ds-{uuid.uuid4().hex[:12]}"
