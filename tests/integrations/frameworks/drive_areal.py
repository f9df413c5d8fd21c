"""Drive AReaL's asynchronous rollout on CPU against a real selector service.

Runs inside the AReaL venv. AReaL's own code does everything between selection and the update:
``RemoteSGLangEngine`` (its HTTP client for SGLang servers) with its ``WorkflowExecutor``, staleness
manager and dispatcher, ``prepare_batch`` pulling from the train data loader that
``SelectorPPOTrainer._create_dataloader`` builds, ``GroupedRolloutWorkflow`` over ``RLVRWorkflow`` with
AReaL's GSM8K reward (math-verify), and ``PPOActor.compute_advantages`` on each batch. Faked: the SGLang
server (a loopback HTTP server answering ``/generate`` from `common.Policy`; it needs GPUs), and the
weight update between steps (``set_version``). Each episode's response is delayed so that, as on real
hardware, the rollout runs ahead of training: with ``max_head_offpolicyness=1`` the next step is
selected while the current step's groups are still generating, and their rewards arrive late.

Four steps run; the data loader's state is saved after step 2 and a fresh loader resumes from it.

Usage: python drive_areal.py --url URL --dataset NAME --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from tests.integrations.frameworks import common

N = 4  # samples per prompt (gconfig.n_samples)
BATCH = 3  # prompts per step
SIZE = 12
STALENESS = 1


class LateGate:
    """Holds the first response of a run until the data loader has selected the step after the
    first one, so that the first group reports after the next step was selected whatever the
    machine's load (on a loaded host a fixed delay alone let every group finish before the next
    select). Bounded: after ``timeout`` seconds the response goes anyway."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self.lock = threading.Lock()
        self.arm(lambda: True)

    def arm(self, ready: Any) -> None:
        with self.lock:
            self.ready, self.held = ready, False

    def wait(self) -> None:
        with self.lock:
            if self.held:
                return
            self.held = True
            ready = self.ready
        deadline = time.monotonic() + self.timeout
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)


def serve_sglang(policy: common.Policy, gate: LateGate) -> tuple[ThreadingHTTPServer, str]:
    """A loopback stand-in for an SGLang server: ``/health`` and non-streaming ``/generate``."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, body: dict[str, Any]) -> None:
            raw = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            self._send({})

        def do_POST(self) -> None:
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path != "/generate":
                self._send({})
                return
            with lock:
                tokens = policy.respond_ids(payload["input_ids"])
            # Generation takes time: later prompts are submitted while these are still running.
            gate.wait()
            time.sleep(0.3)
            self._send(
                {
                    "text": "",
                    "meta_info": {
                        "finish_reason": {"type": "stop"},
                        "output_token_logprobs": [[-0.5, t, None] for t in tokens],
                        "prompt_tokens": len(payload["input_ids"]),
                        "completion_tokens": len(tokens),
                    },
                }
            )

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


def train_dataset() -> Any:
    import datasets

    order = [5, 0, 11, 3, 8, 1, 10, 6, 2, 9, 4, 7]  # rows in another order than their ids
    return datasets.Dataset.from_list(
        [
            {
                "messages": [{"role": "user", "content": common.question(pid)}],
                "answer": str(common.answer_of(pid)),
                "prompt_id": pid,
            }
            for pid in order
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--max-lag", type=int, default=STALENESS + 2)
    args = parser.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)

    from areal.api.cli_args import (
        GenerationHyperparameters,
        InferenceEngineConfig,
        PPOActorConfig,
        TrainDatasetConfig,
    )
    from areal.engine.sglang_remote import RemoteSGLangEngine
    from areal.reward.gsm8k import gsm8k_reward_fn
    from areal.trainer.ppo.actor import PPOActor
    from areal.workflow.rlvr import RLVRWorkflow

    from rlvr_selector_client.client import SelectorClient
    from rlvr_selector_client.integrations import areal as adapter

    model = common.model_dir(work)
    tok = common.tokenizer()
    policy = common.Policy(tok)
    gate = LateGate()
    server, address = serve_sglang(policy, gate)
    options = adapter.SelectorOptions(url=args.url, dataset=args.dataset, strategy="insight", seed=1)
    client = SelectorClient(args.url)
    data = train_dataset()
    gconfig = GenerationHyperparameters(n_samples=N, max_new_tokens=24, temperature=1.0)
    # SelectorPPOTrainer would build the actor engines (GPUs); its data-loader hook is what we call.
    trainer_class = adapter._trainer_class()
    shell = trainer_class.__new__(trainer_class)
    shell.selector, shell.selector_client = options, client
    shell.selector_max_lag = args.max_lag
    shell.config = type("Config", (), {"gconfig": gconfig})()
    actor = PPOActor(PPOActorConfig(experiment_name="selector", trial_name="t0"), engine=None)
    report: dict[str, Any] = {"areal": metadata.version("areal"), "runs": []}

    def engine() -> Any:
        config = InferenceEngineConfig(
            experiment_name="selector",
            trial_name="t0",
            consumer_batch_size=BATCH,
            max_head_offpolicyness=STALENESS,
            max_concurrent_rollouts=2 * BATCH,
            tokenizer_path=str(model),
            setup_timeout=60,
        )
        rollout = RemoteSGLangEngine(config)
        rollout.initialize(addr=address, train_data_parallel_size=1)
        return rollout

    def run(loader: Any, steps: int, start_version: int) -> dict[str, Any]:
        first_step = loader.sampler.next_step
        gate.arm(lambda: loader.sampler.next_step >= first_step + 2)
        rollout = engine()
        workflow = shell.selector_workflow(
            RLVRWorkflow(reward_fn=gsm8k_reward_fn, gconfig=gconfig, tokenizer=tok)
        )
        batches = []
        try:
            for step in range(steps):
                rollout.set_version(start_version + step)
                trajectories = rollout.prepare_batch(loader, workflow=workflow, group_size=N)
                advantaged = actor.compute_advantages(trajectories)
                batches.append(
                    {
                        "rewards": [t["rewards"].flatten().tolist() for t in advantaged],
                        "has_advantages": all("advantages" in t for t in advantaged),
                        "versions": sorted(
                            {int(v) for t in trajectories for v in t["versions"].flatten() if v >= 0}
                        ),
                    }
                )
                if step == 1 and start_version == 0:
                    report["checkpoint"] = loader.state_dict()
            # Prompts the dispatcher pulled ahead are still generating: let them finish and report.
            deadline = time.monotonic() + 60
            while workflow.in_flight and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            rollout.destroy()
        return {
            "batches": batches,
            "reported": workflow.reported,
            "lost": workflow.lost,
            "pending": [list(k) for k in workflow.pending],
            "next_step": loader.sampler.next_step,
        }

    first_loader = shell._create_dataloader(data, TrainDatasetConfig(batch_size=BATCH, path="x"), 0, 1)
    report["runs"].append(run(first_loader, steps=2, start_version=0))
    # Resume: a fresh loader from the state saved after step 2 (as after a restart).
    second_loader = shell._create_dataloader(data, TrainDatasetConfig(batch_size=BATCH, path="x"), 0, 1)
    second_loader.load_state_dict(report["checkpoint"])
    report["runs"].append(run(second_loader, steps=2, start_version=2))
    report["fed"] = policy.record
    report["steps_per_epoch"] = first_loader.sampler.steps_per_epoch()
    server.shutdown()
    common.emit(report)


if __name__ == "__main__":
    main()
