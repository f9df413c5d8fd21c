"""bench/learning.py's pieces, never its results: the verifier and the exactness of the pass rates it rests
on, the sampler against the trainer's own log-probs, the pre-training cache, and the accounting of rollouts
through a real service (a toy-sized policy)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import learning
from bench.learner import policy, report
from bench.learner.regimes import REGIMES, STRATEGIES
from bench.learner.run import reference_rates, rollouts_to_reach, run_one
from bench.learner.task import (
    BOS,
    EOS,
    KINDS,
    MAX_NEW_TOKENS,
    PAD,
    VOCAB_SIZE,
    ArithmeticTask,
    CharTokenizer,
    Kind,
    answer_tokens,
    draw_problem,
    evaluate,
    prompt_tokens,
    reward,
)

TOKENIZER = CharTokenizer()
TINY = policy.ModelSpec(hidden=32, layers=1, heads=2, ffn=64, pretrain_steps=6, pretrain_batch=8)


# ---- the task ---------------------------------------------------------------------------------------
def test_every_kind_draws_problems_whose_answer_is_the_arithmetic() -> None:
    rng = random.Random(0)
    for kind in KINDS:
        for _ in range(20):
            problem = draw_problem(rng, kind)
            a, b = problem.prompt.split(kind.op, 1) if kind.op != "-" else problem.prompt.rsplit("-", 1)
            assert len(a) == kind.digits_a and len(b) == kind.digits_b
            assert problem.answer == str(evaluate(int(a), kind.op, int(b)))
            assert KINDS[problem.group] == kind
            assert len(problem.answer) + 1 < MAX_NEW_TOKENS  # a capped completion is longer than any answer


def test_prompt_tokens_are_what_the_trainer_feeds() -> None:
    from trainer_client.model import render_prompt

    problems = [draw_problem(random.Random(s)) for s in range(30)]
    ours = prompt_tokens(TOKENIZER, problems)
    theirs = [
        TOKENIZER(render_prompt(TOKENIZER, p.prompt), add_special_tokens=False)["input_ids"] for p in problems
    ]
    assert ours == theirs
    assert all(TOKENIZER.decode(ids) == p.prompt + "\n" for ids, p in zip(ours, problems, strict=True))
    with pytest.raises(ValueError, match="not in the task's alphabet"):
        TOKENIZER.encode("1/2")


@settings(max_examples=400, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 2**32 - 1),
    tokens=st.lists(st.integers(0, VOCAB_SIZE - 1), max_size=MAX_NEW_TOKENS),
    mutate=st.sampled_from(["none", "random", "no_eos", "pad", "bos", "extra", "leading_zero"]),
)
def test_a_completion_is_rewarded_exactly_when_its_tokens_are_the_answer_and_eos(
    kind, seed, tokens, mutate
) -> None:
    """What the engine returns (tokens up to and including the first EOS, at most the cap), decoded as the
    trainer decodes it: reward 1 if and only if the tokens are the answer's followed by EOS."""
    problem = draw_problem(random.Random(seed), kind)
    answer = answer_tokens(TOKENIZER, [problem])[0]
    if mutate == "none":
        tokens = list(answer)
    elif mutate == "no_eos":
        tokens = answer[:-1] + [TOKENIZER.encode("7")[0]] * (MAX_NEW_TOKENS - len(answer) + 1)
    elif mutate in ("pad", "bos"):
        tokens = [*answer[:-1], PAD if mutate == "pad" else BOS, EOS]
    elif mutate == "extra":
        tokens = [*answer[:-1], TOKENIZER.encode("\n")[0], EOS]
    elif mutate == "leading_zero":
        tokens = [TOKENIZER.encode("0")[0], *answer]
    if EOS in tokens:  # the engine stops at the first EOS
        tokens = tokens[: tokens.index(EOS) + 1]
    tokens = tokens[:MAX_NEW_TOKENS]
    text = TOKENIZER.decode(tokens, skip_special_tokens=True)
    assert (reward(problem, text) == 1.0) == (tokens == answer)
    assert ArithmeticTask([problem]).reward(0, text) == reward(problem, text)


# ---- the policy: exact pass rates, the sampler, the cache --------------------------------------------
@pytest.fixture(scope="module")
def tiny_model():
    torch.manual_seed(3)
    return policy.new_model(TINY, seed=3)


def test_exact_pass_rates_are_the_trainers_logprobs_of_the_answer(tiny_model) -> None:
    """exp(sum of the trainer's own log-probs of answer + EOS) = the pass rate, at two temperatures."""
    from trainer_client.grpo import completion_logprobs

    problems = [draw_problem(random.Random(s)) for s in range(12)]
    prompts, answers = prompt_tokens(TOKENIZER, problems), answer_tokens(TOKENIZER, problems)
    for temperature in (1.0, 0.7):
        exact = policy.exact_pass_rates(tiny_model, TOKENIZER, problems, temperature=temperature, chunk=5)
        with torch.no_grad():
            flat = completion_logprobs(
                tiny_model, prompts, answers, temperature=temperature, pad_token_id=PAD
            )
        sums = torch.split(flat.double(), [len(a) for a in answers])
        want = [float(torch.exp(s.sum())) for s in sums]
        assert exact.tolist() == pytest.approx(want, rel=1e-5)


