"""Drive verl 0.9's v1 trainer (``trainer.use_v1=True``) on CPU against a real selector service, in each
of its modes.

Runs inside the verl 0.9 venv (tests/integrations/frameworks/venvs.py). For each case it composes verl's
``ppo_trainer.yaml`` with hydra and the overrides docs/integrations.md gives users, checks it with
``verl_main.check_config``, and builds the trainer class verl's ``TaskRunnerV1`` would run
(``verl.trainer.ppo.v1.get_trainer_cls(trainer.v1.trainer_mode)`` after ``verl_v1.install()``). Then
``trainer.init()`` and ``trainer.fit(agent_loop_manager)`` run verl's own code: the prompt loader
(``create_rl_dataset``, the ``StatefulDataLoader`` with the selector's sampler), ``_fetch_one_gen_batch``
/ ``_next_train_batch`` / ``_submit_batch_to_rollout``, TransferQueue (real, on a local Ray cluster:
its controller and storage unit are Ray actors), ``AgentLoopWorkerTQ`` with the single-turn agent loop
and verl's reward loop (GSM8K rule reward), the replay buffer (``ReplayBuffer`` / ``ReplayBufferAsync``
with DAPO filtering, staleness eviction and refills), ``_balance_batch`` with its padding, GRPO
advantages over TransferQueue (``compute_advantage_for_multi_trajectories``), the worker calls through
verl's ``tqbridge``, checkpointing (``data.pt`` and, in the asynchronous modes, TransferQueue's own
checkpoint) and ``_load_checkpoint`` / ``_reissue_inflight_prompts`` on resume.

Faked, because they need GPUs: the LLM servers and the client routing to them (a `common.Policy`
answers, tagged with the weights version the fake checkpoint engine last "synced"), the FSDP actor
worker group (log-probs are zeros; the update records what it would train on: prompts, scores and
verl's advantages), the checkpoint engines and load balancer (no weights move). The agent loop and
reward workers are verl's classes on their own event loops in this process, as Ray actors would be.

Each case with a resume runs three steps (checkpoints at 2 and 3), then a fresh trainer, on a fresh
TransferQueue, resumes from the checkpoint of step 2 (as after a crash during step 3) and trains on.

Usage: python drive_verl_v1.py --url URL --dataset-prefix P --workdir DIR [--cases a,b,...]
Prints ``DRIVER-REPORT {json}`` last.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.integrations.frameworks import common
from tests.integrations.frameworks.drive_verl import Actor, FakeResources, plain_class, write_parquet

N = 4  # actor_rollout_ref.rollout.n
BATCH = 3  # data.train_batch_size: prompts per step
BUDGET = 13  # rollouts per step with a rollout budget: not a multiple of a mini-batch, so verl pads

#: case -> (trainer mode, extra overrides, resume?, rollout budget?)
CASES: dict[str, tuple[str, list[str], bool, bool]] = {
    "sync": ("sync", [], True, False),
    "sync_filter_groups": ("sync", ["algorithm.filter_groups.enable=True"], False, False),
    "colocate_async": ("colocate_async", [], True, False),
    "separate_async": (
        "separate_async",
        [
            # One mini-batch per local update, three updates per step (train_batch_size = 3 x 1).
            "trainer.v1.separate_async.parameter_sync_step=3",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            # Its checks: a standalone rollout pool and a non-naive weight transfer.
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
            # Groups sampled a step after their submission are stale (span 2 > 1): dropped, refilled.
            "trainer.v1.sampler.max_off_policy_threshold=1",
            "algorithm.filter_groups.enable=True",
        ],
        True,
        False,
    ),
    "sync_budget": ("sync", [], False, True),
    "colocate_async_budget": ("colocate_async", [], False, True),
}


def compose(
    url: str, dataset: str, work: Path, model: Path, data: Path, case: str, steps: int, resume: str | None
) -> Any:
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    mode, extra, _, budget = CASES[case]
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    overrides = [
        f"+data.sampler.selector.url={url}",
        f"+data.sampler.selector.dataset={dataset}",
        "+data.sampler.selector.strategy=insight",
        f"+data.sampler.selector.rollouts_per_prompt={N}",
        f"trainer.v1.trainer_mode={mode}",
        "data.dataloader_num_workers=0",
        f"data.train_files={data}",
        f"data.val_files={data}",
        f"data.train_batch_size={BATCH}",
        "data.max_prompt_length=48",
        "data.max_response_length=24",
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.prompt_length=48",
        "actor_rollout_ref.rollout.response_length=24",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
        "actor_rollout_ref.actor.use_dynamic_bsz=False",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.use_kl_in_reward=False",
        "reward.num_workers=1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.logger=[console]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=2",
        "trainer.total_epochs=10",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={work}/ckpt",
        *extra,
    ]
    if budget:
        overrides += [
            f"+data.sampler.selector.rollout_budget={BUDGET}",
            "+data.sampler.selector.rollout_min=2",
            "+data.sampler.selector.rollout_max=8",
        ]
    if resume:
        overrides += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={resume}"]
    else:
        overrides.append("trainer.resume_mode=disable")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


class Weights:
    """The weights version the fake rollout servers hold (what verl's checkpoint engine syncs)."""

    version = 0


class FakeLLMClient:
    """verl's LLM server client and the servers behind it (vLLM on GPUs): answers from `Policy`, tagged
    with the weights version as verl's ``LLMServerClient.generate`` tags real outputs."""

    def __init__(self, policy: common.Policy) -> None:
        self.policy = policy

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: Any, **_: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        await asyncio.sleep(0.01)  # let other sessions interleave, as a server's batch would
        version = Weights.version
        tokens = self.policy.respond_ids(list(prompt_ids))
        return TokenOutput(
            token_ids=tokens,
            log_probs=[0.0] * len(tokens),  # asked for (rollout.calculate_log_probs), as vLLM answers
            extra_fields={"global_steps": version, "min_global_steps": version, "max_global_steps": version},
        )


class FakeCheckpointEngine:
    """verl's CheckpointEngineManager (moves weights from the actor to the rollout replicas on GPUs)."""

    def update_weights(self, global_steps: int | None = None, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if global_steps is not None:
            Weights.version = int(global_steps)
        return {}

    def sleep_replicas(self, *args: Any, **kwargs: Any) -> None:
        pass

    def abort_replicas(self, *args: Any, **kwargs: Any) -> None:
        pass

    def resume_generation_replicas(self, *args: Any, **kwargs: Any) -> None:
        pass


class FakeLoadBalancer:
    """The global load balancer actor of separate-async rollout: its methods answer Ray object refs."""

    class _Method:
        def remote(self, *args: Any, **kwargs: Any) -> Any:
            import ray

            return ray.put(None)

    def __getattr__(self, name: str) -> Any:
        return FakeLoadBalancer._Method()


class FakeServerManager:
    """verl's LLMServerManager (rollout replicas on GPUs): no replicas, a fake load balancer."""

    def __init__(self) -> None:
        self.rollout_replicas: list[Any] = []
        self.server_addresses: list[str] = []
        self.server_handles: list[Any] = []
        self.global_load_balancer = FakeLoadBalancer()

    def get_replicas(self) -> list[Any]:
        return []


def fake_actor_workers(sink: list[dict[str, Any]]) -> Any:
    """verl's FSDP actor worker group behind ``tqbridge`` (KVBatchMeta in, TransferQueue fields out)."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.transferqueue_utils import tqbridge

    from rlvr_selector_client.integrations.verl_v1 import PROMPT_FIELD, STEP_FIELD

    class Workers:
        world_size = 1

        def __init__(self) -> None:
            self._dispatch_info: dict[str, list[int]] = {}

        def _query_dispatch_info(self, role: str) -> list[int]:
            return [0]

        @tqbridge()
        def compute_log_prob(self, data: Any) -> Any:
            zeros = torch.zeros_like(data["input_ids"], dtype=torch.float32)
            return tu.get_tensordict(
                {"log_probs": zeros, "entropy": zeros.clone()}, {"metrics": {"mfu": 0.0}}
            )

        @tqbridge()
        def update_actor(self, data: Any) -> Any:
            uids = [str(u) for u in data["uid"]]
            rows = []
            for i, uid in enumerate(uids):
                mask = data["response_mask"][i].float()
                advantage = (data["advantages"][i] * mask).sum() / mask.sum().clamp(min=1)
                rows.append(
                    {
                        "uid": uid,
                        "padding": uid.startswith("pad"),
                        "prompt_id": int(data[PROMPT_FIELD][i]),
                        "step": int(data[STEP_FIELD][i]),
                        "score": float(data["rm_scores"][i].sum()),
                        "advantage": float(advantage),
                    }
                )
            sink.append({"rows": rows})
            return tu.get_tensordict({}, {"metrics": {"mfu": 0.0, "pg_loss": 0.0}})

        def save_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
            os.makedirs(local_path, exist_ok=True)

        def load_checkpoint(self, *args: Any, **kwargs: Any) -> None:
            pass

        def save_model_to_cpu(self, *args: Any) -> None:
            pass

        def restore_model_from_cpu(self, *args: Any) -> None:
            pass

        def clear_cpu_model(self, *args: Any) -> None:
            pass

    return Workers()


def fake_setup(trainer: Any, updates: list[dict[str, Any]], reward_workers: list[Any]) -> None:
    """``PPOTrainer._setup`` without its GPU parts: verl's tokenizer, dataloaders and dump executor, the
    fake worker group and rollout managers, verl's reward worker; then verl's ``_load_checkpoint``."""
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer._init_dump_executor()
    trainer.ref_in_actor = False
    trainer.resource_pool_manager = FakeResources()
    trainer.actor_rollout_wg = fake_actor_workers(updates)

    class RewardLoop:
        reward_loop_worker_handles = reward_workers

    trainer.reward_loop_manager = RewardLoop()
    trainer.teacher_model_manager = None
    trainer.distillation_config = None
    trainer.llm_server_manager = FakeServerManager()
    trainer.checkpoint_manager = FakeCheckpointEngine()
    if trainer.trainer_mode == "separate_async":
        from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

        trainer.standalone_server_manager = FakeServerManager()
        trainer.standalone_checkpoint_manager = FakeCheckpointEngine()
        trainer.current_mode = HybridEngineMode.ROLLOUT  # what its _setup leaves (hybrid replicas lent)
        trainer.add_replicas_to_balancer()
    trainer.checkpoint_manager.sleep_replicas()
    trainer._load_checkpoint()


def agent_loop_manager(config: Any, policy: common.Policy, reward_workers: list[Any]) -> Any:
    """verl's AgentLoopManagerTQ over one AgentLoopWorkerTQ (its own event loop) whose LLM client is
    `FakeLLMClient`; only the dispatch to the worker differs (no Ray actor to call)."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

    worker_class = plain_class(AgentLoopWorkerTQ)
    worker = Actor(
        lambda: worker_class(
            config,
            llm_client=FakeLLMClient(policy),
            teacher_client=None,
            reward_loop_worker_handles=reward_workers,
        )
    )

    class Manager(AgentLoopManagerTQ):
        def __init__(self) -> None:  # the real one starts Ray actors
            self.config = config
            self.agent_loop_workers = [worker]

        def generate_sequences(self, prompts: Any) -> None:
            chunks = prompts.chunk(len(self.agent_loop_workers))
            for w, chunk in zip(self.agent_loop_workers, chunks, strict=False):
                w.generate_sequences.remote(chunk).result()

    return Manager()


def wait_settled(timeout: float = 60.0) -> None:
    """Until no training group is pending or running (the fake servers answer within milliseconds)."""
    import transfer_queue as tq

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = (tq.kv_list("train") or {}).get("train", {})
        if not any(t.get("is_prompt") and t.get("status") in ("pending", "running") for t in items.values()):
            return
        time.sleep(0.1)
    raise TimeoutError("rollouts did not settle")


def clear_transfer_queue() -> None:
    """A fresh TransferQueue, as a restarted cluster has."""
    import transfer_queue as tq

    for partition, items in (tq.kv_list() or {}).items():
        if items:
            tq.kv_clear(keys=list(items), partition_id=partition)


def run(
    args: argparse.Namespace,
    case: str,
    dataset: str,
    model: Path,
    data: Path,
    steps: int,
    resume: str | None,
    work: Path,
) -> dict[str, Any]:
    import transfer_queue as tq
    from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
    from verl.trainer.ppo import v1

    from rlvr_selector_client.integrations import verl_main

    config = compose(args.url, dataset, work, model, data, case, steps, resume)
    verl_main.check_config(config)
    from rlvr_selector_client.integrations import verl_v1

    verl_v1.install()
    trainer_class = v1.get_trainer_cls(config.trainer.v1.trainer_mode)
    config.transfer_queue.enable = True
    tok = common.tokenizer()
    policy = common.Policy(tok)
    updates: list[dict[str, Any]] = []
    reward_workers = [Actor(lambda: RewardLoopWorker(config))]
    evicted: dict[str, list[list[Any]]] = {"stale": [], "filtered": []}

    trainer = trainer_class(config=config)
    trainer._setup = lambda: fake_setup(trainer, updates, reward_workers)
    buffer = trainer.replay_buffer
    evict = buffer._evict_terminal_groups

    def recorded_evict(global_steps: int, partition_id: str, reasons: Any) -> Any:
        stale, filtered = reasons[0], reasons[1]
        evicted["stale"].extend([uid] for uid in sorted(stale))
        evicted["filtered"].extend([uid] for uid in sorted(filtered))
        return evict(global_steps, partition_id, reasons)

    buffer._evict_terminal_groups = recorded_evict
    trainer.init()
    restored = [
        uid
        for uid, tag in ((tq.kv_list("train") or {}).get("train", {})).items()
        if tag.get("is_prompt") and tag.get("status") == "finished"
    ]
    sampler = trainer.train_dataloader.sampler
    selections: list[dict[str, Any]] = []
    select = sampler.client.select

    def recorded_select(*a: Any, **kw: Any) -> Any:
        answer = select(*a, **kw)
        selections.append({"step": answer.step, "prompt_ids": answer.prompt_ids, "rollouts": answer.rollouts})
        return answer

    sampler.client.select = recorded_select
    manager = agent_loop_manager(config, policy, reward_workers)
    trainer.fit(manager)
    wait_settled()
    buffer._sync_metadata_from_transfer_queue()  # groups that finished after the last step
    return {
        "trainer": type(trainer).__name__,
        "buffer": type(buffer).__name__,
        "sampler": type(sampler).__name__,
        "gen_batch_size": config.data.get("gen_batch_size"),
        "updates": updates,
        "reports": buffer.reports,
        "lost": buffer.lost,
        "superseded": buffer.superseded,
        "restored_finished": restored,
        "evicted": {k: [u[0] for u in v] for k, v in evicted.items()},
        "next_step": sampler.next_step,
        "run_id": sampler.run_id,
        "selections": selections,
        "max_lag": trainer_max_lag(args.url, dataset),
        "global_steps": trainer.global_steps,
        "fed": policy.record,
    }


def trainer_max_lag(url: str, dataset: str) -> int:
    from rlvr_selector_client.client import SelectorClient

    with SelectorClient(url) as client:
        return client.get_dataset(dataset).max_lag


def guards(args: argparse.Namespace, model: Path, data: Path, work: Path) -> dict[str, str]:
    """What the entry point refuses on the v1 route."""
    from omegaconf import open_dict

    from rlvr_selector_client.integrations import verl_main

    def failure(fn: Any) -> str:
        try:
            fn()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    out: dict[str, str] = {}
    config = compose(args.url, "unused", work, model, data, "sync", 3, None)
    with open_dict(config):
        config.trainer.v1.sampler.custom_sampler.path = "pkg://somewhere"
        config.trainer.v1.sampler.custom_sampler.name = "MyBuffer"
    out["custom_sampler"] = failure(lambda: verl_main.check_config(config))
    config = compose(args.url, "unused", work, model, data, "sync_budget", 3, None)
    with open_dict(config):
        config.algorithm.adv_estimator = "gae"
    out["budget_with_gae"] = failure(lambda: verl_main.check_config(config))
    config = compose(args.url, "unused", work, model, data, "sync_budget", 3, None)
    with open_dict(config):
        config.data.sampler.selector.rollout_min = 1
    out["budget_min_1"] = failure(lambda: verl_main.check_config(config))
    config = compose(args.url, "unused", work, model, data, "sync", 3, None)
    with open_dict(config):
        config.trainer.use_v1 = False
        config.algorithm.filter_groups.enable = True
    out["legacy_filter_groups"] = failure(lambda: verl_main.check_config(config))
    out["legacy_kept"] = str(verl_main.uses_v1(config))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset-prefix", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    root = Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)
    model = common.model_dir(root)
    data = root / "train.parquet"
    write_parquet(data)

    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    started = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    report: dict[str, Any] = {"cases": {}, "timing": {}}
    first = compose(args.url, "unused", root, model, data, "sync", 3, None)
    tq.init(OmegaConf.create(OmegaConf.to_container(first.transfer_queue)))
    report["timing"]["ray_and_transfer_queue_s"] = round(time.monotonic() - started, 1)
    report["guards"] = guards(args, model, data, root)
    try:
        for case in [c for c in args.cases.split(",") if c]:
            case_started = time.monotonic()
            work = root / case
            dataset = f"{args.dataset_prefix}-{case}"
            clear_transfer_queue()
            runs = [run(args, case, dataset, model, data, steps=3, resume=None, work=work)]
            if CASES[case][2]:
                clear_transfer_queue()  # the crash: the cluster and its TransferQueue are gone
                ckpt = work / "ckpt" / "global_step_2"
                runs.append(run(args, case, dataset, model, data, steps=4, resume=str(ckpt), work=work))
            report["cases"][case] = {"dataset": dataset, "mode": CASES[case][0], "runs": runs}
            report["timing"][case] = round(time.monotonic() - case_started, 1)
    finally:
        tq.close()
        ray.shutdown()
    common.emit(report)


if __name__ == "__main__":
    main()
