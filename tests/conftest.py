"""Shared fixtures: real Redis, real service processes, unique names so tests never collide."""

from __future__ import annotations

import uuid

import pytest

from tests.servers import ServiceProcess, shared_redis_url


@pytest.fixture(scope="session")
def redis_url() -> str:
    return shared_redis_url()


@pytest.fixture(scope="module")
def service(redis_url: str):
    """One service process on the shared Redis for a test module (tests use unique dataset names)."""
    proc = ServiceProcess(redis_url=redis_url).start()
    yield proc
    proc.stop()


@pytest.fixture
def dsname() -> str:
    return f"ds-{uuid.uuid4().hex[:12]}"
