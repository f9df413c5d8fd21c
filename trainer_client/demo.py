"""`make demo` / `python -m trainer_client.demo`: the whole product in a few minutes on a CPU.

Starts ``selector-service serve`` on its embedded store (data under ``./runs/demo/store``) in a child
process on a free port, waits until it answers, runs a short GRPO run in which INSIGHT picks the
prompts (64 arithmetic prompts, B=8, K=8, 6 steps, 32 new tokens, SmolLM2-135M-Instruct; vLLM when
installed, else transformers), prints where the metrics and the plot are, and stops the service,
also on Ctrl-C or an error.

``LocalService`` (the child-process launcher) is also what tests and benchmarks use to run a real
service.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

__all__ = ["LocalService", "ServiceStartError", "main"]

_READY_LINE = re.compile(r"ready at (https?://\S+)")


class ServiceStartError(RuntimeError):
    """The selector service child process exited or did not become ready in time."""


class LocalService:
    """A selector service in a child process, on a port the OS picks (no race for a "free" port).

    With ``redis_url`` it uses that store; otherwise its embedded Valkey under ``data_dir``. ``env``
    adds variables (e.g. ``SELECTOR_KEY_PREFIX``, ``SELECTOR_API_TOKEN``). The service's stderr goes to
    ``log_path`` (a temporary file by default) and its tail is quoted if start-up fails.
    """

    def __init__(
        self,
        *,
        redis_url: str | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = 180.0,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if redis_url is None and data_dir is None:
            raise ValueError("LocalService needs a redis_url or a data_dir for the embedded store")
        self.redis_url, self.data_dir = redis_url, data_dir
        self.env = dict(env or {})
        self.ready_timeout_s = ready_timeout_s
        self.log_path = (
            Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="selector-", suffix=".log")[1])
        )
        self.url: str | None = None
        self._process: subprocess.Popen[str] | None = None
        self._stdout_lines: list[str] = []

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "selector_service", "serve", "--host", "127.0.0.1", "--port", "0"]
        if self.redis_url is not None:
            command += ["--redis-url", self.redis_url]
        else:
            command += ["--data-dir", str(self.data_dir)]
        return command

    def start(self) -> str:
        """Start the child and return its URL once it reports ready."""
        env = {**os.environ, **self.env}
        if self.redis_url is None:
            env.pop("SELECTOR_REDIS_URL", None)  # the embedded store was asked for
        log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 - the child writes it until stop()
        self._process = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us; we stop the child in order
        )
        log.close()
        ready = threading.Event()
        threading.Thread(target=self._read_stdout, args=(ready,), daemon=True).start()
        deadline = time.monotonic() + self.ready_timeout_s
        while not ready.wait(0.1):
            if self._process.poll() is not None:
                raise ServiceStartError(
                    f"the selector service exited with status {self._process.returncode} during start-up:\n"
                    f"{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceStartError(
                    f"the selector service did not report ready within {self.ready_timeout_s:.0f} s:\n{self.log_tail()}"
                )
        return self.url  # type: ignore[return-value]

    def _read_stdout(self, ready: threading.Event) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            self._stdout_lines.append(line.rstrip("\n"))
            match = _READY_LINE.search(line)
            if match and not ready.is_set():
                self.url = match.group(1).rstrip("/")
                ready.set()

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        tail = (self._stdout_lines + text.splitlines())[-lines:]
        return "\n".join(tail) or "(no output)"

    def stop(self, timeout_s: float = 20.0) -> None:
        """Ask the service to shut down (SIGTERM: it stops its embedded store too), then insist."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def __enter__(self) -> LocalService:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer_client.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out-dir", type=Path, default=Path("runs/demo"), help="metrics, plot and store go here"
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--strategy", default="insight")
    parser.add_argument("--backend", choices=["vllm", "hf"], help="default: vllm when installed, else hf")
    return parser


def main(argv: list[str] | None = None) -> int:
    from trainer_client import cli
    from trainer_client.client import NotFound, SelectorClient
    from trainer_client.rollout import vllm_available

    args = _parser().parse_args(argv)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = out_dir / f"{args.strategy}.jsonl"
    plot = out_dir / f"{args.strategy}.png"
    backend = args.backend or ("vllm" if vllm_available() else "hf")
    dataset = f"demo-arithmetic-{args.num_prompts}"
    service = LocalService(data_dir=out_dir / "store", log_path=out_dir / "service.log")
    print(f"starting the selector service (embedded store in {out_dir / 'store'}) ...", flush=True)
    try:
        url = service.start()
    except ServiceStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_SERVICE
    try:
        print(f"selector service at {url}; training with strategy {args.strategy!r} on {backend}", flush=True)
        with SelectorClient(url) as client, contextlib.suppress(NotFound):
            client.delete_dataset(dataset)  # every demo starts from fresh beliefs: reproducible numbers
        options = {
            "--service-url": url,
            "--dataset": dataset,
            "--task": "arithmetic",
            "--num-prompts": args.num_prompts,
            "--strategy": args.strategy,
            "--steps": args.steps,
            "--batch-size": args.batch_size,
            "--rollouts": args.rollouts,
            "--max-new-tokens": args.max_new_tokens,
            "--backend": backend,
            "--eval-every": max(1, args.steps // 2),
            "--eval-size": min(32, args.num_prompts),
            "--metrics-out": metrics,
            "--plot-out": plot,
        }
        code = cli.main(["train", *(str(x) for pair in options.items() for x in pair)])
        if code == 0:
            print(f"\ndemo done. metrics: {metrics.resolve()}\n           plot:    {plot.resolve()}")
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return cli.EXIT_INTERRUPTED
    finally:
        print("stopping the selector service ...", flush=True)
        service.stop()


if __name__ == "__main__":
    sys.exit(main())
