"""Drive verl's own PPO/GRPO trainer loop on CPU against a real selector service.

Runs inside a verl venv (tests/integrations/frameworks/venvs.py): composes verl's ``ppo_trainer.yaml`` with hydra and
the overrides docs/integrations.md gives users, builds verl's ``RayPPOTrainer`` (which builds the dataset
with ``create_rl_dataset``, the sampler with ``create_rl_sampler`` and the ``StatefulDataLoader``), and
runs ``RayPPOTrainer.fit()``: verl's own ``_get_gen_batch``, agent loop (``AgentLoopWorker`` and its
``_postprocess``), rule reward (``RewardLoopWorker`` / the reward manager with verl's GSM8K scorer),
``_balance_batch``, ``extract_reward``/``compute_reward``, GRPO ``compute_advantage``, checkpointing and
the sampler's ``update``. Faked, because they need GPUs: the LLM server behind the agent loop (a
`common.Policy` answers), and the FSDP actor worker group (log-probs and the optimiser step; it
records the advantages verl computed). Ray is never started.

Then a second trainer resumes from the checkpoint saved mid-epoch and finishes the epoch.

Usage: python drive_verl.py --url URL --dataset NAME --workdir DIR [--mode default|async|main]
Prints ``DRIVER-REPORT {json}`` last: the rewards the policy earned per prompt, the steps each run
reported, the GRPO advantages, and what resuming restored.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import sys
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from examples import verl_grpo
from tests.integrations.frameworks import common

VERSION = tuple(int(p) for p in metadata.version("verl").split(".")[:2])
N = 4  # rollouts per prompt
BATCH = 3  # prompts per step
SIZE = 12  # prompts in the dataset: 4 steps per epoch


def write_parquet(path: Path) -> None:
    """The example's data (examples/verl_grpo.py), rows in another order than their ids: the service id
    is extra_info.index, never the row."""
    order = [5, 0, 11, 3, 8, 1, 10, 6, 2, 9, 4, 7]
    by_id = {row["prompt_id"]: row for row in verl_grpo.records(SIZE)}
    verl_grpo.write_parquet([by_id[pid] for pid in order], path)


def compose(args: argparse.Namespace, model: Path, data: Path, steps: int, resume: str | None) -> Any:
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    # The example's launch overrides (examples/verl_grpo.py): the selector's keys and the route.
    selector = verl_grpo.selector_overrides(args.url, args.dataset, N)
    sampler = verl_grpo.route_overrides((0, 7) if args.mode == "legacy" else VERSION)
    if VERSION >= (0, 9) and args.mode != "legacy":
        # verl 0.9's legacy trainer, which verl_main runs when v1 is switched off (drive_verl_v1.py
        # drives the v1 trainer, verl's default).
        sampler.append("trainer.use_v1=False")
    overrides = [
        *sampler,
        *selector,
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
        f"actor_rollout_ref.actor.ppo_mini_batch_size={BATCH}",
        "actor_rollout_ref.actor.use_dynamic_bsz=False",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.use_kl_in_reward=False",
        "trainer.logger=[console]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=2",
        "trainer.total_epochs=1",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.device=cpu",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={args.workdir}/ckpt",
    ]
    if args.mode == "async":
        # verl 0.6's agent loop reads the chat messages: its async mode needs return_raw_chat.
        overrides += ["actor_rollout_ref.rollout.mode=async", "data.return_raw_chat=True"]
    if resume:
        overrides += ["trainer.resume_mode=resume_path", f"trainer.resume_from_path={resume}"]
    else:
        overrides.append("trainer.resume_mode=disable")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


class Actor:
    """An in-process stand-in for a Ray actor: the object lives on its own event loop in its own thread
    (as in a Ray actor process), and ``actor.method.remote(...)`` returns an awaitable of the result."""

    def __init__(self, factory: Any) -> None:
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()

        async def make() -> Any:
            return factory()

        self._target = asyncio.run_coroutine_threadsafe(make(), self._loop).result()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)
        loop = self._loop

        class _Remote:
            @staticmethod
            def remote(*args: Any, **kwargs: Any) -> Any:
                async def call() -> Any:
                    result = method(*args, **kwargs)
                    return await result if inspect.isawaitable(result) else result

                return ActorFuture(asyncio.run_coroutine_threadsafe(call(), loop))

        return _Remote()


class ActorFuture:
    """What ``actor.method.remote()`` returns: awaitable (verl >= 0.7 awaits it) and ``ray.get``-able
    through `RayStandIn` (verl 0.6 calls ``ray.get`` on a list of them)."""

    def __init__(self, future: Any) -> None:
        self.future = future

    def __await__(self) -> Any:
        return asyncio.wrap_future(self.future).__await__()

    def result(self) -> Any:
        return self.future.result()


class RayStandIn:
    """The ``ray`` module as seen by verl's agent loop module, without a Ray cluster: ``get`` waits
    for `ActorFuture`s, ``get_runtime_context`` names one local node; the rest is the real module."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    @staticmethod
    def get(futures: Any) -> Any:
        if isinstance(futures, list):
            return [f.result() for f in futures]
        return futures.result()

    @staticmethod
    def get_runtime_context() -> Any:
        class Context:
            @staticmethod
            def get_node_id() -> str:
                return "0" * 56

        return Context()


