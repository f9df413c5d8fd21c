"""bench/learning.py's pieces, never its results: the verifier and the exactness of the pass rates it rests
on, the sampler against the trainer's own log-probs, the pre-training cache, and the accounting of rollouts
through a real service (a toy-sized policy), profiles included, and the measures of how pass rates move."""

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
from bench.learner.regimes import ALL, ARMS, REGIMES, TRACE_TRANSITIONS, Arm, arm_of
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
    regime = REGIMES["smoke"].with_(model=TINY, steps=12, eval_every=2, profile_samples=2)
    budget = regime.rollout_budget  # 192 rollouts: a profile of 2 x 64 prompts, then 4 steps of 4 x 4
    for strategy in ARMS:
        result = run_one(regime, strategy, 0, service.url, out=tmp_path / f"{strategy}.json")
        records = result["records"]
        profiled = result["profiling_rollouts"]
        assert profiled == (regime.profile_samples * regime.pool_size if ARMS[strategy].profile else 0)
        assert (
            result["rollouts"] - profiled == sum(r["rollouts"] for r in records) == result["service_rollouts"]
        )
        assert len(result["visits"]) == sum(r["rollouts"] for r in records) // regime.rollouts or (
            strategy in ("dynamic_sampling", "insight_budget")
        )
        assert result["rollouts"] >= budget
        # stops at the first step that reaches the budget, the profile counted in it
        assert profiled + sum(r["rollouts"] for r in records[:-1]) < budget
        if strategy != "dynamic_sampling":
            assert result["rollouts"] == budget
            assert len(records) == (budget - profiled) // (regime.batch_size * regime.rollouts)
            assert all(r["rollouts"] == regime.batch_size * regime.rollouts for r in records)
        evals = result["evals"]
        assert evals[0]["rollouts"] == 0 and evals[-1]["rollouts"] == result["rollouts"]
        if profiled:  # the profile's cost is on the curve: flat from 0 to its rollouts
            assert (
                evals[1]["rollouts"] == profiled
                and evals[1]["heldout_sampled"] == evals[0]["heldout_sampled"]
            )
        assert json.loads((tmp_path / f"{strategy}.json").read_text())["strategy"] == strategy
        if strategy in (
            "uniform",
            "dynamic_sampling",
            "oracle",
            "filter",
        ):  # the same run again: the same numbers
            again = run_one(regime, strategy, 0, service.url)
            assert again["rolled_digest"] == result["rolled_digest"] and again["evals"] == result["evals"]
        if (
            strategy != "oracle"
        ):  # the service seeds batches by dataset name, step and seed: another seed differs
            assert run_one(regime, strategy, 1, service.url)["rolled_digest"] != result["rolled_digest"]
    # The oracle of the filter family: too few prompts likely mixed under a toy policy, so the batch is
    # completed with the likeliest, B distinct prompts a step, and the run spends the same budget.
    result = run_one(regime.with_(oracle_rule="filter"), "oracle", 0, service.url)
    assert result["rollouts"] == budget
    steps = [
        result["visits"][i : i + regime.batch_size]
        for i in range(0, len(result["visits"]), regime.batch_size)
    ]
    assert all(len({v[0] for v in step}) == regime.batch_size for step in steps)


def test_the_command_line_refuses_what_it_cannot_run(capsys) -> None:
    with pytest.raises(ValueError, match="leaves no rollout"):
        run_one(REGIMES["smoke"].with_(model=TINY), "filter", 0, "http://127.0.0.1:9")
    for argv, message in (
        (["--regime", "nope"], "unknown --regime"),
        (["--strategies", "insight,nope"], "unknown nope"),
        (["--seeds", "a"], "comma-separated integers"),
        (["--set", "colour=1"], "no field 'colour'"),
        (["--set", "lr=abc"], "must be JSON"),
        (["--steps", "0"], "steps >= 1"),
        (["--arm", "uniform={}"], "give a new NAME=JSON"),
        (["--arm", 'mine={"params": {}}'], "with a 'strategy'"),
        (["--arm", 'mine={"strategy": "insight", "colour": 1}'], "no field 'colour'"),
    ):
        with pytest.raises(SystemExit):
            learning.parse_args(["--regime", "base", *argv] if argv[0] != "--regime" else argv)
        assert message in capsys.readouterr().err
    args = learning.parse_args(
        ["--regime", "base", "--strategies", "all", "--set", "lr=3e-4", "--steps", "10"]
    )
    assert args.strategy_list == list(ALL)
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


def test_a_named_arm_runs_what_it_says_and_the_static_filter_keeps_the_profiled_mixed_prompts() -> None:
    """``filter`` is the offline filter on the regime's profile: the service's filter judging by the
    profile alone, with bounds that keep exactly the prompts profiled strictly between 0 and 1."""
    from rlvr_selector_client.recommend import static_filter_params

    regime = REGIMES["epochs"]
    static = arm_of(regime, "filter")
    assert static.strategy == "filter" and static.profile and static.params["reprofile"] is False
    assert static.params == static_filter_params(regime.profile_samples)
    assert arm_of(regime.with_(profile_samples=16), "filter").params == static_filter_params(16)
    assert arm_of(regime, "filter_reprofile") == Arm("filter", profile=True)
    assert arm_of(regime, "filter_cold") == Arm("filter")
    mine = Arm.parse('{"strategy": "insight", "filter": {"recheck": 0.1}, "profile": true}')
    assert arm_of(regime, "mine", {"mine": mine}) is mine
    assert mine.describe(8) == {"strategy": "insight", "params": {}, "filter": {"recheck": 0.1}, "profile": 8}
    # recommended: the decision table's row for the regime's shape and what it uploads
    assert arm_of(regime, "recommended") == Arm("uniform")  # 12 visits of its pool
    assert arm_of(REGIMES["best"], "recommended") == Arm("insight", {"mu": 0.5})  # rates, 0.5 visits
    assert arm_of(REGIMES["kinds"], "recommended") == Arm("uniform")


