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

The late case (`LateCase`, on its own service dataset ``<NAME>-late`` whose ``max_lag`` is
`LATE_MAX_LAG`) makes groups finish long after they were selected and resumes in a new process: every
sample of some groups is answered only once the rollout's weights version is several versions past the
one the group started at (`Holds`, keyed on versions, not on time). A first process (this script with
``--late-child``) trains `LATE_FIRST_STEPS` steps, saves the data loader's state after step
`LATE_CHECKPOINT_STEP` as AReaL's recover does, and dies (``os._exit``) while a held group is still
generating; a second process loads that state and trains `LATE_RESUMED_STEPS` more steps, again with a
held group. AReaL keeps no rollout in its checkpoint (``RecoverInfo``, areal/utils/recover.py:256-262,
holds the data loader's state and no rollout; ``load`` restores the loader, recover.py:310, and sets the
version to the saved step + 1, recover.py:319-326): what was generating when the process died is not
re-issued, since the dispatcher had already pulled it from the loader, so the group dies unfinished and
is never reported, and nothing it generated is fed.

Usage: python drive_areal.py --url URL --dataset NAME --workdir DIR
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from examples import areal_grpo
from tests.integrations.frameworks import common

N = 4  # samples per prompt (gconfig.n_samples)
BATCH = 3  # prompts per step
SIZE = 12
STALENESS = 1

#: The late case's dataset accepts reports at most this many steps late without ``selected_step``: a
#: held group comes back 3 or more steps late, so every one of them is filed at the open step.
LATE_MAX_LAG = 1
#: The late case's first process trains this many steps (versions 0..5), saves the loader's state once
#: step LATE_CHECKPOINT_STEP (0-based) is trained, and dies with a group still generating; the resumed
#: process trains LATE_RESUMED_STEPS more.
LATE_FIRST_STEPS = 6
LATE_CHECKPOINT_STEP = 2
LATE_RESUMED_STEPS = 4
#: Held groups, per process: (first version, span): the first group that starts at a version >= first
#: version is answered once the weights are ``span`` versions newer than the version it started at.
#: The first process's last hold outlives it (it is generating when the process dies).
#: The file the driver creates once the first process has died; the resumed one waits for it.
FIRST_DIED = "first-died"
LATE_HOLDS = {"first": [(0, 3), (1, 4), (3, 100)], "resumed": [(0, 3)]}


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
        wait_for(ready, self.timeout)


