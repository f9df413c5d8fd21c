"""Drive SkyRL's PPO/GRPO trainer (``RayPPOTrainer.train``, skyrl 0.3.0) on CPU against a real selector
service, in the skyrl venv, with the pieces of examples/skyrl_grpo.py (the SkyRL example of
docs/integrations.md): its parquet rows, its launch overrides and its selector options.

SkyRL's own code runs the step: its config (``SkyRLTrainConfig.from_cli_overrides``), ``PromptDataset``
reading a parquet file, the trainer's loop with ``prepare_generator_input``, its ``SkyRLGymGenerator``
(batched) with the skyrl-gym ``gsm8k`` environment scoring each answer, dynamic sampling (``filter``),
``postprocess_generator_output``, ``convert_to_training_input``, GRPO advantages, checkpoints (trainer
state and the dataloader's ``data.pt``) and resume. Faked, because they need GPUs or a Ray cluster: the
inference engine behind the generator (`common.Policy` answers), the worker dispatch that holds the FSDP
policy (log-probs, forward/backward and the optimiser step; it records what it trained on), and
SkyRL's per-node checkpoint cleanup, which runs in this process instead of as a Ray task. Ray is never
started.

SkyRL 0.3.0 does not import on Python 3.11 (skyrl/tinker/types.py declares a ``typing.TypedDict`` field
in a pydantic model, which pydantic refuses before Python 3.12); this machine has 3.11, so the driver
makes ``typing.TypedDict`` the ``typing_extensions`` one before importing SkyRL (what 3.12's typing is).
That swap lives here only: neither the adapter nor the example makes it.

Runs: ``grpo``: two steps with a checkpoint after each, a third that dies in its training step (after
its rollouts were reported), and a new trainer resuming from the checkpoint of step 2, its selector
options from ``SELECTOR_URL`` / ``SELECTOR_DATASET`` / ``SELECTOR_SEED`` / ``SELECTOR_STRATEGY``.
``filter``: dynamic sampling with ``type=filter``, which draws more batches (more service steps) when
groups have no reward spread; every group drawn is reported. ``mistakes``: trainers built with a
``generator.n_samples_per_prompt`` other than the dataset's, a service URL with a path, a ``reward_key``;
each refused with what to do.

Usage: python drive_skyrl.py --url URL --dataset NAME --workdir DIR
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import typing
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import typing_extensions

typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc,assignment]
os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"  # a Ray call fails instead of starting a cluster

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from examples import skyrl_grpo  # noqa: E402 (after the TypedDict shim)
from tests.integrations.frameworks import common  # noqa: E402

SIZE = 12
BATCH = 3  # prompts per step
N = 4  # samples per prompt


class Crash(RuntimeError):
    """The training workers failing in the middle of a step (the process dies there)."""


def write_parquet(path: Path) -> None:
    """The example's rows, in another order than their prompt ids."""
    order = [5, 0, 11, 3, 8, 1, 10, 6, 2, 9, 4, 7]
    rows = skyrl_grpo.records(SIZE)
    skyrl_grpo.write_parquet([rows[pid] for pid in order], path)


class SpreadPolicy(common.Policy):
    """For the filter run: the first prompt answered is always answered right (no reward spread: dynamic
    sampling drops its group, so the step needs another batch), every other prompt half right. So no
    batch lacks a group with spread (skyrl 0.3.0's filter fails on a first batch whose groups all lack
    spread: it concatenates an empty output, skyrl/train/utils/trainer_utils.py line 586)."""

    flat: int | None = None

    def answer(self, prompt_id: int) -> str:
        if self.flat is None:
            self.flat = prompt_id
        sample = self.counts.get(prompt_id, 0)
        self.counts[prompt_id] = sample + 1
        right = prompt_id == self.flat or sample % 2 == 0
        self.record.append([prompt_id, 1.0 if right else 0.0])
        value = common.answer_of(prompt_id) + (0 if right else 7)
        return f"it is {value}. #### {value}"


class FakeInferenceEngine:
    """The inference engine the generator samples from: `common.Policy` answers (the same in every run)."""

    def __init__(self, tok: Any, policy: type[common.Policy] = common.Policy) -> None:
        self.tok = tok
        self.policy = policy(tok)

    async def generate(self, engine_input: Any, model: Any = None) -> dict[str, Any]:
        ids = [self.policy.respond_ids(list(p)) for p in engine_input["prompt_token_ids"]]
        return {
            "responses": [self.tok.decode(r, skip_special_tokens=True) for r in ids],
            "response_ids": ids,
            "stop_reasons": ["stop"] * len(ids),
            "response_logprobs": [[-0.5] * len(r) for r in ids],
        }

    async def sleep(self, *args: Any, **kwargs: Any) -> None:
        pass

    async def wake_up(self, *args: Any, **kwargs: Any) -> None:
        pass