def test_the_sampler_reports_the_trainers_logprobs_and_is_seeded(tiny_model) -> None:
    """Left-padded KV-cache sampling gives each token the log-prob the trainer computes (right-padded, no
    cache): the trainer/sampler mismatch is float rounding, and the same seed gives the same completions."""
    from trainer_client.grpo import completion_logprobs

    problems = [draw_problem(random.Random(s)) for s in range(6)]  # prompts of different lengths
    prompts = prompt_tokens(TOKENIZER, problems)
    runs = [
        policy.KVCacheSampler(tiny_model, TOKENIZER, seed=9).generate(
            prompts, n=[3, 1, 2, 4, 1, 2], max_new_tokens=MAX_NEW_TOKENS, temperature=1.0
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    completions = [(o.prompt_token_ids, c) for o in runs[0] for c in o.completions]
    assert [len(o.completions) for o in runs[0]] == [3, 1, 2, 4, 1, 2]
    with torch.no_grad():
        flat = completion_logprobs(
            tiny_model, [p for p, _ in completions], [c.token_ids for _, c in completions]
        )
    sampler = torch.tensor([x for _, c in completions for x in c.logprobs], dtype=torch.float64)
    assert torch.allclose(flat.double(), sampler, atol=1e-5)
    for _, c in completions:
        assert len(c.token_ids) <= MAX_NEW_TOKENS
        assert (c.finish_reason == "stop") == (c.token_ids[-1] == EOS)
        assert EOS not in c.token_ids[:-1]
    greedy = policy.KVCacheSampler(tiny_model, TOKENIZER, seed=1).generate(
        prompts, n=1, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0
    )
    again = policy.KVCacheSampler(tiny_model, TOKENIZER, seed=2).generate(
        prompts, n=1, max_new_tokens=MAX_NEW_TOKENS, temperature=0.0
    )
    assert greedy == again  # greedy ignores the seed


def test_pretraining_is_seeded_and_cached_by_everything_that_shapes_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RLVR_LEARNING_CACHE", str(tmp_path))
    first, record = policy.pretrained_model(TINY, quiet=True)
    assert not record["cached"] and record["parameters"] == policy.parameter_count(first)
    files = list(tmp_path.glob("pretrain-*.pt"))
    assert len(files) == 1 and TINY.key() in files[0].name
    again, record = policy.pretrained_model(TINY, quiet=True)
    assert record["cached"]
    for (name, a), (_, b) in zip(first.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    fresh, _ = policy.pretrain(TINY)  # the same seed trains the same weights
    assert all(torch.equal(fresh[k], v) for k, v in first.state_dict().items())
    other = policy.ModelSpec(**{**TINY.__dict__, "pretrain_seed": 1})
    assert other.key() != TINY.key()
    policy.pretrained_model(other, quiet=True)
    assert len(list(tmp_path.glob("pretrain-*.pt"))) == 2
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically


# ---- the analysis -------------------------------------------------------------------------------------
def _run(strategy: str, seed: int, curve: list[float], step: int = 100) -> dict:
    evals = [
        {"rollouts": i * step, "heldout_sampled": v, "heldout_greedy": v, "pool_sampled": v}
        for i, v in enumerate(curve)
    ]
    records = [{"rollouts": step, "group_size_mean": 4.0, "effective_ratio": 0.5, "total_rollouts": (i + 1) * step}
               for i in range(len(curve) - 1)]  # fmt: skip
    return {"strategy": strategy, "seed": seed, "evals": evals, "records": records, "seconds": 1.0}


def test_rollouts_to_reach_interpolates_between_evaluations() -> None:
    evals = _run("u", 0, [0.1, 0.2, 0.4, 0.5])["evals"]
    assert rollouts_to_reach(evals, 0.3) == pytest.approx(150.0)
    assert rollouts_to_reach(evals, 0.1) == 0.0
    assert rollouts_to_reach(evals, 0.5) == pytest.approx(300.0)
    assert rollouts_to_reach(evals, 0.51) is None


def test_ratio_vs_uniform_is_paired_by_seed_and_counts_a_miss_as_zero(monkeypatch) -> None:
    monkeypatch.setattr(report, "FINAL_POINTS", 1)
    runs = [
        _run("uniform", 0, [0.1, 0.2, 0.3, 0.4]),  # reaches its final 0.4 at 300
        _run("fast", 0, [0.1, 0.4, 0.5, 0.6]),  # reaches 0.4 at 100: 3x
        _run("uniform", 1, [0.1, 0.3, 0.3, 0.5]),  # 0.5 at 300
        _run("fast", 1, [0.1, 0.2, 0.3, 0.4]),  # never reaches 0.5: 0
    ]
    summary = report.summarize(runs, ["uniform", "fast"])
    assert summary["ratio_vs_uniform"] == {"uniform": 1.0, "fast": pytest.approx(1.5)}
    fast = summary["strategies"]["fast"]
    assert fast["rollouts_to_uniform_final"] == [pytest.approx(100.0), None] and fast["reached"] == "1/2"
    assert fast["vs_uniform_heldout_sampled"] == pytest.approx((0.2 - 0.1) / 2)
    assert fast["wins"] == "1/2"
    assert report.mixed_share(runs[0]) == pytest.approx(0.5)


# ---- a whole run through the service: the accounting of rollouts --------------------------------------
@pytest.mark.slow
def test_every_strategy_spends_the_regimes_rollouts_and_reports_each_one(
    tmp_path, monkeypatch, service
) -> None:
    """Each strategy runs to the same rollout budget through a real service; every rollout it generates
    (Dynamic Sampling's discarded groups too) is counted and reported to /observe, and the oracle's exact
    pass rates cost none."""
    monkeypatch.setenv("RLVR_LEARNING_CACHE", str(tmp_path))
    regime = REGIMES["smoke"].with_(model=TINY, steps=4, eval_every=2)
    budget = regime.rollout_budget
    for strategy in STRATEGIES:
        result = run_one(regime, strategy, 0, service.url, out=tmp_path / f"{strategy}.json")
        records = result["records"]
        assert result["rollouts"] == sum(r["rollouts"] for r in records) == result["service_rollouts"]
        assert result["rollouts"] >= budget
        # stops at the first step that reaches the budget
        assert sum(r["rollouts"] for r in records[:-1]) < budget
        if strategy != "dynamic_sampling":
            assert result["rollouts"] == budget and len(records) == regime.steps
            assert all(r["rollouts"] == regime.batch_size * regime.rollouts for r in records)
        evals = result["evals"]
        assert evals[0]["rollouts"] == 0 and evals[-1]["rollouts"] == result["rollouts"]
        assert json.loads((tmp_path / f"{strategy}.json").read_text())["strategy"] == strategy
        if strategy in ("uniform", "dynamic_sampling", "oracle"):  # the same run again: the same numbers
            again = run_one(regime, strategy, 0, service.url)
            assert again["rolled_digest"] == result["rolled_digest"] and again["evals"] == result["evals"]
        if (
            strategy != "oracle"
        ):  # the service seeds batches by dataset name, step and seed: another seed differs
            assert run_one(regime, strategy, 1, service.url)["rolled_digest"] != result["rolled_digest"]


def test_the_command_line_refuses_what_it_cannot_run(capsys) -> None:
    for argv, message in (
        (["--regime", "nope"], "unknown --regime"),
        (["--strategies", "insight,nope"], "unknown nope"),
        (["--seeds", "a"], "comma-separated integers"),
        (["--set", "colour=1"], "no field 'colour'"),
        (["--set", "lr=abc"], "must be JSON"),
        (["--steps", "0"], "steps >= 1"),
    ):
        with pytest.raises(SystemExit):
            learning.parse_args(["--regime", "base", *argv] if argv[0] != "--regime" else argv)
        assert message in capsys.readouterr().err
    args = learning.parse_args(
        ["--regime", "base", "--strategies", "all", "--set", "lr=3e-4", "--steps", "10"]
    )
    assert args.strategy_list == list(STRATEGIES)
    assert args.regime_obj.lr == 3e-4 and args.regime_obj.steps == 10
    assert args.regime_obj.name.startswith("base[")


def test_dataset_names_follow_the_contract_whatever_the_regime_is_called() -> None:
    import re

    from bench.learner.run import dataset_name
    from rlvr_selector_client.contract import NAME

    for name in ("base", 'base[composition={"hopeless":0.35},lr=1e-3]', "x" * 300, "\u00e9t\u00e9"):
        got = dataset_name(REGIMES["base"].with_(name=name), "insight_budget", 12)
        assert re.fullmatch(NAME, got), got


def test_kinds_are_graded_by_digits() -> None:
    assert Kind("+", 1, 1) in KINDS and Kind("*", 3, 3) in KINDS and Kind("*", 4, 1) not in KINDS


def test_reference_rates_are_a_binomial_estimate_of_the_starting_pass_rates() -> None:
    p0 = np.concatenate([np.zeros(1000), np.ones(1000), np.full(20000, 0.3)])
    rates = np.array(reference_rates(p0, 16, seed=3))
    assert rates.shape == p0.shape
    assert np.array_equal(rates * 16, np.round(rates * 16))  # successes out of 16 samples
    assert (rates[:1000] == 0).all() and (rates[1000:2000] == 1).all()
    middle = rates[2000:]
    assert abs(middle.mean() - 0.3) < 0.01
    assert abs(middle.var() - 0.3 * 0.7 / 16) < 0.002  # the noise of 16 samples, not an exact rate
    assert reference_rates(p0, 16, seed=3) == rates.tolist()
    assert reference_rates(p0, 16, seed=4) != rates.tolist()
