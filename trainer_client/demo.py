"""`make demo` / `python -m trainer_client.demo`: the whole product in a few minutes on a CPU.

Starts ``selector-service serve`` on its embedded store (data under ``./runs/demo/store``) in a child
process on a free port, waits until it answers, runs a short GRPO run in which INSIGHT picks the
prompts (64 arithmetic prompts, B=8, K=8, 6 steps, 32 new tokens, SmolLM2-135M-Instruct; vLLM when
installed, else transformers), prints the URL of the service's page for the run (``/ui/<dataset>``)
and where the metrics and the plot are, keeps the service up for a minute after the last step so that
the page can be looked at (``--linger SECONDS``; 0 stops at once, and so does Ctrl-C), and stops it,
also on an error.

The service is started with ``selector_service.launcher.ServiceProcess``, the launcher the tests and
benchmarks use too.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from selector_service.launcher import ServiceProcess, ServiceStartError

__all__ = ["main"]


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
    parser.add_argument(
        "--linger",
        type=float,
        default=60.0,
        help="seconds the service stays up after the last step, for its page (0: stop at once)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    from rlvr_selector_client.client import NotFound, SelectorClient
    from trainer_client import cli
    from trainer_client.rollout import vllm_available

    args = _parser().parse_args(argv)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = out_dir / f"{args.strategy}.jsonl"
    plot = out_dir / f"{args.strategy}.png"
    backend = args.backend or ("vllm" if vllm_available() else "hf")
    dataset = f"demo-arithmetic-{args.num_prompts}"
    service = ServiceProcess(
        data_dir=out_dir / "store",
        log_path=out_dir / "service.log",
        env={"SELECTOR_API_TOKEN": None},  # the client below sends no token
        new_session=True,  # a Ctrl-C reaches the demo, which then stops the service in order
    )
    print(f"starting the selector service (embedded store in {out_dir / 'store'}) ...", flush=True)
    try:
        url = service.start(timeout_s=180.0).url
    except ServiceStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_SERVICE
    try:
        print(f"selector service at {url}; training with strategy {args.strategy!r} on {backend}", flush=True)
        print(f"watch the run at {url}/ui/{dataset}", flush=True)
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
        linger(args.linger, f"{url}/ui/{dataset}")
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return cli.EXIT_INTERRUPTED
    finally:
        print("stopping the selector service ...", flush=True)
        service.stop()


def linger(seconds: float, page: str) -> None:
    """Keeps the service up for `seconds` after the run, saying so (Ctrl-C ends the wait)."""
    if seconds <= 0:
        return
    print(
        f"the service stays up for {seconds:g} s so that you can look at {page} "
        "(Ctrl-C stops it now; --linger sets the wait)",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        time.sleep(seconds)


if __name__ == "__main__":
    sys.exit(main())
