"""bench/grpo_budget.py without training: its runs' command lines are valid trainer configurations with
equal rollouts per step, and the paired differences are computed per seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import grpo_budget as gb
from trainer_client import cli


def _config(command: list[str]):
    assert command[1:4] == ["-m", "trainer_client.cli", "train"]
    return cli._build_configs(cli._parser().parse_args(command[3:]))


@pytest.mark.parametrize("extra", [[], ["--smoke"]])
def test_every_arm_is_a_valid_run_at_the_same_rollouts_per_step(extra) -> None:
    args = gb.parse_args(extra)
    configs = {arm: _config(gb.arm_command(args, "http://x", arm, 0, Path("m.jsonl"))) for arm in gb.ARMS}
    assert [configs[a].strategy for a in gb.ARMS] == ["uniform", "insight", "insight", "filter"]
    assert configs["filter"].strategy_params == gb.static_filter_params(args.reference_samples)
    assert configs["uniform"].rollout_budget is None and configs["insight"].rollout_budget is None
    budget = configs["insight_budget"]
    assert budget.rollout_budget == budget.batch_size * budget.rollouts  # equal rollouts per step
    assert (budget.rollouts_min, budget.rollouts_max) == (args.rollouts_min, args.rollouts_max)
    assert len({(c.batch_size, c.rollouts, c.steps, c.seed) for c in configs.values()}) == 1
    if not extra:  # the GPU defaults: B >= 64, three seeds, a deadline that fits 9 minutes
        assert args.batch_size >= 64 and args.seeds == [0, 1, 2] and args.deadline <= 480
        assert (
            "--backend" in (command := gb.arm_command(args, "u", "uniform", 0, Path("m"))) and "hf" in command
        )


def test_bad_options_are_refused(capsys) -> None:
    with pytest.raises(SystemExit):
        gb.parse_args(["--arms", "insight,dps"])
    assert "--arms must be a non-empty subset" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gb.parse_args(["--rollouts-max", "4", "--rollouts", "8"])
    assert "must lie in" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gb.parse_args(["--reference-samples", "0"])  # the filter arm (a default) needs the rates
    assert "filter arm filters on the reference rates" in capsys.readouterr().err


def test_paired_differences_are_by_seed() -> None:
    accuracy = {"uniform": [0.5, 0.4, 0.3], "insight": [0.55, 0.4, 0.35], "insight_budget": [0.6, 0.5, None]}
    summaries = [
        {"strategy": arm, "seed": seed, "eval_at_budget": value}
        for arm, values in accuracy.items()
        for seed, value in enumerate(values)
    ]
    rows = {(r["arm"], r["baseline"]): r for r in gb.paired(summaries)}
    assert rows["insight", "uniform"]["diff"] == pytest.approx(0.1 / 3)
    assert rows["insight", "uniform"]["wins"] == "2/3"
    both = rows["insight_budget", "uniform"]  # seed 2 has no evaluation at the budget: left out
    assert both["seeds"] == 2 and both["diff"] == pytest.approx(0.1) and both["diff_se"] == pytest.approx(0.0)
    assert rows["insight_budget", "insight"]["diff"] == pytest.approx((0.05 + 0.1) / 2)
    assert len(gb.paired([s for s in summaries if s["strategy"] != "insight_budget"])) == 1


def test_group_stats_count_mixed_groups_per_rollout() -> None:
    records = [
        {"rollouts": 48, "mixed_by_size": {"2": 1, "16": 2}, "group_size_min": 2, "group_size_max": 16},
        {"rollouts": 52, "mixed_by_size": {"6": 2}, "group_size_min": 6, "group_size_max": 6},
    ]
    assert gb.group_stats(records) == {
        "mixed_per_1k_rollouts": 50.0,
        "group_size_min": 2,
        "group_size_max": 16,
        "profile_rollouts": 0,
    }
    profiled = [{**r, "profile_rollouts": 4096 * 16} for r in records]
    assert gb.group_stats(profiled)["profile_rollouts"] == 65536


def test_the_arms_that_read_the_reference_rates_upload_them_counted(tmp_path) -> None:
    """INSIGHT's and the filter's runs upload their seed's reference pass as a profile of this run (its
    samples are their profiling rollouts); uniform reads no rates, so it gets none and pays nothing."""
    args = gb.parse_args(["--out", str(tmp_path)])
    assert args.reference_samples == 16  # the best regime's annotation
    for arm in gb.ARMS:
        for seed in (0, 2):
            parsed = cli._parser().parse_args(gb.arm_command(args, "u", arm, seed, Path("m"))[3:])
            if arm in gb.PROFILED_ARMS:
                assert parsed.pass_rates == str(tmp_path / f"pass-rates-seed{seed}.jsonl")
                assert parsed.pass_rates_profiled
            else:
                assert parsed.pass_rates is None and not parsed.pass_rates_profiled
    off = gb.parse_args(["--reference-samples", "0", "--arms", "uniform,insight"])
    assert cli._parser().parse_args(gb.arm_command(off, "u", "insight", 0, Path("m"))[3:]).pass_rates is None


@pytest.mark.parametrize("samples", [2, 16])
def test_the_filter_arm_keeps_exactly_the_prompts_strictly_between_0_and_1(service, samples) -> None:
    """Through the real service: a dataset whose prompts carry every rate s/n (n = samples) with its count,
    selected by the filter arm's strategy and parameters with a batch of as many prompts as are strictly
    between 0 and 1, gives exactly those (the filter's bounds separate 0/n from 1/n and n/n from n-1/n)."""
    import uuid

    from rlvr_selector_client import SelectorClient

    rates = [s / samples for s in range(samples + 1)] * 3
    kept = {i for i, r in enumerate(rates) if 0.0 < r < 1.0}
    dataset = f"filter-{uuid.uuid4().hex[:10]}"
    with SelectorClient(service.url) as client:
        client.create_dataset(dataset, len(rates))
        client.upload_metadata(dataset, pass_rate=rates, pass_samples=[samples] * len(rates), profile=True)
        for step in range(3):
            batch = client.select(
                dataset, step, len(kept), "filter", gb.static_filter_params(samples), seed=step
            )
            assert set(batch.prompt_ids) == kept


def test_the_reference_pass_counts_each_prompts_solved_samples_with_the_trainers_verifier(
    tmp_path, monkeypatch
) -> None:
    """The reference pass samples every prompt of each seed's pool (the pool the trainer builds for that
    seed) through the trainer's own prompt rendering, and counts a sample as solved by the task's verifier.
    Generation is faked at the engine (a tiny model solves nothing): prompt i of the pool gets i % 4 correct
    answers out of 3 samples, capped at 3; the model and tokenizer are a real tiny checkpoint."""
    transformers = pytest.importorskip("transformers")
    from tests.integrations.frameworks.common import SYMBOLS, tokenizer
    from tests.utils import tiny_llama_config
    from trainer_client.model import encode_prompt
    from trainer_client.rollout import Completion, HFRollout, PromptRollouts
    from trainer_client.tasks import load_task

    model_path = tmp_path / "model"
    tok = tokenizer()
    tok.save_pretrained(model_path)
    config = transformers.LlamaConfig(**tiny_llama_config(len(SYMBOLS)), pad_token_id=0, eos_token_id=1)
    transformers.LlamaForCausalLM(config).save_pretrained(model_path)
    args = gb.parse_args(["--smoke", "--model", str(model_path), "--out", str(tmp_path), "--seeds", "0,1"])
    args.reference_samples, args.reference_batch, args.num_prompts = 3, 4, 10  # chunks of 4, 4, 2

    answers: dict[tuple[int, ...], tuple[int, str]] = {}
    for seed in args.seeds:
        task = load_task(f"arithmetic:{args.tiers}", num_prompts=args.num_prompts, seed=seed)
        for i, problem in enumerate(task.problems):
            answers[encode_prompt(tok, problem.prompt, task.system_prompt)] = (i, problem.answer)

    def fake_generate(self, prompts, *, n, max_new_tokens, temperature, top_p=1.0):
        assert n == 3 and temperature == args.temperature and max_new_tokens == args.max_new_tokens
        out = []
        for prompt in prompts:
            index, answer = answers[tuple(prompt)]
            right = min(index % 4, 3)
            texts = [f"Answer: {answer}" if j < right else "Answer: nope" for j in range(n)]
            out.append(PromptRollouts(tuple(prompt), tuple(Completion((1,), t, "stop") for t in texts)))
        return out

    monkeypatch.setattr(HFRollout, "generate", fake_generate)
    spread = gb.reference_pass(args)
    expected = [min(i % 4, 3) / 3 for i in range(10)]
    for seed in args.seeds:
        lines = (tmp_path / f"pass-rates-seed{seed}.jsonl").read_text().splitlines()
        assert [json.loads(line)["pass_rate"] for line in lines] == pytest.approx(expected)
        assert {json.loads(line)["pass_samples"] for line in lines} == {3}
    assert spread["samples"] == 3
    assert spread["share_none_solved"] == pytest.approx(3 / 10) and spread[
        "share_all_solved"
    ] == pytest.approx(2 / 10)
