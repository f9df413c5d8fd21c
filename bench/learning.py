"""Does selection make a model learn faster? GRPO on a real (small) learner on the CPU, strategy by strategy.

    python bench/learning.py --regime best --strategies uniform,insight,dps,oracle --seeds 0,1,2
    python bench/learning.py --regime base --strategies all --seeds 0,1,2,3,4 --parallel 2
    python bench/learning.py --list                 # the regimes and what each sets
    python bench/learning.py --regime smoke         # the whole pipeline at a toy size (seconds)

The learner is a small Llama-architecture transformer (about 0.5M parameters, one token per character)
pre-trained by this script on integer arithmetic (1-6 digit sums and differences, 1-3 digit products;
seeded, cached outside the work tree under $RLVR_LEARNING_CACHE, default ~/.cache/rlvr-selector/learning).
Each run is GRPO through the real stack: the selector service on its embedded store, the typed client,
and the product's own trainer loop and GRPO update (trainer_client.train / trainer_client.grpo), with the
policy itself as a batched KV-cache sampler. bench/learner/ holds the task, the policy, the regimes and
the analysis; bench/learner/run.py says what is the benchmark's own (the oracle, the evaluation).

Every strategy of a comparison spends the same rollouts (the regime's steps x B x K); the comparison is
paired by seed (a seed fixes the pool, the held-out set and the sampling stream). The result: held-out
accuracy (exact expected accuracy of a sample, and greedy) against rollouts, mixed groups, paired
differences with standard errors, rollouts to uniform's final accuracy, and ``ratio_vs_uniform``
(bench/learner/report.py defines each). Writes per-run JSON, ``learning-<regime>.md`` and
``learning-<regime>.png`` under --out, and prints the summary as its last stdout line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import OUT_DIR, emit
from bench.learner import report
from bench.learner.policy import ModelSpec
from bench.learner.regimes import ALL, REGIMES, Arm, Regime, arm_of, recommended

DEFAULT_OUT = OUT_DIR / "learning"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", default="best", help=f"named settings: {', '.join(REGIMES)}")
    parser.add_argument(
        "--strategies",
        default="uniform,insight,dps,oracle",
        help=f"comma-separated, or 'all': {', '.join(ALL)}",
    )
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (paired across strategies)")
    parser.add_argument(
        "--steps", type=int, help="override the regime's steps (its rollout budget / (B x K))"
    )
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                        help="override a regime field, e.g. --set lr=3e-4 --set 'composition={\"hopeless\": 0.35}'")  # fmt: skip
    parser.add_argument("--arm", action="append", default=[], metavar="NAME=JSON",
                        help="an arm of your own to run under NAME (then name it in --strategies), e.g. "
                             "--arm 'ins-f={\"strategy\": \"insight\", \"filter\": {}, \"profile\": true}'")  # fmt: skip
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (default 2)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per run and for pre-training (default 1: a model this small gains "
                             "little from a second thread, and on a shared machine loses much)")  # fmt: skip
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})"
    )
    parser.add_argument("--redis-url", help="run the service on this Redis instead of its embedded store")
    parser.add_argument("--reuse", action="store_true", help="skip runs whose JSON is already in --out")
    parser.add_argument("--histogram", action="store_true",
                        help="also sample 16 completions of every pool prompt (seed 0) for the pass-rate histogram")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="print the regimes and exit")
    args = parser.parse_args(argv)
    if args.list:
        return args
    if args.regime not in REGIMES:
        parser.error(f"unknown --regime {args.regime!r}; known: {', '.join(REGIMES)}")
    names = (
        ALL if args.strategies == "all" else tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    )
    args.arms = {}
    for item in args.arm:
        name, _, text = item.partition("=")
        if not name or name in ALL:
            parser.error(f"--arm: give a new NAME=JSON, got {item!r}")
        try:
            args.arms[name] = Arm.parse(text)
        except (ValueError, TypeError) as exc:
            parser.error(f"--arm {name}: {exc}")
    unknown = [s for s in names if s not in ALL and s not in args.arms]
    if unknown or not names:
        parser.error(
            f"--strategies: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(ALL)}"
        )
    args.strategy_list = list(dict.fromkeys(names))
    try:
        args.seed_list = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    if not args.seed_list:
        parser.error("--seeds: give at least one seed")
    if args.parallel < 1 or args.threads < 1:
        parser.error("--parallel and --threads must be >= 1")
    regime = REGIMES[args.regime]
    changes: dict[str, Any] = {}
    for item in args.set:
        field, _, text = item.partition("=")
        if not hasattr(regime, field) or field == "name":
            parser.error(f"--set: Regime has no field {field!r}")
        try:
            changes[field] = json.loads(text)
        except ValueError:
            parser.error(f"--set {field}: the value must be JSON, got {text!r}")
        if field == "model":  # a JSON object of ModelSpec fields to change
            try:
                changes[field] = ModelSpec(**{**regime.model.__dict__, **changes[field]})
            except TypeError as exc:
                parser.error(f"--set model: {exc}")
    if args.steps is not None:
        changes["steps"] = args.steps
    if changes:
        shown = {k: json.loads(t) for k, _, t in (i.partition("=") for i in args.set)}
        if args.steps is not None:
            shown["steps"] = args.steps
        label = ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(shown.items()))
        regime = regime.with_(name=f"{regime.name}[{label}]", **changes)
    if regime.steps < 1 or regime.batch_size < 1 or regime.rollouts < 2:
        parser.error("the regime needs steps >= 1, batch_size >= 1 and rollouts >= 2")
    args.regime_obj = regime
    return args


def _file_name(regime: Regime, strategy: str, seed: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in regime.name)
    return f"{safe}/{strategy}-seed{seed}.json"


def _die_with_parent() -> None:
    """Worker initializer: on Linux, ask the kernel to end this worker when the benchmark's process dies
    (killed, even with SIGKILL), so that no run goes on training alone."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _worker(
    regime: Regime, strategy: str, seed: int, url: str, out: str, threads: int, arm: Arm
) -> dict[str, Any]:
    from bench.learner.run import run_one

    return run_one(regime, strategy, seed, url, out=Path(out), threads=threads, arm=arm)


