"""Drive OpenRLHF's own ``train_ppo_ray`` on CPU, through the selector's entry point, against a real service.

Runs inside the OpenRLHF venv (tests/integrations/frameworks/venvs.py). ``rlvr_selector_client.integrations.openrlhf.main``
is called with the command line docs/integrations.md gives users; it runs OpenRLHF's
``openrlhf.cli.train_ppo_ray`` (its argument parser and checks, ``train()``, a real local Ray cluster,
the ``PPOTrainer`` actor's ``fit()``: ``prepare_datasets``/``PromptDataset``/``setup_dataloader``,
``SamplesGenerator``, the rollout actor's ``generate_responses`` with OpenRLHF's
``SingleTurnAgentExecutor`` calling a ``reward_func`` file through ``--reward.remote_url``, dynamic
filtering when asked, ``RemoteExperienceMaker`` with ``group_norm`` advantages, checkpoint states).

Faked, because they need GPUs: the vLLM engine inside the rollout actor (a `common.Policy` answers;
OpenRLHF's ``RolloutRayActor`` methods run around it), and the DeepSpeed model actor groups
(``RayActorGroup``: log-probs are zeros, the PPO update records the advantages it was given, and
checkpoints keep OpenRLHF's ``client_states``). ``vllm`` and ``flash_attn`` cannot be installed
without CUDA: small stand-in packages provide the names OpenRLHF imports from them
(``SamplingParams``, ``TokensPrompt``, ``random_uuid``; flash-attn's padding helpers, never called).

Run 1 is preempted in its third PPO update (after the third step's rollouts were reported); run 2
loads the checkpoint of step 2 (``--ckpt.load_enable``) and finishes the 4-step epoch. With
``--filtering`` (``--algo.dynamic_filtering_enable``, only groups with mixed rewards train) the epoch
has 36 prompts, run 1 is preempted in its second update and run 2 resumes from the first.

Usage: python drive_openrlhf.py --url URL --dataset NAME --workdir DIR [--filtering]
Prints ``DRIVER-REPORT {json}`` last.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from examples import openrlhf_grpo  # noqa: E402
from tests.integrations.frameworks import common  # noqa: E402

N = 4  # rollouts per prompt
BATCH = 3  # prompts per step
SIZE = 12  # prompts in the dataset: 4 steps per epoch
CRASH_AT_UPDATE = 3
# With dynamic filtering only the partly solved third of the prompts trains: a larger epoch, preempted
# in the second update and resumed from the checkpoint of the first.
FILTERING_SIZE = 36
FILTERING_CRASH_AT_UPDATE = 2

VLLM_STUB = '''"""Stand-in for vLLM (needs CUDA): the names OpenRLHF's rollout code imports."""
__version__ = "0.29.0"


class SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)
        self.__dict__.setdefault("max_tokens", None)
        self.__dict__.setdefault("logprobs", None)
'''
FLASH_STUB = '''"""Stand-in for flash-attn (CUDA kernels): OpenRLHF imports these helpers at module level."""


def _unavailable(*args, **kwargs):
    raise NotImplementedError("flash-attn is not available on CPU")