class FakeDispatch:
    """The worker dispatch over the FSDP policy: log-probs of zeros, a loss, and a record of each
    mini-batch trained (prompt, reward read back from the tokens, GRPO advantage)."""

    def __init__(self, tok: Any, trained: list[list[dict[str, Any]]]) -> None:
        self.tok = tok
        self.trained = trained
        self.fail_at_update: int | None = None
        self.pending: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        # Placement bookkeeping (offload/backload, profiling, cache) has nothing to do without GPUs.
        if name in {"empty_cache", "mark_all_offloaded", "start_profile", "profile_step", "stop_profile"}:
            return lambda *a, **k: None
        raise AttributeError(name)

    def init_weight_sync_state(self, client: Any) -> None:
        pass

    async def save_weights_for_sampler(self) -> None:
        pass

    def get_lcm_dp_size(self) -> int:
        return 1

    def get_node_ids(self) -> list[str]:
        return ["this-node"]

    def _logprobs(self, data: Any, rows: int) -> Any:
        width = int(data.metadata["response_length"])
        return SimpleNamespace(loss_fn_outputs=[{"logprobs": [-0.5] * width} for _ in range(rows)])

    def forward(self, model: str, data: Any) -> Any:
        return self._logprobs(data, data["sequences"].shape[0])

    def stage_data(self, model: str, data: Any, boundaries: Any) -> list[list[Any]]:
        return [[(data, start, end)] for start, end in boundaries]

    def forward_from_staged(self, model: str, chunk_refs: list[Any]) -> Any:
        ((data, start, end),) = chunk_refs
        return self._logprobs(data, end - start)

    def forward_backward_from_staged(self, model: str, chunk_refs: list[Any]) -> Any:
        ((data, start, end),) = chunk_refs
        for i in range(start, end):
            text = self.tok.decode(data["sequences"][i].tolist(), skip_special_tokens=True)
            prompt_id = common.prompt_id_of(text)
            mask = data["loss_mask"][i].bool()
            advantages = data["advantages"][i][mask]
            self.pending.append(
                {
                    "prompt_id": prompt_id,
                    "reward": 1.0 if f"#### {common.answer_of(prompt_id)}" in text else 0.0,
                    "advantage": float(advantages[0]) if len(advantages) else 0.0,
                }
            )
        return SimpleNamespace(metrics={"policy_loss": 0.1})

    def optim_step(self, model: str) -> float:
        if self.fail_at_update is not None and len(self.trained) == self.fail_at_update:
            self.pending = []  # the workers' state dies with them
            raise Crash(f"the policy workers failed at update {len(self.trained)}")
        self.trained.append(self.pending)
        self.pending = []
        return 1.0

    def save_checkpoint(self, model: str, path: str, tokenizer: Any) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "weights.txt").write_text(str(len(self.trained)))

    def load_checkpoint(self, model: str, path: str, **kwargs: Any) -> None:
        assert (Path(path) / "weights.txt").exists(), path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    work = Path(args.workdir)

    import skyrl.train.trainer as trainer_module
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.dataset import PromptDataset
    from skyrl.train.generators.skyrl_gym_generator import SkyRLGymGenerator
    from skyrl.train.utils.tracking import Tracking
    from skyrl.utils.tok import get_tokenizer

    from rlvr_selector_client.integrations import skyrl as adapter

    # SkyRL removes old checkpoints on every node as Ray tasks; with one node and no Ray, here.
    trainer_module.run_on_each_node = lambda node_ids, fn, *a, **k: [fn(*a, **k)]

    model = common.model_dir(work)
    data = work / "train.parquet"
    write_parquet(data)

    def config(name: str, extra: list[str], n: int = N) -> Any:
        return SkyRLTrainConfig.from_cli_overrides(
            [
                *skyrl_grpo.overrides(data, str(model), batch=BATCH, n=n),
                "generator.batched=true",
                "generator.sampling_params.max_generate_length=32",
                "generator.max_input_length=128",
                "trainer.max_prompt_length=128",
                "trainer.placement.colocate_all=false",
                "trainer.logger=console",
                "trainer.enable_ray_gpu_monitor=false",
                "generator.inference_engine.enable_ray_prometheus_stats=false",
                "trainer.print_example_interval=0",
                "trainer.ckpt_interval=1",
                "trainer.hf_save_interval=-1",
                "trainer.resume_mode=latest",
                f"trainer.ckpt_path={work / name / 'ckpt'}",
                f"trainer.export_path={work / name / 'export'}",
                f"trainer.log_path={work / name / 'logs'}",
                "trainer.algorithm.use_kl_loss=false",
                "trainer.algorithm.use_kl_in_reward=false",
                *extra,
            ]
        )

    def trainer(
        cfg: Any, selector: Any, dispatch: FakeDispatch, policy: type[common.Policy] = common.Policy
    ) -> Any:
        tok = get_tokenizer(str(model), padding_side="left")
        train = PromptDataset(
            datasets=cfg.data.train_data, tokenizer=tok, max_prompt_length=128, num_workers=1
        )
        engine = FakeInferenceEngine(tok, policy)
        generator = SkyRLGymGenerator(
            generator_cfg=cfg.generator,
            skyrl_gym_cfg=cfg.environment.skyrl_gym,
            inference_engine_client=engine,
            tokenizer=tok,
            policy_model_name="tiny",
        )
        t = adapter.SelectorRayPPOTrainer(
            cfg=cfg,
            tracker=Tracking(project_name="selector", experiment_name="run", backend="console", config=None),
            tokenizer=tok,
            train_dataset=train,
            inference_engine_client=engine,
            generator=generator,
            selector=selector,
        )
        t.dispatch = dispatch
        t.engine = engine
        return t

    def run(
        cfg: Any, selector: Any, dispatch: FakeDispatch, policy: type[common.Policy] = common.Policy
    ) -> dict[str, Any]:
        t = trainer(cfg, selector, dispatch, policy)
        start = t.selector_sampler.next_step
        died = None
        try:
            asyncio.run(t.train())
        except Crash as exc:
            died = str(exc)
        return {
            "died": died,
            "start_step": start,
            "next_step": t.selector_sampler.next_step,
            "run_id": t.selector_sampler.run_id,
            "options": {"strategy": t.selector.strategy, "seed": t.selector.seed},
            "global_step": t.global_step,
            "reported": [[s, ids, n, dup] for s, ids, n, dup in t.selector_reported],
            "lost": list(t.selector_lost),
            "earned": list(t.engine.policy.record),
            "updates": [list(u) for u in dispatch.trained],
        }

    report: dict[str, Any] = {"skyrl": metadata.version("skyrl")}

    # GRPO: 4 steps per epoch; the first trainer dies in the update of step 3, a second one resumes.
    trained: list[list[dict[str, Any]]] = []
    dispatch = FakeDispatch(common.tokenizer(), trained)
    dispatch.fail_at_update = 2
    options = skyrl_grpo.selector(args.url, args.dataset)
    options.seed = 4
    first = run(config("grpo", []), options, dispatch)
    dispatch.fail_at_update = None
    # The resumed trainer's options from the environment, as the example reads them without --url.
    env = {
        "SELECTOR_URL": args.url,
        "SELECTOR_DATASET": args.dataset,
        "SELECTOR_SEED": "7",
        "SELECTOR_STRATEGY": "mopps",
    }
    os.environ.update(env)
    resumed = run(config("grpo", []), skyrl_grpo.selector(None, None), dispatch)
    for variable in env:
        del os.environ[variable]
    report["grpo"] = {"runs": [first, resumed]}

    # Dynamic sampling (filter): batches whose groups have no spread are drawn again.
    trained = []
    filtered = run(
        config(
            "filter",
            [
                "trainer.algorithm.dynamic_sampling.type=filter",
                "trainer.algorithm.dynamic_sampling.max_sample_batches=10",
                "trainer.max_training_steps=2",
            ],
        ),
        skyrl_grpo.selector(args.url, args.dataset + "-filter"),
        FakeDispatch(common.tokenizer(), trained),
        SpreadPolicy,
    )
    report["filter"] = {"runs": [filtered]}

    # Mistakes, each refused when the trainer is built.
    def refusal(cfg: Any, selector: Any) -> str:
        try:
            trainer(cfg, selector, FakeDispatch(common.tokenizer(), []))
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "accepted"

    cfg = config("mistakes", [])
    keyed = skyrl_grpo.selector(args.url, args.dataset + "-key")
    keyed.reward_key = "correct"
    report["mistakes"] = {
        "n_samples_per_prompt": refusal(
            config("mistakes", [], n=N + 2), skyrl_grpo.selector(args.url, args.dataset)
        ),
        "url_with_a_path": refusal(cfg, skyrl_grpo.selector(args.url + "/api", args.dataset + "-new")),
        "reward_key": refusal(cfg, keyed),
    }
    common.emit(report)


if __name__ == "__main__":
    main()