def test_ratio_vs_filter_is_the_filters_rollouts_to_its_own_final_over_the_arms(monkeypatch) -> None:
    monkeypatch.setattr(report, "FINAL_POINTS", 1)
    runs = [
        _run("filter", 0, [0.1, 0.2, 0.3, 0.4]),  # its final 0.4 at 300
        _run("online", 0, [0.1, 0.3, 0.4, 0.4]),  # 0.4 at 200: 1.5x
        _run("filter", 1, [0.1, 0.2, 0.2, 0.2]),  # 0.2 at 100
        _run("online", 1, [0.1, 0.1, 0.1, 0.1]),  # never: 0
    ]
    for run in runs:
        run["profiling_rollouts"] = 50 if run["strategy"] == "filter" else 0
    summary = report.summarize(runs, ["filter", "online"])
    assert summary["ratio_vs_filter"] == {"filter": 1.0, "online": pytest.approx(0.75)}
    assert summary["profiling_rollouts"] == {"filter": 50, "online": 0}
    assert summary["strategies"]["online"]["vs_filter_heldout_sampled"] == pytest.approx(-0.05)
    assert summary["dynamics"] is None  # no uniform run


def test_transitions_count_a_prompts_class_from_one_visit_to_the_next() -> None:
    """Rows from unsolved, mixed, solved (K = 4): prompt 0 goes 0/4 -> 2/4 -> 4/4, prompt 1 stays 0/4,
    prompt 2 is visited once (no transition), prompt 3 goes 4/4 -> 1/4, and the runs are pooled."""
    first = {"visits": [(0, 0, 4), (1, 0, 4), (2, 3, 4), (3, 4, 4), (0, 2, 4), (1, 0, 4), (0, 4, 4)]}
    second = {"visits": [(3, 1, 4)]}
    assert report.transitions([first]) == [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert report.transitions([first, {"visits": [(3, 4, 4), (3, 1, 4)]}, second]) == [
        [0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]  # fmt: skip
    assert report.transitions([{"visits": []}]) is None
    runs = [{**_run("uniform", s, [0.1, 0.2, 0.3, 0.4]), **first} for s in (0, 1)]
    for run in runs:
        for point in run["evals"]:
            point["pool_sampled"] = point["heldout_sampled"] + 0.1
    assert report.dynamics(runs)["pool_pass_rate_first"] == pytest.approx(0.2)  # no pool: the probe's
    for run in runs:
        run["pool_p0"] = [0.0, 0.0, 0.0]  # an epoch is 3 groups: 3/12 successes first, 6/12 last
    assert report.epoch_pass_rate(runs[0], first=True) == pytest.approx(3 / 12)
    assert report.epoch_pass_rate(runs[0], first=False) == pytest.approx(6 / 12)
    moves = report.dynamics(runs)
    assert moves["transitions"] == report.transitions(runs[:1])
    assert moves["largest_gap_to_trace"] == pytest.approx(
        max(
            abs(a - b)
            for r, t in zip(moves["transitions"], TRACE_TRANSITIONS, strict=True)
            for a, b in zip(r, t, strict=True)
        )
    )
    assert (moves["pool_pass_rate_first"], moves["pool_pass_rate_last"]) == pytest.approx((3 / 12, 6 / 12))
    assert moves["uniform_heldout_gain"] == pytest.approx(report.final(runs[0]) - 0.1)


def test_a_histogram_composition_draws_the_pool_to_its_shares(tmp_path, monkeypatch) -> None:
    """Each prompt falls in the bin round(8 p0) of its starting pass rate; the pool and the held-out set
    together hold each bin's share of the prompts."""
    from bench.learner.run import draw_sets, eighth

    monkeypatch.setenv("RLVR_LEARNING_CACHE", str(tmp_path))
    model, _ = policy.pretrained_model(TINY, quiet=True)
    shares = (0.5, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0)
    rates = iter(np.tile([0.0, 0.5, 0.3, 0.02], 10_000))
    monkeypatch.setattr("bench.learner.run.exact_pass_rates",
                        lambda _m, _t, problems, **_: np.array([next(rates) for _ in problems]))  # fmt: skip
    regime = REGIMES["smoke"].with_(histogram=shares, pool_size=30, heldout_size=10)
    pool, heldout, p_pool, p_held = draw_sets(regime, 0, model, TOKENIZER)
    assert len(pool) == 30 and len(heldout) == 10
    bins = [eighth(p) for p in np.concatenate([p_pool, p_held])]
    assert bins.count("0") == 20 and bins.count("4") == 20
    assert eighth(0.0624) == "0" and eighth(0.0626) == "1" and eighth(1.0) == "8"


def test_rates_a_regime_ships_for_free_come_from_another_model_than_the_policy() -> None:
    """A regime's reference pass rates cost it nothing, so they must not be the policy's own starting
    rates (those a run pays for, as a profile): every regime that uploads them names another model."""
    shipping = [r for r in REGIMES.values() if r.reference_samples]
    assert shipping, "no regime uploads reference rates: the check would pass vacuously"
    for regime in shipping:
        assert regime.reference_model is not None and regime.reference_model != regime.model, regime.name