def plain_class(actor_class: Any) -> Any:
    """The Python class under a ``@ray.remote`` class."""
    return getattr(actor_class, "__ray_actor_class__", None) or actor_class.__ray_metadata__.modified_class


class FakeLLMServers:
    """The LLM server side of verl's agent loop (vLLM/SGLang replicas on GPUs): answers from `Policy`."""

    def __init__(self, policy: common.Policy) -> None:
        self.policy = policy

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: Any, **_: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        return TokenOutput(token_ids=self.policy.respond_ids(list(prompt_ids)))


class FakeActorWorkers:
    """verl's FSDP actor/rollout worker group (GPU): log-probs and the update are stand-ins; the update
    records the advantages verl computed, so the report can show GRPO ran on the reported rewards."""

    def __init__(self, sink: list[dict[str, Any]]) -> None:
        self.sink = sink
        self._dispatch_info: dict[str, list[int]] = {}
        self.world_size = 1

    def _query_dispatch_info(self, role: str) -> list[int]:
        return [0]

    def compute_log_prob(self, batch: Any) -> Any:
        from verl import DataProto

        if not isinstance(batch, DataProto):
            # verl 0.9 hands the engine workers a padding-free TensorDict.
            from verl.utils import tensordict_utils as tu

            zeros = torch.zeros_like(batch["input_ids"], dtype=torch.float32)
            return tu.get_tensordict(
                {"log_probs": zeros, "entropy": zeros.clone()}, {"metrics": {"mfu": 0.0}}
            )
        shape = batch.batch["responses"].shape
        return DataProto.from_dict(
            tensors={"old_log_probs": torch.zeros(shape), "entropys": torch.zeros(shape)},
            meta_info={"temperature": 1.0},
        )

    def record(self, batch: Any) -> None:
        """What the actor update trains on: the prompts, their scores and verl's advantages."""
        from rlvr_selector_client.integrations.verl import batch_prompt_ids

        mask = batch.batch["response_mask"]
        advantages = (batch.batch["advantages"] * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        self.sink.append(
            {
                "prompt_ids": batch_prompt_ids(batch),
                "scores": batch.batch["token_level_scores"].sum(-1).tolist(),
                "advantages": advantages.tolist(),
            }
        )

    def update_actor(self, batch: Any) -> Any:
        from verl import DataProto

        if not isinstance(batch, DataProto):
            from verl.utils import tensordict_utils as tu

            return tu.get_tensordict({}, {"metrics": {"mfu": 0.0, "pg_loss": 0.0}})
        self.record(batch)
        return DataProto(meta_info={"metrics": {"actor/pg_loss": 0.0, "actor/grad_norm": 0.0}})

    def save_checkpoint(self, local_path: str, *args: Any, **kwargs: Any) -> None:
        os.makedirs(local_path, exist_ok=True)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        pass


class FakeCheckpointManager:
    def update_weights(self, *args: Any, **kwargs: Any) -> None:
        pass

    def sleep_replicas(self, *args: Any, **kwargs: Any) -> None:
        pass


class FakeResources:
    def get_n_gpus(self) -> int:
        return 1


def rollout_manager(config: Any, policy: common.Policy) -> Any:
    """verl's AgentLoopManager over one real AgentLoopWorker whose LLM servers are `FakeLLMServers`, with
    verl's reward worker computing the rule reward inside the agent loop, as with no reward model."""
    from verl.experimental.agent_loop import agent_loop as al

    class Manager(al.AgentLoopManager):
        def __init__(self) -> None:  # the real one starts LLM servers and Ray actors
            pass

    manager = Manager()
    manager.config = config
    if VERSION >= (0, 8):
        from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

        # verl 0.9: the worker talks to the LLM servers through the client it is given.
        reward_workers = [Actor(lambda: RewardLoopWorker(config))]
        worker = Actor(
            lambda: al.AgentLoopWorker(
                config, llm_client=FakeLLMServers(policy), reward_loop_worker_handles=reward_workers
            )
        )
        manager.rollout_config = config.actor_rollout_ref.rollout
        manager.model_config = config.actor_rollout_ref.model
        manager.reward_loop_worker_handles = reward_workers
    elif VERSION >= (0, 7):
        from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

        class Worker(al.AgentLoopWorker):
            server_manager = FakeLLMServers(policy)

        reward_workers = [Actor(lambda: RewardLoopWorker(config))]
        worker = Actor(
            lambda: Worker(
                config, servers=[], load_balancer_handle=None, reward_loop_worker_handles=reward_workers
            )
        )
        manager.rollout_config, manager.model_config = al._get_rollout_and_model_config(config)
        manager.reward_loop_worker_handles = reward_workers
    else:
        # verl 0.6: the worker starts its reward worker as a Ray actor on its own node.
        if not isinstance(al.ray, RayStandIn):
            al.ray = RayStandIn(al.ray)
            al.RealRewardManagerWorker = plain_class(al.RewardManagerWorker)
        reward_class = al.RealRewardManagerWorker

        class RewardWorkers:
            @staticmethod
            def options(**_: Any) -> Any:
                class Launcher:
                    @staticmethod
                    def remote(*args: Any) -> Actor:
                        return Actor(lambda: reward_class(*args))

                return Launcher()

        al.RewardManagerWorker = RewardWorkers

        class Worker(plain_class(al.AgentLoopWorker)):  # verl 0.6 declares it a Ray actor class
            server_manager = FakeLLMServers(policy)

        worker = Actor(lambda: Worker(config, server_handles=[]))
        manager.reward_model_manager = None
        manager.rm_wg = None
        manager.sleep = manager.wake_up = lambda: None
    manager.agent_loop_workers = [worker]

    class Sync:
        def generate_sequences(self, batch: Any) -> Any:
            result = manager.generate_sequences(batch)
            return asyncio.run(result) if inspect.isawaitable(result) else result

    return Sync()


def build_trainer(config: Any, tok: Any, policy: common.Policy, updates: list[dict[str, Any]]) -> Any:
    """The trainer as verl's task runner builds it, with the GPU workers replaced by the fakes above."""
    from verl.trainer.ppo.utils import Role

    if VERSION >= (0, 8):
        # What `python -m rlvr_selector_client.integrations.verl_main` runs inside verl's legacy TaskRunner:
        # its create_rl_dataset / create_rl_sampler / RayPPOTrainer, after install() swapped in ours.
        import verl.trainer.main_ppo_v0 as v0
        from verl.utils.dataset.rl_dataset import collate_fn

        from rlvr_selector_client.integrations import verl_main

        verl_main.check_config(config)
        verl_main.install()
        train = v0.create_rl_dataset(config.data.train_files, config.data, tok, None, is_train=True)
        val = v0.create_rl_dataset(config.data.val_files, config.data, tok, None, is_train=False)
        trainer = v0.RayPPOTrainer(
            config=config,
            tokenizer=tok,
            processor=None,
            role_worker_mapping={Role.ActorRollout: object},
            resource_pool_manager=FakeResources(),
            train_dataset=train,
            val_dataset=val,
            collate_fn=collate_fn,
            train_sampler=v0.create_rl_sampler(config.data, train),
        )
    elif VERSION >= (0, 7):
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        trainer = RayPPOTrainer(
            config=config,
            tokenizer=tok,
            role_worker_mapping={Role.ActorRollout: object},
            resource_pool_manager=FakeResources(),
        )
    else:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer
        from verl.trainer.ppo.reward import load_reward_manager

        kwargs = config.reward_model.get("reward_kwargs", {})
        trainer = RayPPOTrainer(
            config=config,
            tokenizer=tok,
            role_worker_mapping={Role.ActorRollout: object},
            resource_pool_manager=FakeResources(),
            reward_fn=load_reward_manager(config, tok, num_examine=0, **kwargs),
            val_reward_fn=load_reward_manager(config, tok, num_examine=1, **kwargs),
        )
        # What init_workers decides from the config; sync mode would generate in the GPU worker group.
        if config.actor_rollout_ref.rollout.mode != "async":
            raise SystemExit("verl 0.6 is driven with actor_rollout_ref.rollout.mode=async")
        trainer.async_rollout_mode = True
    trainer.actor_rollout_wg = FakeActorWorkers(updates)
    if VERSION >= (0, 8):
        # The engine worker gets a padding-free TensorDict; record the padded batch verl updates on.
        update = trainer._update_actor

        def recorded_update(batch: Any) -> Any:
            trainer.actor_rollout_wg.record(batch)
            return update(batch)

        trainer._update_actor = recorded_update
    trainer.async_rollout_manager = rollout_manager(config, policy)
    trainer.checkpoint_manager = FakeCheckpointManager()
    return trainer


def guards(args: argparse.Namespace, model: Path, data: Path) -> dict[str, str]:
    """What happens to the settings that would silently do nothing on verl >= 0.8."""
    from rlvr_selector_client.integrations import verl as adapter
    from rlvr_selector_client.integrations import verl_main

    out: dict[str, str] = {}

    def failure(fn: Any) -> str:
        try:
            fn()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    # The 0.5-0.7 launch line: verl 0.8+ has no data.sampler, so hydra refuses the override.
    legacy = argparse.Namespace(**{**vars(args), "mode": "legacy"})
    out["legacy_overrides"] = failure(lambda: compose(legacy, model, data, steps=3, resume=None))
    config = compose(args, model, data, steps=3, resume=None)
    from omegaconf import open_dict

    with open_dict(config):
        config.data.sampler.class_path = "pkg://rlvr_selector_client.integrations.verl"
    out["class_path_with_entry_point"] = failure(lambda: verl_main.check_config(config))
    config = compose(args, model, data, steps=3, resume=None)
    with open_dict(config):
        config.algorithm.filter_groups.enable = True
    out["filter_groups"] = failure(lambda: verl_main.check_config(config))
    out["sampler_without_entry_point"] = failure(
        lambda: adapter.SelectorCurriculumSampler([], compose(args, model, data, steps=3, resume=None).data)
    )
    return out


def group_size_guard(args: argparse.Namespace, model: Path, data: Path, train_dataset: Any) -> str:
    """A group size other than the service dataset's rollouts_per_prompt, as a user gets it.

    verl 0.5-0.7 hands the sampler ``config.data`` only, so a launch line without
    ``+data.sampler.selector.rollouts_per_prompt`` creates the dataset with the service's default (8)
    while ``actor_rollout_ref.rollout.n`` is 4: the first ``update`` (a real DataProto of groups of 4)
    refuses before reporting. Through verl_main (verl >= 0.8) the sampler reads rollout.n itself, so
    only a declared rollouts_per_prompt that differs from it is left to refuse, when the sampler is built.
    """
    import numpy as np
    from omegaconf import open_dict
    from verl import DataProto

    from rlvr_selector_client.integrations import verl as adapter
    from rlvr_selector_client.integrations import verl_main

    config = compose(args, model, data, steps=3, resume=None)
    with open_dict(config):
        config.data.sampler.selector.dataset = f"{args.dataset}-groups"
        if VERSION >= (0, 8):
            config.data.sampler.selector.rollouts_per_prompt = 2 * N
        else:
            del config.data.sampler.selector["rollouts_per_prompt"]
    try:
        if VERSION >= (0, 8):
            verl_main._running["config"] = config
            verl_main.selector_sampler(config.data, train_dataset)
        else:
            sampler = adapter.SelectorCurriculumSampler(train_dataset, config.data)
            next(iter(sampler))
            ids = [pid for pid in sampler.open_ids for _ in range(N)]
            batch = DataProto.from_dict(
                tensors={"token_level_scores": torch.ones(len(ids), 2)},
                non_tensors={"extra_info": np.array([{"index": pid} for pid in ids], dtype=object)},
            )
            sampler.update(batch)
    except ValueError as exc:
        return str(exc)
    finally:
        verl_main._running.clear()
    return "accepted"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--mode", default="default", choices=["default", "async", "main", "legacy"])
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    model = common.model_dir(work)
    data = work / "train.parquet"
    write_parquet(data)
    tok = common.tokenizer()
    policy = common.Policy(tok)
    report: dict[str, Any] = {"verl": metadata.version("verl"), "mode": args.mode, "runs": []}

    # Run 1: three steps, a checkpoint at step 2 (save_freq=2) and at the last step.
    updates: list[dict[str, Any]] = []
    trainer = build_trainer(compose(args, model, data, steps=3, resume=None), tok, policy, updates)
    sampler = trainer.train_dataloader.sampler
    report["sampler"] = type(sampler).__name__
    report["trainer"] = type(trainer).__name__
    if VERSION >= (0, 8):
        report["guards"] = guards(args, model, data)
    trainer.fit()
    report["runs"].append({"updates": updates, "next_step": sampler.next_step, "run_id": sampler.run_id})
    report["group_size_guard"] = group_size_guard(args, model, data, trainer.train_dataset)

    # Run 2: a fresh trainer resumes from the mid-epoch checkpoint of step 2 (as after a crash during
    # step 3) and runs to the end of the epoch (4 steps of 3 prompts).
    updates2: list[dict[str, Any]] = []
    ckpt = work / "ckpt" / "global_step_2"
    trainer2 = build_trainer(compose(args, model, data, steps=6, resume=str(ckpt)), tok, policy, updates2)
    sampler2 = trainer2.train_dataloader.sampler
    trainer2.fit()
    report["runs"].append(
        {
            "updates": updates2,
            "next_step": sampler2.next_step,
            "run_id": sampler2.run_id,
            "global_steps": trainer2.global_steps,
        }
    )
    report["fed"] = policy.record
    common.emit(report)


if __name__ == "__main__":
    main()