class Holds:
    """Long generations, keyed on weights versions: ``version`` is the rollout's weights version (the
    driver sets it with ``set_version``). For each ``(first, span)`` of ``spans``, in order, the first
    group asked for at a version >= ``first`` (all ``N`` samples of the prompt's next group) is answered
    only once ``version`` reaches the version it started at + ``span``. Nothing is answered for a held
    group before it is released, so a group that dies held fed nothing."""

    def __init__(self, spans: list[tuple[int, int]]) -> None:
        self.spans = list(spans)
        self.version = 0
        self.lock = threading.Lock()
        self.asked: dict[int, int] = {}  # prompt id -> its sample requests so far
        self.held: dict[tuple[int, int], dict[str, int]] = {}  # (prompt id, group index) -> the hold
        self.waits: list[dict[str, int]] = []
        self.released = False

    def until(self, prompt_id: int) -> dict[str, int] | None:
        with self.lock:
            sample = self.asked.get(prompt_id, 0)
            self.asked[prompt_id] = sample + 1
            key = (prompt_id, sample // N)
            hold = self.held.get(key)
            if hold is None and sample % N == 0 and self.spans and self.version >= self.spans[0][0]:
                _, span = self.spans.pop(0)
                hold = {"prompt_id": prompt_id, "from_version": self.version, "span": span}
                self.held[key] = hold
            return hold

    def wait(self, prompt_id: int, timeout: float = 120.0) -> None:
        hold = self.until(prompt_id)
        if hold is None:
            return
        deadline = time.monotonic() + timeout
        while (
            not self.released
            and self.version < hold["from_version"] + hold["span"]
            and time.monotonic() < deadline
        ):
            time.sleep(0.02)
        with self.lock:
            if "to_version" not in hold:
                hold["to_version"] = self.version
                self.waits.append(hold)

    def holding(self) -> int:
        """Groups held now."""
        with self.lock:
            return sum(1 for hold in self.held.values() if "to_version" not in hold)

    def release(self) -> None:
        self.released = True

    def start(self, version: int) -> None:
        """The run starts at weights ``version``: the spans' first versions count from it."""
        with self.lock:
            self.spans = [(version + first, span) for first, span in self.spans]
            self.version = version


def serve_sglang(
    policy: common.Policy, gate: LateGate, holds: Holds | None = None
) -> tuple[ThreadingHTTPServer, str]:
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
            if holds is not None:  # the answer is made once released: a group that dies held fed nothing
                text = policy.tok.decode(payload["input_ids"], skip_special_tokens=False)
                holds.wait(common.prompt_id_of(text))
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
    """The example's train set (examples/areal_grpo.py: prompt ids from `with_prompt_ids`), then its rows
    put in another order: the service id is the prompt_id column, never the row."""
    import datasets

    rows = datasets.Dataset.from_list(
        [
            {
                "messages": [{"role": "user", "content": common.question(k)}],
                "answer": str(common.answer_of(k)),
            }
            for k in range(12)
        ]
    )
    return areal_grpo.with_prompt_ids(rows).select([5, 0, 11, 3, 8, 1, 10, 6, 2, 9, 4, 7])


class Harness:
    """What a run needs, built once per process: the fake SGLang server, the trainer shell whose data-loader
    hook builds the selector's loader, AReaL's actor for the advantages, and a rollout engine factory."""

    def __init__(
        self, args: argparse.Namespace, max_lag: int, holds: Holds | None = None, root: Path | None = None
    ) -> None:
        from areal.api.cli_args import GenerationHyperparameters, PPOActorConfig
        from areal.trainer.ppo.actor import PPOActor

        from rlvr_selector_client.client import SelectorClient
        from rlvr_selector_client.integrations import areal as adapter

        work = root or Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
        self.model = common.model_dir(work)
        self.tok = common.tokenizer()
        self.policy = common.Policy(self.tok)
        self.gate = LateGate()
        self.server, self.address = serve_sglang(self.policy, self.gate, holds)
        options = adapter.SelectorOptions(url=args.url, dataset=args.dataset, strategy="insight", seed=1)
        self.client = SelectorClient(args.url)
        self.data = train_dataset()
        self.gconfig = GenerationHyperparameters(n_samples=N, max_new_tokens=24, temperature=1.0)
        # SelectorPPOTrainer would build the actor engines (GPUs); its data-loader hook is what we call.
        trainer_class = adapter._trainer_class()
        self.shell = trainer_class.__new__(trainer_class)
        self.shell.selector, self.shell.selector_client = options, self.client
        self.shell.selector_max_lag = max_lag
        self.shell.config = type("Config", (), {"gconfig": self.gconfig})()
        self.actor = PPOActor(PPOActorConfig(experiment_name="selector", trial_name="t0"), engine=None)
        self.new_workflow = lambda: areal_grpo.workflow(self.shell, self.shell.config, self.tok)

    def loader(self) -> Any:
        from areal.api.cli_args import TrainDatasetConfig

        return self.shell._create_dataloader(self.data, TrainDatasetConfig(batch_size=BATCH, path="x"), 0, 1)

    def engine(self) -> Any:
        from areal.api.cli_args import InferenceEngineConfig
        from areal.engine.sglang_remote import RemoteSGLangEngine

        config = InferenceEngineConfig(
            experiment_name="selector",
            trial_name="t0",
            consumer_batch_size=BATCH,
            max_head_offpolicyness=STALENESS,
            max_concurrent_rollouts=2 * BATCH,
            tokenizer_path=str(self.model),
            setup_timeout=60,
        )
        rollout = RemoteSGLangEngine(config)
        rollout.initialize(addr=self.address, train_data_parallel_size=1)
        return rollout

    def train_step(self, rollout: Any, loader: Any, workflow: Any) -> dict[str, Any]:
        trajectories = rollout.prepare_batch(loader, workflow=workflow, group_size=N)
        advantaged = self.actor.compute_advantages(trajectories)
        return {
            "rewards": [t["rewards"].flatten().tolist() for t in advantaged],
            "has_advantages": all("advantages" in t for t in advantaged),
            "versions": sorted({int(v) for t in trajectories for v in t["versions"].flatten() if v >= 0}),
        }


def wait_for(condition: Any, timeout: float = 60.0, steady: float = 0.0) -> bool:
    """Whether ``condition()`` became true (and stayed so for ``steady`` seconds) within ``timeout``."""
    deadline = time.monotonic() + timeout
    since = None
    while time.monotonic() < deadline:
        if condition():
            since = since if since is not None else time.monotonic()
            if time.monotonic() - since >= steady:
                return True
        else:
            since = None
        time.sleep(0.05)
    return False


def late_child(args: argparse.Namespace) -> None:
    """One process of the late case (see the module docstring): ``--late-child first`` or ``resumed``."""
    role = args.late_child
    work = Path(args.workdir)
    holds = Holds(LATE_HOLDS[role])
    h = Harness(args, LATE_MAX_LAG, holds, root=work / role)  # a model folder each: both start at once
    state = None
    if role == "resumed":
        if not wait_for(lambda: (work / FIRST_DIED).exists(), timeout=600):
            raise SystemExit("the first process of the late case never ended")
        state = pickle.loads((work / "late-checkpoint.pkl").read_bytes())
    start_version = state["version"] if state else 0
    holds.start(start_version)
    loader = h.loader()
    if state:
        # What AReaL's RecoverHandler.load does (areal/utils/recover.py:310, 319-326) and its trainer
        # after it (areal/trainer/rl_trainer.py:411-418): the loader's state, the version the saved step
        # trained, and the staleness manager told of that version.
        loader.load_state_dict(state["loader"])
    rollout = h.engine()
    if state:
        rollout.set_version(start_version)
        rollout.workflow_executor.staleness_manager.on_version_recovered(start_version)
    workflow = h.new_workflow()
    steps = LATE_FIRST_STEPS if role == "first" else LATE_RESUMED_STEPS
    out: dict[str, Any] = {"role": role, "pid": os.getpid(), "batches": [], "start_version": start_version}
    rollout.set_version(start_version)
    holds.version = start_version
    for step in range(steps):
        out["batches"].append(h.train_step(rollout, loader, workflow))
        # The weight update as AReaL's trainer makes it: rollout paused (areal/trainer/rl_trainer.py:754),
        # the new version set (rl_trainer.py:775), the checkpoint saved, rollout resumed (rl_trainer.py:859).
        # Not a bare set_version: the dispatcher's submitting thread sleeps on a condition that only new
        # inputs, results, pause and resume wake (areal/infra/workflow_executor.py:440-448, 491-508), so
        # with every other rollout done and held groups running, a higher version alone never reaches it.
        rollout.pause()
        version = start_version + step + 1
        rollout.set_version(version)
        holds.version = version
        if role == "first" and step == LATE_CHECKPOINT_STEP:
            # AReaL's checkpoint holds the loader's state (recover.py:256-262, pickled at recover.py:91-93),
            # and a resumed run starts at the version after the saved step (recover.py:319).
            (work / "late-checkpoint.pkl").write_bytes(
                pickle.dumps({"loader": loader.state_dict(), "version": version})
            )
            out["checkpoint_next_step"] = loader.sampler.next_step
        rollout.resume()
    if role == "first":
        # Die while the last held group is generating, once every other started sample has finished
        # (those groups are reported; the held one has fed nothing).
        rollout.pause()
        out["quiet"] = wait_for(
            lambda: holds.holding() >= 1 and workflow.in_flight == N * holds.holding(), steady=1.0
        )
        out["died_holding"] = holds.holding()
    else:
        holds.release()
        out["quiet"] = wait_for(lambda: workflow.in_flight == 0)
    out.update(
        reported=list(workflow.reported),
        lost=list(workflow.lost),
        pending=[list(k) for k in workflow.pending],
        next_step=loader.sampler.next_step,
        waits=list(holds.waits),
        fed=list(h.policy.record),
        run_id=workflow.run_id,
    )
    if role == "first":
        common.emit(out)
        # A crash: nothing shut down, the held generation still running. Only AReaL's reward workers are
        # ended first (a ProcessPoolExecutor, areal/api/reward_api.py:95, that its atexit hook shuts down,
        # reward_api.py:98-111, and os._exit skips): left alone they would outlive this process.
        from areal.api.reward_api import AsyncRewardWrapper

        AsyncRewardWrapper._atexit_shutdown_all()
        os._exit(0)
    rollout.destroy()
    h.server.shutdown()
    common.emit(out)


class LateCase:
    """The late case's two processes of this script, both started at once so that the resumed one's
    imports overlap the first one's run (and both overlap this process's own runs): the resumed one
    waits, imports done, until this process has seen the first one die (`FIRST_DIED`)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.work = Path(args.workdir) / "late"
        self.work.mkdir(parents=True, exist_ok=True)
        self.dataset = f"{args.dataset}-late"
        command = [sys.executable, __file__, "--url", args.url, "--dataset", self.dataset]
        self.procs = {}
        for role in ("first", "resumed"):
            # Output to files, not pipes: a worker a child leaves behind cannot hold a wait open.
            with (self.work / f"{role}.out").open("w") as out, (self.work / f"{role}.err").open("w") as err:
                self.procs[role] = subprocess.Popen(
                    [*command, "--workdir", str(self.work), "--late-child", role], stdout=out, stderr=err
                )

    def finish(self) -> dict[str, Any]:
        runs = []
        for role, proc in self.procs.items():
            try:
                code = proc.wait(timeout=600)
            finally:
                if role == "first":
                    (self.work / FIRST_DIED).touch()
            output = (self.work / f"{role}.out").read_text()
            lines = [line for line in output.splitlines() if line.startswith("DRIVER-REPORT ")]
            if code != 0 or not lines:
                sys.stderr.write(output[-4000:] + (self.work / f"{role}.err").read_text()[-8000:])
                for other in self.procs.values():
                    if other.poll() is None:
                        other.kill()
                raise SystemExit(f"the late case's {role} process failed (exit {code})")
            runs.append(json.loads(lines[-1].removeprefix("DRIVER-REPORT ")))
        return {
            "dataset": self.dataset,
            "max_lag": LATE_MAX_LAG,
            "runs": runs,
            "fed": [pair for run in runs for pair in run.pop("fed")],
        }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--max-lag", type=int, default=STALENESS + 2)
    parser.add_argument(
        "--late-child", choices=["first", "resumed"], help="internal: one process of the late case"
    )
    parser.add_argument("--no-late", action="store_true", help="skip the late case")
    args = parser.parse_args()
    if args.late_child:
        late_child(args)
        return

    late = None if args.no_late else LateCase(args)
    h = Harness(args, args.max_lag)
    gate = h.gate
    report: dict[str, Any] = {"areal": metadata.version("areal"), "runs": []}

    def run(loader: Any, steps: int, start_version: int) -> dict[str, Any]:
        first_step = loader.sampler.next_step
        gate.arm(lambda: loader.sampler.next_step >= first_step + 2)
        rollout = h.engine()
        workflow = h.new_workflow()
        batches = []
        try:
            for step in range(steps):
                rollout.set_version(start_version + step)
                batches.append(h.train_step(rollout, loader, workflow))
                if step == 1 and start_version == 0:
                    report["checkpoint"] = loader.state_dict()
            # Prompts the dispatcher pulled ahead are still generating: let them finish and report.
            wait_for(lambda: workflow.in_flight == 0)
        finally:
            rollout.destroy()
        return {
            "batches": batches,
            "reported": workflow.reported,
            "lost": workflow.lost,
            "pending": [list(k) for k in workflow.pending],
            "next_step": loader.sampler.next_step,
        }

    first_loader = h.loader()
    report["runs"].append(run(first_loader, steps=2, start_version=0))
    # Resume: a fresh loader from the state saved after step 2 (as after a restart).
    second_loader = h.loader()
    second_loader.load_state_dict(report["checkpoint"])
    report["runs"].append(run(second_loader, steps=2, start_version=2))
    report["fed"] = h.policy.record
    report["steps_per_epoch"] = first_loader.sampler.steps_per_epoch()
    h.server.shutdown()
    if late is not None:
        report["late"] = late.finish()
    common.emit(report)


if __name__ == "__main__":
    main()