index_first_axis = pad_input = rearrange = unpad_input = all_gather = _unavailable
'''


def write_stubs(root: Path) -> Path:
    stubs = root / "stubs"
    (stubs / "vllm").mkdir(parents=True, exist_ok=True)
    (stubs / "vllm" / "__init__.py").write_text(VLLM_STUB)
    (stubs / "vllm" / "inputs.py").write_text("def TokensPrompt(**kwargs):\n    return dict(kwargs)\n")
    (stubs / "vllm" / "utils.py").write_text(
        "import uuid\n\n\ndef random_uuid():\n    return uuid.uuid4().hex\n"
    )
    (stubs / "flash_attn" / "utils").mkdir(parents=True, exist_ok=True)
    (stubs / "flash_attn" / "__init__.py").write_text("")
    (stubs / "flash_attn" / "bert_padding.py").write_text(FLASH_STUB)
    (stubs / "flash_attn" / "utils" / "__init__.py").write_text("")
    (stubs / "flash_attn" / "utils" / "distributed.py").write_text(FLASH_STUB)
    return stubs


def write_data(path: Path, size: int) -> None:
    """The example's data (examples/openrlhf_grpo.py), rows in another order than their ids: the service
    id is the prompt_id column, never the row."""
    order = [5, 0, 11, 3, 8, 1, 10, 6, 2, 9, 4, 7]
    order = [block * 12 + pid for block in range(size // 12) for pid in reversed(order) if block % 2] + [
        block * 12 + pid for block in range(size // 12) for pid in order if not block % 2
    ]
    by_id = {row["prompt_id"]: row for row in openrlhf_grpo.records(size)}
    openrlhf_grpo.write_jsonl([by_id[pid] for pid in order], path)


# --------------------------------------------------------------------------------------------------
# Fakes for what needs a GPU
# --------------------------------------------------------------------------------------------------


class _Output:
    def __init__(self, token_ids: list[int], text: str) -> None:
        self.token_ids = token_ids
        self.text = text
        self.finish_reason = "stop"
        self.logprobs = None


class _RequestOutput:
    def __init__(self, output: _Output) -> None:
        self.outputs = [output]


class _OutputProcessor:
    def get_num_unfinished_requests(self) -> int:
        return 0


class FakeLLM:
    """vLLM's AsyncLLMEngine as OpenRLHF's rollout actor uses it; `common.Policy` answers, and every
    answer's expected reward is appended to ``record`` (a JSON-lines file the driver reads back)."""

    def __init__(self, model: str, record: str) -> None:
        self.tok = common.tokenizer()
        self.policy = common.Policy(self.tok)
        self.record = record
        self.output_processor = _OutputProcessor()

    async def generate(self, prompt: dict[str, Any], sampling_params: Any, request_id: str) -> Any:
        ids = self.policy.respond_ids(list(prompt["prompt_token_ids"]))
        with open(self.record, "a") as f:
            f.write(json.dumps(self.policy.record[-1]) + "\n")
        yield _RequestOutput(_Output(ids, self.tok.decode(ids, skip_special_tokens=False)))


def fake_create_vllm_engines(
    num_engines: int, tensor_parallel_size: int, pretrain: str, *args: Any, **kwargs: Any
):
    """Stands in for ``create_vllm_engines``: OpenRLHF's ``RolloutRayActor`` with the vLLM engine faked."""
    import ray
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    from rlvr_selector_client.integrations.openrlhf import _plain_class

    record = os.environ["DRIVER_POLICY_RECORD"]

    class FakeRolloutActor(_plain_class(RolloutRayActor)):  # type: ignore[misc]
        def __init__(self, remote_rm_url: Any = None) -> None:
            # What RolloutRayActor.__init__ does after configuring CUDA and vLLM.
            self.executor = SingleTurnAgentExecutor(remote_rm_url)
            self.llm = FakeLLM(pretrain, record)
            self._mm_pad_token_ids = None

    actor = ray.remote(num_cpus=0)(FakeRolloutActor)
    return [actor.remote(remote_rm_url=kwargs.get("remote_rm_url")) for _ in range(num_engines)]


def _load(path: str) -> Any:
    return pickle.loads(Path(path).read_bytes())


class FakeModelGroup:
    """OpenRLHF's ``RayActorGroup`` of DeepSpeed model actors, reduced to what the trainer reads back.

    Lives inside the trainer actor (it is pickled into it); keeps checkpoints and the training log in
    files under the work directory."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.workdir = os.environ["DRIVER_WORKDIR"]
        self.crash_at = int(os.environ.get("DRIVER_CRASH_AT", "0"))
        self.updates = 0

    def _put(self, value: Any) -> list[Any]:
        import ray

        return [ray.put(value)]

    def async_init_model_from_pretrained(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def async_save_model(self) -> list[Any]:
        return []

    def async_run_method_batch(self, method_name: str, **kwargs: Any) -> list[Any]:
        if method_name == "forward":
            import torch

            return self._put([torch.zeros(mask.shape, dtype=torch.float32) for mask in kwargs["action_mask"]])
        if method_name == "append":
            rows = []
            for exp in kwargs["experience"]:
                for i in range(exp.sequences.shape[0]):
                    mask = exp.action_mask[i].bool()
                    rows.append(
                        {
                            "prompt_id": common.prompt_id_of(exp.prompts[i]),
                            "score": float(exp.info["reward"][i]),
                            "advantage": float(exp.advantages[i][mask][0]),
                        }
                    )
            with open(os.path.join(self.workdir, "updates.jsonl"), "a") as f:
                f.write(json.dumps(rows) + "\n")
            return self._put(None)
        raise AssertionError(f"unexpected batched call {method_name}")

    def async_run_method(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        # OpenRLHF resumes when <ckpt.path>/_actor exists (DeepSpeed's folder); the states go beside it.
        ckpt_dir = os.path.join(self.workdir, "ckpt", "_actor")
        ckpt = os.path.join(ckpt_dir, "client-states.pkl")
        if method_name == "fit":
            self.updates += 1
            if self.updates == self.crash_at:
                raise RuntimeError("preempted (simulated) during PPO update")
            return self._put({"policy_loss": 0.0})
        if method_name == "save_checkpoint":
            os.makedirs(ckpt_dir, exist_ok=True)
            saved = _load(ckpt) if os.path.exists(ckpt) else {}
            saved[kwargs["tag"]] = kwargs.get("client_states") or {}
            Path(ckpt).write_bytes(pickle.dumps(saved))
            return self._put(None)
        if method_name == "get_checkpoint_states":
            saved = _load(ckpt)
            return self._put(saved[os.environ["DRIVER_RESUME_TAG"]])
        if method_name in ("broadcast_to_vllm", "empty_cache"):
            return self._put(None)
        raise AssertionError(f"unexpected call {method_name}")


# --------------------------------------------------------------------------------------------------


def command(args: argparse.Namespace, work: Path, model: Path, resume: bool) -> list[str]:
    """The example's command line (examples/openrlhf_grpo.py: the selector's options, the data, its reward
    file, GRPO), then what a CPU run with one fake engine needs."""
    argv = [
        *openrlhf_grpo.arguments(args.url, args.dataset, str(model), work / "train.jsonl", batch=BATCH, n=N),
        "--selector.seed",
        "1",
        "--algo.kl.init_coef",
        "0",
        "--rollout.micro_batch_size",
        "4",
        "--rollout.max_new_tokens",
        "24",
        "--train.batch_size",
        str(BATCH * N),
        "--train.micro_batch_size",
        "4",
        "--data.max_len",
        "96",
        "--actor.num_nodes",
        "1",
        "--actor.num_gpus_per_node",
        "1",
        "--vllm.num_engines",
        "1",
        "--ckpt.path",
        str(work / "ckpt"),
        "--ckpt.save_steps",
        "1" if args.filtering else "2",
    ]
    if args.filtering:
        argv += ["--algo.dynamic_filtering_enable", "--algo.dynamic_filtering_range", "0.01", "0.99"]
    if resume:
        argv += ["--ckpt.load_enable"]
    return argv


def service_state(url: str, dataset: str) -> dict[str, Any]:
    from rlvr_selector_client.client import SelectorClient

    with SelectorClient(url) as client:
        info = client.get_dataset(dataset)
    return {"open_step": info.open_step, "observations": info.observations, "rollouts": info.rollouts}


def read_jsonl(path: Path) -> list[Any]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run(args: argparse.Namespace, work: Path, model: Path, resume: bool) -> dict[str, Any]:
    import openrlhf.trainer.ray as orl_ray
    import openrlhf.trainer.ray.launcher as launcher
    import ray

    from rlvr_selector_client.integrations import openrlhf as adapter

    (work / "updates.jsonl").unlink(missing_ok=True)
    crash_at = FILTERING_CRASH_AT_UPDATE if args.filtering else CRASH_AT_UPDATE
    os.environ["DRIVER_CRASH_AT"] = "0" if resume else str(crash_at)
    os.environ["DRIVER_RESUME_TAG"] = f"global_step{crash_at - 1}"
    os.environ.pop(adapter.OPTIONS_ENV, None)
    orl_ray.create_vllm_engines = fake_create_vllm_engines
    launcher.RayActorGroup = FakeModelGroup
    error = None
    try:
        adapter.main(command(args, work, model, resume))
    except Exception as exc:  # the simulated preemption surfaces as Ray's task error
        error = f"{type(exc).__name__}: {exc}"
        if "preempted (simulated)" not in error:
            traceback.print_exc()
            raise
    finally:
        ray.shutdown()
    if not resume and error is None:
        raise AssertionError("run 1 was not preempted")
    updates = read_jsonl(work / "updates.jsonl")
    return {"updates": updates, "preempted": error is not None, **service_state(args.url, args.dataset)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--filtering", action="store_true")
    args = parser.parse_args()

    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    stubs = write_stubs(work)
    sys.path.insert(0, str(stubs))
    # Ray's workers (the trainer and rollout actors) inherit this environment.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(stubs), str(ROOT), os.environ.get("PYTHONPATH", "")])
    os.environ["DRIVER_WORKDIR"] = str(work)
    os.environ["DRIVER_POLICY_RECORD"] = str(work / "policy.jsonl")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    model = common.model_dir(work)
    write_data(work / "train.jsonl", FILTERING_SIZE if args.filtering else SIZE)
    (work / "policy.jsonl").unlink(missing_ok=True)

    first = run(args, work, model, resume=False)
    resumed = run(args, work, model, resume=True)
    fed = read_jsonl(work / "policy.jsonl")
    common.emit({"runs": [first, resumed], "fed": fed})


if __name__ == "__main__":
    main()
