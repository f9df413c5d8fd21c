"""Run ``python -m selector_service serve`` in a child process: the one launcher of the repository.

The demo (``trainer_client.demo``), the benchmarks (``bench/``) and the tests (``tests/utils.py``)
all start a real service through :class:`ServiceProcess`. It starts the child with the given store
(``redis_url``, or the embedded Valkey under ``data_dir``), settings in ``env`` and extra ``serve``
arguments, and waits for the child's own readiness line, which ``serve`` prints once ``/readyz``
answers 200 on the port it is bound to (port 0, the default, lets the OS pick a port without a race).
Everything the child writes (stdout and stderr together) is kept and, with ``log_path``, also written
to that file as it comes; its tail is quoted when start-up fails.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

__all__ = ["ServiceProcess", "ServiceStartError", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]  # an (address, port) pair for an IPv4 socket
        return port


_READY_LINE = re.compile(r"ready at (https?://\S+)")


class ServiceStartError(RuntimeError):
    """The service child process exited, or did not report ready in time, during start-up."""


class ServiceProcess:
    """``python -m selector_service serve`` in a child process; ``url`` is set once it is ready.

    ``env`` adds variables to the child's environment (a value of ``None`` removes one, e.g.
    ``{"SELECTOR_API_TOKEN": None}``). Without ``redis_url`` the child's ``SELECTOR_REDIS_URL`` is
    removed too, so that the embedded store is used (under ``data_dir`` or the service's default).
    ``cwd`` is the child's working directory (default: this process's). ``new_session`` puts the child
    in its own session, so that a Ctrl-C in a terminal reaches only the parent, which then stops it.
    """

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str | None] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        extra_args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        new_session: bool = False,
    ) -> None:
        self.redis_url = redis_url
        self.data_dir = data_dir
        self.env = dict(env or {})
        self.host = host
        self.port = port
        self.extra_args = list(extra_args)
        self.log_path = Path(log_path) if log_path is not None else None
        self.cwd = cwd
        self.new_session = new_session
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.lines: list[str] = []  # everything the child wrote, newline-terminated

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "selector_service", "serve", "--host", self.host]
        command += ["--port", str(self.port), *self.extra_args]
        if self.redis_url is not None:
            command += ["--redis-url", self.redis_url]
        if self.data_dir is not None:
            command += ["--data-dir", str(self.data_dir)]
        return command

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.redis_url is None:
            env.pop("SELECTOR_REDIS_URL", None)  # the embedded store was asked for
        for name, value in self.env.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    def start(self, timeout_s: float = 120.0) -> ServiceProcess:
        """Start the child; return once it reports ready, else stop it and raise ServiceStartError."""
        self.proc = subprocess.Popen(
            self.command(),
            cwd=self.cwd,
            env=self.child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=self.new_session,
        )
        ready = threading.Event()
        pump = threading.Thread(target=self._pump, args=(ready,), daemon=True)
        pump.start()
        deadline = time.monotonic() + timeout_s
        while not ready.wait(0.1):
            if self.proc.poll() is not None:
                pump.join(2.0)  # the pump reads what the child wrote before it exited
                raise ServiceStartError(
                    f"the selector service exited with status {self.proc.returncode} during start-up:\n"
                    f"{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise ServiceStartError(
                    f"the selector service did not report ready within {timeout_s:.0f} s:\n{self.log_tail()}"
                )
        return self

    def _pump(self, ready: threading.Event) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        log = self.log_path.open("w", encoding="utf-8") if self.log_path is not None else None
        try:
            for line in self.proc.stdout:
                self.lines.append(line)
                if log is not None:
                    log.write(line)
                    log.flush()
                match = _READY_LINE.search(line)
                if match and not ready.is_set():
                    self.url = match.group(1).rstrip("/")
                    ready.set()
        finally:
            if log is not None:
                log.close()

    def output(self) -> str:
        """Everything the child has written so far (stdout and stderr)."""
        return "".join(self.lines)

    def log_tail(self, lines: int = 40) -> str:
        return "".join(self.lines[-lines:]).rstrip("\n") or "(no output)"

    def kill(self, sig: int = signal.SIGKILL, timeout_s: float = 30.0) -> None:
        """Send ``sig`` to a running child and wait for it to exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask the service to shut down (SIGTERM: it stops its embedded store too), then insist."""
        try:
            self.kill(signal.SIGTERM, timeout_s)
        except subprocess.TimeoutExpired:
            self.kill(signal.SIGKILL, 10.0)

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
