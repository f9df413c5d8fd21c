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

The late cases (`LATE_CASES`) make groups finish long after they were selected: one response of some
groups takes as long as 3-4 updates (`LongResponses`, keyed on the weights version and the prompt),
the trainer is killed in the update of step 5 while groups are still generating, and a new process
(this script with ``--child``, on the same Ray cluster) resumes from the checkpoint of step 4 on a
fresh TransferQueue: verl re-issues the groups that were in flight at the checkpoint, under the service
steps they were selected at.

Usage: python drive_verl_v1.py --url URL --dataset-prefix P --workdir DIR [--cases a,b,...]
Prints ``DRIVER-REPORT {json}`` last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
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

#: Cases whose groups finish late: one response of some groups takes as long as several updates
#: (`LongResponses`), and the run is killed in an update while groups are still generating, then
#: resumed from its last checkpoint in a new process (`run_late_case`). Their shape: case -> (trainer
#: mode, overrides, prompts per step, rollout.n, rollout budget (budget, min, max)).
LATE_CASES: dict[str, tuple[str, list[str], int, int, tuple[int, int, int]]] = {
    "colocate_async_late": (
        "colocate_async",
        [
            "algorithm.filter_groups.enable=True",
            # Finished groups that span more than one update are evicted as stale (after their report).
            "trainer.v1.sampler.max_off_policy_threshold=1",
            "trainer.v1.sampler.max_off_policy_strategy=drop",
            "+data.sampler.selector.strategy=dps",
        ],
        4,
        3,
        (36, 2, 12),
    ),
}
#: The late cases' first run trains 4 steps (checkpoints at 2 and 4) and is killed in the update of
#: step 5; the resumed run continues from global_step_4 to step 6.
LATE_STEPS, LATE_CRASH_STEP = 6, 5


