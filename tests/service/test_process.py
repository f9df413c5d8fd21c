"""`selector-service serve` as a process: what happens to its children, its store and its exit status when
something around it dies, and how it refuses settings it cannot run with. Real processes throughout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from selector_service.server import app, lifetime
from tests.utils import ServiceProcess

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _ppid_and_state(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a live process, None for one gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
    return None if fields[0] in "ZX" else (int(fields[1]), fields[0])


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := _ppid_and_state(int(entry))) is not None:
            parents.setdefault(found[0], []).append(int(entry))
    below, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            below.append(child)
            todo.append(child)
    return below


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still alive after up to `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if _ppid_and_state(p) is not None]
    return alive


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


def observe_some(url: str, name: str, steps: int) -> list[dict]:
    """Create dataset `name` and observe `steps` steps on it; returns the acknowledged observe bodies."""
    sent = []
    with httpx.Client(base_url=url, timeout=30) as c:
        assert c.post("/datasets", json={"name": name, "size": 50}).status_code == 201
        for step in range(steps):
            body = {
                "dataset": name,
                "step": step,
                "request_id": f"r{step}",
                "results": [{"prompt_id": (step * 7 + k) % 50, "rewards": [1, 0, k % 2]} for k in range(5)],
            }
            r = c.post("/observe", json=body)
            assert r.status_code == 200 and r.json()["applied"] == 5, r.text
            sent.append(body)
    return sent


def assert_all_there(url: str, name: str, sent: list[dict]) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        r = c.get(f"/datasets/{name}")
        assert r.status_code == 200, r.text
        summary = r.json()["summary"]
        assert summary["observations"] == sum(len(b["results"]) for b in sent), summary
        assert summary["rollouts"] == sum(len(x["rewards"]) for b in sent for x in b["results"]), summary
        assert c.post("/observe", json=sent[-1]).json()["duplicate"] is True


def test_workers_die_with_a_killed_serve_and_a_restart_finds_the_data(tmp_path, dsname):
    data = tmp_path / "store"
    svc = ServiceProcess(data_dir=str(data), extra_args=["--workers", "2"]).start()
    restarted = None
    children = descendants(svc.proc.pid)
    try:
        sent = observe_some(svc.url, dsname, steps=4)
        workers = [p for p in children if "multiprocessing.spawn" in command_line(p)]
        assert len(workers) == 2, [command_line(p) for p in children]
        svc.kill()  # SIGKILL: serve runs none of its clean-up
        alive = wait_gone(children, timeout_s=10)
        assert alive == [], [f"{p}: {command_line(p)}" for p in alive]
        # The port and the data directory are free again: a restart on both finds every observation.
        port = urlparse(svc.url).port
        restarted = ServiceProcess(
            data_dir=str(data), prefix=svc.prefix, port=port, extra_args=["--workers", "2"]
        ).start()
        assert urlparse(restarted.url).port == port
        assert_all_there(restarted.url, dsname, sent)
    finally:
        svc.kill()
        if restarted is not None:
            restarted.stop()
        for pid in wait_gone(children, timeout_s=0):  # never leave a stray process behind a failed test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _start_after_the_parent_died(parent_pid: int) -> None:
    """A `serve --workers` worker slow enough to start that serve died before its app factory ran."""
    while os.getppid() == parent_pid:
        time.sleep(0.01)
    app.worker_app()
    os._exit(0)  # worker_app returned: it would now serve without a parent


_SPAWN_AND_DIE = """
import multiprocessing, os, sys
sys.path.insert(0, {root!r})
from tests.service.test_process import _start_after_the_parent_died
worker = multiprocessing.get_context("spawn").Process(target=_start_after_the_parent_died, args=(os.getpid(),))
worker.start()
print(worker.pid, flush=True)
os._exit(0)
"""

_SUBREAPER = """
import ctypes, os, subprocess, sys
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans below this process become its children
out = subprocess.run([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE, text=True, timeout=90)
_, status = os.waitpid(int(out.stdout.split()[0]), 0)
print(os.waitstatus_to_exitcode(status))
"""


def test_a_worker_whose_parent_died_before_it_started_exits_at_once():
    """The parent-death signal is asked for only once the worker runs; a serve killed before then left
    the worker to init already, so worker_app checks that its parent is still the one that spawned it."""
    root = str(Path(__file__).resolve().parents[2])
    result = subprocess.run(
        [sys.executable, "-c", _SUBREAPER, _SPAWN_AND_DIE.format(root=root)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=root,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(lifetime.EXIT_ORPHANED)], (result.stdout, result.stderr)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_exits_when_its_embedded_store_dies_and_a_restart_keeps_every_write(tmp_path, dsname, workers):
    data = tmp_path / "store"
    svc = ServiceProcess(data_dir=str(data), extra_args=["--workers", workers]).start()
    restarted = None
    children = descendants(svc.proc.pid)
    try:
        sent = observe_some(svc.url, dsname, steps=4)
        (valkey,) = [p for p in children if "valkey-server" in command_line(p)]
        os.kill(valkey, signal.SIGKILL)
        svc.proc.wait(timeout=15)  # a service without its store would answer 503 forever
        assert svc.proc.returncode == 2, svc.log_tail()
        lines = [line for line in svc.lines if "the embedded Valkey store was killed by SIGKILL" in line]
        assert len(lines) == 1 and str(data) in lines[0], svc.log_tail()
        assert "Traceback" not in svc.output(), svc.log_tail()
        assert wait_gone(children, timeout_s=10) == []
        restarted = ServiceProcess(data_dir=str(data), prefix=svc.prefix).start()
        assert_all_there(restarted.url, dsname, sent)
    finally:
        svc.kill()
        if restarted is not None:
            restarted.stop()
        for pid in wait_gone(children, timeout_s=0):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SELECTOR_")}
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-m", "selector_service", "serve", "--port", "0", *args],
        env={**environment, **(env or {})},
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )


# Nothing listens there: a service that let a bad setting through would fail on the store (exit 2) or crash.
_NO_STORE = ("--redis-url", "redis://127.0.0.1:9/0")


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (_NO_STORE, {"SELECTOR_STORE_TIMEOUT_S": "inf"}, "SELECTOR_STORE_TIMEOUT_S"),
        (_NO_STORE, {"SELECTOR_STORE_TIMEOUT_S": "1e300"}, "SELECTOR_STORE_TIMEOUT_S"),
        (_NO_STORE, {"SELECTOR_METRICS_WAIT_S": "nan"}, "SELECTOR_METRICS_WAIT_S"),
        (_NO_STORE, {"SELECTOR_REQUEST_ID_TTL_S": str(10**20)}, "SELECTOR_REQUEST_ID_TTL_S"),
        (_NO_STORE, {"SELECTOR_LOG_LEVEL": "loud"}, "SELECTOR_LOG_LEVEL"),
        (("--data-dir", "/proc/nope"), {}, "--data-dir / SELECTOR_DATA_DIR"),
        (("--data-dir", "{file}"), {}, "--data-dir / SELECTOR_DATA_DIR"),
        (("--data-dir", "{file}/below"), {}, "--data-dir / SELECTOR_DATA_DIR"),
        ((), {"SELECTOR_DATA_DIR": "{file}"}, "SELECTOR_DATA_DIR"),
        # A bearer token travels in an HTTP header: ASCII, and stripped of surrounding whitespace.
        (_NO_STORE, {"SELECTOR_API_TOKEN": " " * 12}, "SELECTOR_API_TOKEN"),
        (_NO_STORE, {"SELECTOR_API_TOKEN": " padded-token-1234 "}, "SELECTOR_API_TOKEN"),
        (_NO_STORE, {"SELECTOR_API_TOKEN": "two words-token"}, "SELECTOR_API_TOKEN"),
        (_NO_STORE, {"SELECTOR_API_TOKEN": "tökén-tökén-tökén"}, "SELECTOR_API_TOKEN"),
        (_NO_STORE, {"SELECTOR_API_TOKEN": "tab\tinside-token"}, "SELECTOR_API_TOKEN"),
        (_NO_STORE, {"SELECTOR_API_TOKEN": "k3y-7ch"}, "SELECTOR_API_TOKEN is too short"),
        (_NO_STORE, {"SELECTOR_API_TOKEN": ""}, "SELECTOR_API_TOKEN is set but empty"),
        (
            _NO_STORE,
            {"SELECTOR_REQUIRE_TOKEN": "1"},
            "SELECTOR_API_TOKEN is not set and SELECTOR_REQUIRE_TOKEN",
        ),
    ],
)
def test_a_bad_setting_exits_3_with_one_line_naming_it(tmp_path, args, env, named):
    file = tmp_path / "a-file"
    file.write_text("not a directory\n")
    args = tuple(a.format(file=file) for a in args)
    env = {k: v.format(file=file) for k, v in env.items()}
    result = _serve(*args, env=env)
    assert result.returncode == 3, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"selector-service: bad configuration: {named}"), lines
    assert f"{named}: {named}" not in lines[0]  # the variable is named once
    assert not file.is_dir() and not Path("/proc/nope").exists()
    if env.get("SELECTOR_API_TOKEN", "").strip():
        assert env["SELECTOR_API_TOKEN"].strip() not in result.stderr  # a token is never echoed


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--prot", "8000"), "unrecognized arguments: --prot 8000"),
        (("--workers", "two"), "argument --workers: invalid int value: 'two'"),
        (("--log-level", "loud"), "argument --log-level: invalid choice: 'loud'"),
    ],
)
def test_a_mistyped_flag_exits_3_with_the_serve_usage(args, said):
    """A usage error is a bad setting (3), not an unreachable store (2); the usage shown is serve's."""
    result = _serve(*args, *_NO_STORE)
    assert result.returncode == 3, (result.returncode, result.stderr)
    assert result.stderr.startswith("usage: selector-service serve "), result.stderr
    assert f"selector-service serve: error: {said}" in result.stderr


def test_a_visible_ascii_token_is_taken():
    from selector_service.settings import Settings

    token = "".join(chr(c) for c in range(0x21, 0x7F))  # every visible ASCII character
    assert Settings(api_token=token).api_token.get_secret_value() == token


def test_log_levels_are_taken_in_any_case_and_passed_on_in_lower_case():
    from selector_service.settings import Settings

    assert Settings(log_level="WARNING").log_level == "warning"
    assert Settings(log_level=" Debug ").log_level == "debug"