def pass_rate_histogram(regime: Regime, seed: int = 0) -> dict[str, Any]:
    """The pool's pass rates under the pre-trained policy, counted as successes in 16 sampled
    completions per prompt (a real sample per prompt), beside the exact rates' own shares."""
    import numpy as np

    from bench.learner.policy import KVCacheSampler, pretrained_model
    from bench.learner.run import draw_sets
    from bench.learner.task import MAX_NEW_TOKENS, CharTokenizer, prompt_tokens, reward

    tokenizer = CharTokenizer()
    model, _ = pretrained_model(regime.model, quiet=True)
    pool, _, p0, _ = draw_sets(regime, seed, model, tokenizer)
    engine = KVCacheSampler(model, tokenizer, seed=seed)
    successes = []
    for start in range(0, len(pool), 64):
        part = pool[start : start + 64]
        outputs = engine.generate(
            prompt_tokens(tokenizer, part),
            n=16,
            max_new_tokens=MAX_NEW_TOKENS,
            temperature=regime.temperature,
        )
        successes += [
            sum(reward(p, c.text) for c in o.completions) for p, o in zip(part, outputs, strict=True)
        ]
    counts = np.bincount(np.asarray(successes, dtype=int), minlength=17)
    return {
        "samples_per_prompt": 16,
        "counts": counts.tolist(),
        "share_0_of_16": float(counts[0] / len(pool)),
        "share_16_of_16": float(counts[16] / len(pool)),
        "share_mixed": float(counts[1:16].sum() / len(pool)),
        "exact_mean": float(p0.mean()),
        "exact_mixed_k8": float(np.mean(1 - p0**8 - (1 - p0) ** 8)),
    }