def compose(
    url: str, dataset: str, work: Path, model: Path, data: Path, case: str, steps: int, resume: str | None
) -> Any:
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    n, batch, budget_overrides = N, BATCH, []
    if case in LATE_CASES:
        mode, extra, batch, n, (total, low, high) = LATE_CASES[case]
        budget = False
        budget_overrides = [
            f"+data.sampler.selector.rollout_budget={total}",
            f"+data.sampler.selector.rollout_min={low}",
            f"+data.sampler.selector.rollout_max={high}",
            "+data.sampler.selector.rollout_policy=posterior",
        ]
    else:
        mode, extra, _, budget = CASES[case]
    strategy = [o for o in extra if o.startswith("+data.sampler.selector.strategy=")]
    extra = [o for o in extra if o not in strategy] + budget_overrides
    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    overrides = [
        f"+data.sampler.selector.url={url}",
        f"+data.sampler.selector.dataset={dataset}",
        *(strategy or ["+data.sampler.selector.strategy=insight"]),
        f"+data.sampler.selector.rollouts_per_prompt={n}",
        f"trainer.v1.trainer_mode={mode}",
        "data.dataloader_num_workers=0",
        f"data.train_files={data}",
        f"data.val_files={data}",
        f"data.train_batch_size={batch}",
        "data.max_prompt_length=48",
        "data.max_response_length=24",
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.model.path={model}",
        f"actor_rollout_ref.rollout.n={n}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.prompt_length=48",
        "actor_rollout_ref.rollout.response_length=24",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
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


class LongResponses:
    """Which responses take as long as several trainer updates, as a long reasoning trace does: at a
    weights version listed in ``spans``, the first response of each of the first ``len(spans[v])``
    prompts asked for is answered only once the weights are ``spans[v][i]`` versions newer (the other
    responses of those groups answer at once). Keyed on the version a response starts at and its prompt,
    so it does not depend on how fast the host is; a resumed process starts at a later version and
    answers every response at once."""

    def __init__(self, spans: dict[int, tuple[int, ...]]) -> None:
        self.spans = spans
        self.picked: dict[int, list[int]] = {}
        self.waited: list[dict[str, int]] = []

    def span(self, version: int, prompt_id: int) -> int:
        spans = self.spans.get(version, ())
        picked = self.picked.setdefault(version, [])
        if prompt_id in picked or len(picked) >= len(spans):
            return 0
        picked.append(prompt_id)
        return spans[len(picked) - 1]

    async def wait(self, version: int, prompt_id: int, timeout: float = 120.0) -> None:
        span = self.span(version, prompt_id)
        if not span:
            return
        deadline = time.monotonic() + timeout
        while Weights.version < version + span and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.waited.append(
            {"prompt_id": prompt_id, "from_version": version, "to_version": Weights.version, "span": span}
        )


class FakeLLMClient:
    """verl's LLM server client and the servers behind it (vLLM on GPUs): answers from `Policy`, tagged
    with the weights version as verl's ``LLMServerClient.generate`` tags real outputs. With
    `LongResponses`, some responses take as long as several updates (the colocate-async client resumes
    an aborted request under the new weights, ``FullyAsyncLLMServerClient``: the response then spans
    the versions it ran under)."""

    def __init__(self, policy: common.Policy, long: LongResponses | None = None) -> None:
        self.policy = policy
        self.long = long
        #: Set when the trainer is killed (`Killed`): no response is answered any more.
        self.frozen = False

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: Any, **_: Any
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        await asyncio.sleep(0.01)  # let other sessions interleave, as a server's batch would
        start = Weights.version
        if self.long is not None:
            text = self.policy.tok.decode(list(prompt_ids), skip_special_tokens=False)
            await self.long.wait(start, common.prompt_id_of(text))
        while self.frozen:  # the trainer was killed: this response never comes back
            await asyncio.sleep(3600)
        version = Weights.version
        tokens = self.policy.respond_ids(list(prompt_ids))
        return TokenOutput(
            token_ids=tokens,
            log_probs=[0.0] * len(tokens),  # asked for (rollout.calculate_log_probs), as vLLM answers
            extra_fields={"global_steps": version, "min_global_steps": start, "max_global_steps": version},
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


def fake_actor_workers(sink: list[dict[str, Any]], crash: Any = None) -> Any:
    """verl's FSDP actor worker group behind ``tqbridge`` (KVBatchMeta in, TransferQueue fields out).
    ``crash(update_index)``, when given, is called before each update (it may end the process)."""
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
            if crash is not None:
                crash(len(sink))
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


def fake_setup(
    trainer: Any, updates: list[dict[str, Any]], reward_workers: list[Any], crash: Any = None
) -> None:
    """``PPOTrainer._setup`` without its GPU parts: verl's tokenizer, dataloaders and dump executor, the
    fake worker group and rollout managers, verl's reward worker; then verl's ``_load_checkpoint``."""
    trainer._init_tokenizer()
    trainer._init_dataloader()
    trainer._init_dump_executor()
    trainer.ref_in_actor = False
    trainer.resource_pool_manager = FakeResources()
    trainer.actor_rollout_wg = fake_actor_workers(updates, crash)

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


def agent_loop_manager(config: Any, reward_workers: list[Any], llm: FakeLLMClient) -> Any:
    """verl's AgentLoopManagerTQ over one AgentLoopWorkerTQ (its own event loop) whose LLM client is
    `FakeLLMClient`; only the dispatch to the worker differs (no Ray actor to call)."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

    worker_class = plain_class(AgentLoopWorkerTQ)
    worker = Actor(
        lambda: worker_class(
            config,
            llm_client=llm,
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


def groups_in_flight() -> list[dict[str, Any]]:
    """The training groups TransferQueue holds as pending or running: uid, service step, prompt id, verl's
    step (``global_steps`` tag) and the rewards of the responses already stored."""
    import transfer_queue as tq

    from rlvr_selector_client.integrations.verl_v1 import PROMPT_FIELD, STEP_FIELD

    items = (tq.kv_list("train") or {}).get("train", {})
    uids = sorted(
        k for k, t in items.items() if t.get("is_prompt") and t.get("status") in ("pending", "running")
    )
    if not uids:
        return []
    prompts = tq.kv_batch_get(keys=uids, partition_id="train", select_fields=[STEP_FIELD, PROMPT_FIELD])
    groups = {
        uid: {
            "uid": uid,
            "step": int(step),
            "prompt_id": int(pid),
            "global_steps": items[uid].get("global_steps"),
            "rewards": [],
        }
        for uid, step, pid in zip(
            uids, prompts[STEP_FIELD].tolist(), prompts[PROMPT_FIELD].tolist(), strict=True
        )
    }
    keys = [k for k, t in items.items() if not t.get("is_prompt") and k.split("_", 1)[0] in groups]
    if keys:
        scores = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rm_scores"])["rm_scores"]
        for key, score in zip(keys, list(scores), strict=True):
            groups[key.split("_", 1)[0]]["rewards"].append(float(score.sum().item()))
    return list(groups.values())


def run(
    args: argparse.Namespace,
    case: str,
    dataset: str,
    model: Path,
    data: Path,
    steps: int,
    resume: str | None,
    work: Path,
    long: LongResponses | None = None,
    crash_step: int | None = None,
) -> dict[str, Any]:
    """One trainer run through verl's ``init()`` and ``fit()``. With ``crash_step``, the trainer is killed
    in the update of that step (`Killed`, carrying the run's report): responses still generating never
    come back, and nothing more is reported."""
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
    crash = None

    trainer = trainer_class(config=config)
    trainer._setup = lambda: fake_setup(trainer, updates, reward_workers, crash)
    buffer = trainer.replay_buffer
    evict = buffer._evict_terminal_groups

    def recorded_evict(global_steps: int, partition_id: str, reasons: Any) -> Any:
        stale, filtered = reasons[0], reasons[1]
        evicted["stale"].extend([uid] for uid in sorted(stale))
        evicted["filtered"].extend([uid] for uid in sorted(filtered))
        return evict(global_steps, partition_id, reasons)

    buffer._evict_terminal_groups = recorded_evict
    selections: list[dict[str, Any]] = []

    def result() -> dict[str, Any]:
        sampler = trainer.train_dataloader.sampler
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
            "reissued": reissued,
            "evicted": {k: [u[0] for u in v] for k, v in evicted.items()},
            "next_step": sampler.next_step,
            "run_id": sampler.run_id,
            "selections": selections,
            "max_lag": trainer_max_lag(args.url, dataset),
            "global_steps": trainer.global_steps,
            "fed": policy.record,
            "long_responses": long.waited if long is not None else [],
        }

    llm = FakeLLMClient(policy, long)
    if crash_step is not None:

        def crash(update_index: int) -> None:
            if trainer.global_steps != crash_step:
                return
            # Killed in the update of `crash_step`: responses still generating never come back. The
            # groups that finished are reported first (the buffer's poll, as verl's next sample would),
            # then what is still in flight is recorded with the responses it already has.
            llm.frozen = True
            deadline = time.monotonic() + 30
            while True:
                buffer._sync_metadata_from_transfer_queue()
                inflight = groups_in_flight()
                stored = sorted(
                    [
                        [r["prompt_id"], x]
                        for r in buffer.reports
                        if r["uid"] not in restored
                        for x in r["rewards"]
                    ]
                    + [[g["prompt_id"], x] for g in inflight for x in g["rewards"]]
                )
                # Responses answered before the freeze are scored and stored within moments.
                if stored == sorted(policy.record) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            buffer.selector_sampler = None  # a dead process reports nothing more
            out = json.loads(json.dumps(result()))  # as it stood: the abandoned threads live on
            out.update(crashed_in_step=trainer.global_steps, in_flight_at_crash=inflight)
            raise Killed(out)

    trainer.init()
    restored = [
        uid
        for uid, tag in ((tq.kv_list("train") or {}).get("train", {})).items()
        if tag.get("is_prompt") and tag.get("status") == "finished"
    ]
    # In-flight groups a resumed run's TransferQueue brought back: fit() re-issues them
    # (trainer_base.py:910-946, ``_reissue_inflight_prompts``) with the fields they were submitted with.
    reissued = [{k: g[k] for k in ("uid", "step", "prompt_id")} for g in groups_in_flight()]
    sampler = trainer.train_dataloader.sampler
    select = sampler.client.select

    def recorded_select(*a: Any, **kw: Any) -> Any:
        answer = select(*a, **kw)
        selections.append({"step": answer.step, "prompt_ids": answer.prompt_ids, "rollouts": answer.rollouts})
        return answer

    sampler.client.select = recorded_select
    manager = agent_loop_manager(config, reward_workers, llm)
    trainer.fit(manager)
    wait_settled()
    buffer._sync_metadata_from_transfer_queue()  # groups that finished after the last step
    return result()


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


class Killed(BaseException):
    """The trainer killed in an update (`run`'s ``crash_step``); ``args[0]`` is its run's report. A
    BaseException: verl catches no such thing on its way out of ``fit()``."""


def child_run(args: argparse.Namespace, spec: dict[str, Any]) -> dict[str, Any]:
    """One run of a late case in a new process of its own (this script with ``--child``), on the Ray
    cluster and TransferQueue this process started; returns its report."""
    out = Path(spec["out"])
    log = out.with_suffix(".log")
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--url",
        args.url,
        "--dataset-prefix",
        args.dataset_prefix,
        "--workdir",
        args.workdir,
        "--child",
        json.dumps(spec),
    ]
    with log.open("w") as sink:
        proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, timeout=900)
    if proc.returncode != 0 or not out.exists():
        tail = log.read_text()[-6000:]
        raise RuntimeError(f"the {spec['case']} run in a new process exited {proc.returncode}:\n{tail}")
    return json.loads(out.read_text())


def child_main(args: argparse.Namespace) -> None:
    """The ``--child`` process: joins the parent's Ray cluster and TransferQueue and runs one trainer."""
    import ray
    import transfer_queue as tq

    spec = json.loads(args.child)
    root = Path(args.workdir)
    model = common.model_dir(root)
    data = root / "train.parquet"
    ray.init(address=spec["ray_address"], include_dashboard=False, log_to_driver=False)
    tq.init()  # finds the parent's controller and connects (transfer_queue/interface.py:110-140)
    long = LongResponses({int(k): tuple(v) for k, v in spec["long"].items()}) if spec.get("long") else None
    report = run(
        args,
        spec["case"],
        spec["dataset"],
        model,
        data,
        steps=spec["steps"],
        resume=spec.get("resume"),
        work=Path(spec["work"]),
        long=long,
    )
    report["pid"] = os.getpid()
    Path(spec["out"]).write_text(json.dumps(report))
    sys.stdout.flush()
    os._exit(0)  # the parent owns the cluster and TransferQueue: leave them running


#: Which responses of a late case take several updates (`LongResponses`): at weights version 0 (the
#: warm-up and step 1) the first response of one group waits 4 updates and of another 3; at version 2
#: (step 3) one waits 3. The first still runs at the checkpoint of step 4 and finishes in step 5 (the
#: killed trainer reports it, the resumed one rolls it out again); the last runs at the checkpoint and
#: is still running when the trainer is killed in step 5: only the resumed process finishes it.
LONG_SPANS: dict[int, tuple[int, ...]] = {0: (4, 3), 2: (3,)}


def run_late_case(
    args: argparse.Namespace,
    case: str,
    dataset: str,
    model: Path,
    data: Path,
    work: Path,
    ray_address: str,
) -> list[dict[str, Any]]:
    """A late case: a trainer killed in the update of step `LATE_CRASH_STEP` while groups are generating
    (in this process: its trainer, buffer and generation are abandoned, as a dead process leaves them),
    then, on a fresh TransferQueue (the cluster restarted), a new process resuming from the last
    checkpoint, as ``trainer.resume_mode=auto`` would. The killed run is this process's, so that only
    the resumed one pays for a new process's imports."""
    clear_transfer_queue()
    long = LongResponses(LONG_SPANS)
    try:
        run(args, case, dataset, model, data, LATE_STEPS, None, work, long=long, crash_step=LATE_CRASH_STEP)
    except Killed as killed:
        first: dict[str, Any] = killed.args[0]
    else:
        raise RuntimeError(f"the {case} run was not killed in step {LATE_CRASH_STEP}")
    first["pid"] = os.getpid()
    clear_transfer_queue()  # the crash: the cluster and its TransferQueue are gone
    latest = (work / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip()
    spec = {
        "case": case,
        "dataset": dataset,
        "work": str(work),
        "ray_address": ray_address,
        "long": {str(k): list(v) for k, v in LONG_SPANS.items()},
        "steps": LATE_STEPS,
        "resume": str(work / "ckpt" / f"global_step_{latest}"),
        "out": str(work / "resumed.json"),
    }
    second = child_run(args, spec)
    second["resumed_from"] = int(latest)
    return [first, second]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset-prefix", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--cases", default=",".join([*CASES, *LATE_CASES]))
    parser.add_argument("--child", help="internal: run one trainer of a late case (JSON spec)")
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    root = Path(args.workdir)
    root.mkdir(parents=True, exist_ok=True)
    model = common.model_dir(root)
    data = root / "train.parquet"
    write_parquet(data)

    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    started = time.monotonic()
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
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
            if case in LATE_CASES:
                address = context.address_info["gcs_address"]
                runs = run_late_case(args, case, dataset, model, data, work, address)
                report["cases"][case] = {"dataset": dataset, "mode": LATE_CASES[case][0], "runs": runs}
                report["timing"][case] = round(time.monotonic() - case_started, 1)
                continue
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