def run_comparison(
    regime: Regime,
    strategies: list[str],
    seeds: list[int],
    out: Path,
    *,
    parallel: int = 2,
    threads: int = 1,
    reuse: bool = False,
    redis_url: str | None = None,
    arms: dict[str, Arm] | None = None,
) -> list[dict[str, Any]]:
    """Every strategy x seed run of ``regime`` against one service on a fresh store (``parallel`` at a
    time); with ``reuse``, runs whose JSON is already under ``out`` are read instead of run again."""
    from tqdm import tqdm

    from selector_service.launcher import ServiceProcess

    runs: list[dict[str, Any]] = []
    todo = []
    for seed in seeds:
        for strategy in strategies:
            path = out / _file_name(regime, strategy, seed)
            if reuse and path.exists():
                runs.append(json.loads(path.read_text()))
            else:
                todo.append((strategy, seed, path))
    if not todo:
        return runs
    data_dir = Path(tempfile.mkdtemp(prefix="learning-store-"))
    service = ServiceProcess(data_dir=data_dir, redis_url=redis_url)
    try:
        service.start()
        print(f"selector service at {service.url}; {len(todo)} runs, {parallel} at a time", flush=True)
        context = multiprocessing.get_context("spawn")
        with (
            ProcessPoolExecutor(
                max_workers=parallel, mp_context=context, initializer=_die_with_parent
            ) as pool,
            tqdm(total=len(todo), desc=f"learning [{regime.name}]", unit="run") as bar,
        ):
            try:
                futures = {
                    pool.submit(
                        _worker,
                        regime,
                        strategy,
                        seed,
                        service.url,
                        str(path),
                        threads,
                        arm_of(regime, strategy, arms),
                    ): (
                        strategy,
                        seed,
                    )
                    for strategy, seed, path in todo
                }
                for future in as_completed(futures):
                    result = future.result()
                    runs.append(result)
                    bar.write(
                        f"{result['strategy']:>20} seed {result['seed']}: held-out "
                        f"{result['evals'][0]['heldout_sampled']:.3f} -> {report.final(result):.3f}, "
                        f"mixed {report.mixed_share(result):.2f}, {result['seconds']:.0f} s"
                    )
                    bar.update(1)
            except BaseException:  # interrupted or terminated: end the runs still training, now
                for child in multiprocessing.active_children():
                    child.terminate()
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    finally:
        service.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    # A terminated benchmark stops its service (the finally clauses) and, with it, its workers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parse_args(argv)
    if args.list:
        for regime in REGIMES.values():
            print(f"{regime.name:>14}  {regime.about}")
        return 0
    regime: Regime = args.regime_obj
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    import torch

    from bench.learner.policy import parameter_count, pretrained_model

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    model, pretrain = pretrained_model(regime.model)  # once, before the workers load it from the cache
    print(
        f"policy: {parameter_count(model):,} parameters, pre-trained in {pretrain['seconds']:.0f} s "
        f"({'cached' if pretrain['cached'] else 'now'}, {pretrain['path']})",
        flush=True,
    )
    histogram = pass_rate_histogram(regime) if args.histogram else None
    if histogram:
        print(f"pool pass rates, 16 samples each: {histogram}", flush=True)
    runs = run_comparison(
        regime,
        args.strategy_list,
        args.seed_list,
        out,
        parallel=args.parallel,
        threads=args.threads,
        reuse=args.reuse,
        redis_url=args.redis_url,
        arms=args.arms,
    )
    summary = report.summarize(runs, args.strategy_list)
    table = report.markdown(summary, regime)
    stem = "learning-" + "".join(c if c.isalnum() or c in "-_.=" else "_" for c in regime.name)
    (out / f"{stem}.md").write_text(table)
    report.plot(runs, args.strategy_list, out / f"{stem}.png", f"{regime.name}: {regime.about}")
    print(table)
    result = {
        "benchmark": "learning",
        "regime": regime.name,
        "about": regime.about,
        "settings": {k: v for k, v in regime.__dict__.items() if k not in ("name", "about", "model")},
        "model": {**regime.model.__dict__, "parameters": parameter_count(model)},
        "seeds": args.seed_list,
        "histogram": histogram,
        "results": summary["strategies"],
        "ratio_vs_uniform": summary["ratio_vs_uniform"],
        "ratio_vs_filter": summary["ratio_vs_filter"],
        "profiling_rollouts": summary["profiling_rollouts"],
        "recommended": recommended(regime).describe(regime.profile_samples),
        "arms": {
            name: arm_of(regime, name, args.arms).describe(regime.profile_samples)
            for name in args.strategy_list
        },
        "dynamics": summary["dynamics"],
        "plot": str(out / f"{stem}.png"),
        "seconds": time.perf_counter() - started,
    }
    emit(result, out / f"{stem}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
