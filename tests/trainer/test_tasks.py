"""Task generators and loaders: determinism, tier spread, solvable Countdown targets, JSONL parsing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from trainer_client import tasks
from trainer_client.rewards import COUNTDOWN_CORRECT, evaluate_equation
from trainer_client.tasks import ARITHMETIC_TIERS, Problem, load_task

DATA = Path(tasks.__file__).parent / "data"


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_procedural_tasks_are_deterministic_given_the_seed(name: str) -> None:
    first = load_task(name, num_prompts=50, seed=3)
    again = load_task(name, num_prompts=50, seed=3)
    other = load_task(name, num_prompts=50, seed=4)
    assert [(p.prompt, p.answer, p.meta) for p in first.problems] == [
        (p.prompt, p.answer, p.meta) for p in again.problems
    ]
    assert [p.prompt for p in first.problems] != [p.prompt for p in other.problems]
    assert len(first.problems) == 50


def test_arithmetic_spreads_prompts_evenly_over_tiers_and_shuffles_them() -> None:
    task = load_task("arithmetic", num_prompts=9 * len(ARITHMETIC_TIERS), seed=0)
    tiers = [p.meta["tier"] for p in task.problems]
    assert Counter(tiers) == dict.fromkeys(range(len(ARITHMETIC_TIERS)), 9)
    assert tiers != sorted(tiers)  # prompt ids do not encode difficulty


def test_arithmetic_answers_are_the_true_values() -> None:
    task = load_task("arithmetic", num_prompts=200, seed=1)
    for problem in task.problems:
        assert evaluate_equation(problem.meta["expression"]) == int(problem.answer)
        assert problem.meta["expression"] in problem.prompt
        assert "Answer:" in problem.prompt


def test_arithmetic_avoids_duplicate_prompts_while_a_tier_has_fresh_ones() -> None:
    # 10 per tier stays under the smallest tier's 16 distinct problems.
    task = load_task("arithmetic", num_prompts=10 * len(ARITHMETIC_TIERS), seed=2)
    prompts = [p.prompt for p in task.problems]
    assert len(set(prompts)) == len(prompts)
    # Beyond that, small tiers repeat problems rather than fail.
    assert len(load_task("arithmetic", num_prompts=1000, seed=2).problems) == 1000


def test_arithmetic_reward_uses_the_verifier() -> None:
    task = load_task("arithmetic", num_prompts=10, seed=0)
    answer = task.problems[3].answer
    assert task.reward(3, f"Let me compute. Answer: {answer}") == 1.0
    assert task.reward(3, f"Answer: {int(answer) + 1}") == 0.0
    with pytest.raises(IndexError, match="out of range"):
        task.reward(10, "Answer: 1")


def test_arithmetic_custom_tiers() -> None:
    task = tasks.arithmetic_task(12, seed=0, tiers=(0, 8))
    assert {p.meta["tier"] for p in task.problems} == {0, 8}
    with pytest.raises(ValueError, match="tiers"):
        tasks.arithmetic_task(4, seed=0, tiers=(99,))


def test_countdown_reference_solutions_score_full_reward() -> None:
    task = load_task("countdown", num_prompts=90, seed=5)
    assert Counter(p.meta["tier"] for p in task.problems) == {0: 30, 1: 30, 2: 30}
    for index, problem in enumerate(task.problems):
        numbers, target = problem.meta["numbers"], problem.meta["target"]
        assert len(numbers) == problem.meta["tier"] + 2
        assert all(1 <= n <= 99 for n in numbers)
        assert 1 <= target <= 100
        assert str(numbers) in problem.prompt and str(target) in problem.prompt
        assert task.reward(index, f"<answer>{problem.answer}</answer>") == COUNTDOWN_CORRECT
        assert task.reward(index, "<answer>1 + 1</answer>") < COUNTDOWN_CORRECT or numbers == [1, 1]


def test_jsonl_gsm8k_sample() -> None:
    task = load_task("jsonl", num_prompts=8, seed=0, data=str(DATA / "gsm8k_sample.jsonl"))
    assert [p.answer for p in task.problems] == ["7", "42", "1,335", "83", "45", "$9", "200.0", "6"]
    assert task.problems[0].prompt.startswith("A baker makes 12 muffins")
    assert "\\boxed" in task.problems[0].prompt
    assert task.problems[1].meta["line"] == 2
    assert task.reward(2, "So the total is \\boxed{1335}.") == 1.0
    assert task.reward(5, "Each pays 9 dollars.") == 1.0  # last-number fallback
    assert task.reward(6, "Answer: 200") == 1.0
    assert task.reward(0, "\\boxed{8}") == 0.0


def test_jsonl_math_sample_uses_last_boxed_with_nested_braces() -> None:
    task = load_task("jsonl", num_prompts=5, seed=0, data=str(DATA / "math_sample.jsonl"))
    assert [p.answer for p in task.problems] == ["\\frac{3}{4}", "2\\sqrt{3}", "4", "2.5", "\\{-3, 3\\}"]
    assert task.problems[0].meta["level"] == "Level 1"
    assert task.reward(0, "It is \\boxed{0.75}") == 1.0
    assert task.reward(1, "\\boxed{2 \\sqrt{3}}") == 1.0
    assert task.reward(3, "\\boxed{\\frac{5}{2}}") == 1.0


def test_jsonl_keeps_a_seeded_subset_in_file_order() -> None:
    path = str(DATA / "gsm8k_sample.jsonl")
    first = load_task("jsonl", num_prompts=3, seed=7, data=path)
    again = load_task("jsonl", num_prompts=3, seed=7, data=path)
    lines = [p.meta["line"] for p in first.problems]
    assert lines == [p.meta["line"] for p in again.problems]
    assert lines == sorted(lines) and len(set(lines)) == 3


def _write(tmp_path: Path, lines: list[str]) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_jsonl_plain_answers_and_blank_lines(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            json.dumps({"prompt": "What is 2 + 2?", "answer": 4}),
            "",
            json.dumps({"question": "Q?", "answer": "The result is \\boxed{\\frac{1}{2}}"}),
        ],
    )
    task = load_task("jsonl", num_prompts=2, seed=0, data=path)
    assert [p.answer for p in task.problems] == ["4", "\\frac{1}{2}"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{not json"], r"data.jsonl:1: not valid JSON"),
        (["[1, 2]"], "expected a JSON object"),
        ([json.dumps({"answer": "#### 3"})], "no question"),
        ([json.dumps({"question": "Q?"})], "no reference answer"),
        ([json.dumps({"problem": "Q?", "solution": "no box"})], "no reference answer"),
        ([json.dumps({"question": "Q?", "answer": "#### "})], "no reference answer"),
        ([json.dumps({"question": "Q?", "answer": "#### 1"})] * 2, "has 2 problems but 3 were requested"),
    ],
)
def test_jsonl_errors_say_what_is_wrong(tmp_path: Path, lines: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_task(
            "jsonl", num_prompts=3 if "requested" in message else 1, seed=0, data=_write(tmp_path, lines)
        )


def test_load_task_argument_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a data file"):
        load_task("jsonl", num_prompts=1, seed=0)
    with pytest.raises(ValueError, match="not a readable file"):
        load_task("jsonl", num_prompts=1, seed=0, data=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="only read by task 'jsonl'"):
        load_task("arithmetic", num_prompts=1, seed=0, data="x.jsonl")
    with pytest.raises(ValueError, match="unknown task 'chess'"):
        load_task("chess", num_prompts=1, seed=0)
    with pytest.raises(ValueError, match="positive integer"):
        load_task("arithmetic", num_prompts=0, seed=0)


def test_problem_is_hashable_and_compares_without_meta() -> None:
    a = Problem("What is 1 + 1?", "2", {"tier": 0})
    b = Problem("What is 1 + 1?", "2", {"tier": 5})
    assert a == b and hash(a) == hash(b)


# --------------------------------------------------------------------------------------------------
# Groups: the difficulty configuration of every prompt
# --------------------------------------------------------------------------------------------------
def test_procedural_tasks_expose_their_tier_as_the_group() -> None:
    arithmetic = load_task("arithmetic", num_prompts=27, seed=0)
    assert arithmetic.prompt_groups() == [p.meta["tier"] for p in arithmetic.problems]
    assert sorted(arithmetic.groups) == list(range(len(ARITHMETIC_TIERS)))
    assert arithmetic.groups[8].startswith("tier 8: a * b, three digits")
    countdown = load_task("countdown", num_prompts=6, seed=0)
    assert [p.group for p in countdown.problems] == [p.meta["tier"] for p in countdown.problems]
    assert countdown.groups == {0: "tier 0: 2 numbers", 1: "tier 1: 3 numbers", 2: "tier 2: 4 numbers"}


def test_jsonl_groups_come_from_math_levels_when_every_record_has_one(tmp_path: Path) -> None:
    task = load_task("jsonl", num_prompts=5, seed=0, data=str(DATA / "math_sample.jsonl"))
    assert task.prompt_groups() == [int(p.meta["level"].split()[-1]) for p in task.problems]
    assert all(task.groups[g] == f"Level {g}" for g in task.prompt_groups())
    gsm8k = load_task("jsonl", num_prompts=8, seed=0, data=str(DATA / "gsm8k_sample.jsonl"))
    assert gsm8k.prompt_groups() == [None] * 8 and gsm8k.groups == {}
    partial = _write(
        tmp_path,
        [
            json.dumps({"question": "Q1?", "answer": "1", "level": "Level 2"}),
            json.dumps({"question": "Q2?", "answer": "2"}),
        ],
    )
    assert load_task("jsonl", num_prompts=2, seed=0, data=partial).prompt_groups() == [None, None]


# --------------------------------------------------------------------------------------------------
# reasoning-gym
# --------------------------------------------------------------------------------------------------
def test_reasoning_gym_task_spreads_prompts_over_curriculum_levels() -> None:
    pytest.importorskip("reasoning_gym")
    task = load_task("rg:chain_sum", num_prompts=40, seed=3)
    again = load_task("rg:chain_sum", num_prompts=40, seed=3)
    other = load_task("rg:chain_sum", num_prompts=40, seed=4)
    assert task.name == "rg:chain_sum" and "<answer>" in task.system_prompt
    assert [p.prompt for p in task.problems] == [p.prompt for p in again.problems]
    assert [p.prompt for p in task.problems] != [p.prompt for p in other.problems]
    # chain_sum's shortest attribute has 10 levels: 10 groups of 4, shuffled
    assert Counter(task.prompt_groups()) == dict.fromkeys(range(10), 4)
    assert task.prompt_groups() != sorted(task.prompt_groups())
    assert task.groups[0] == "level 0: min_terms=2, max_terms=2, min_digits=1, max_digits=1"
    for index, problem in enumerate(task.problems):
        terms = problem.meta["entry"]["metadata"]["num_terms"]
        assert terms == problem.group + 2  # level L: exactly that level's number of terms
        assert task.reward(index, f"Let me add.\n<answer>{problem.answer}</answer>") == 1.0
        assert task.reward(index, f"<answer>{int(problem.answer) + 1}</answer>") == 0.0
        assert task.reward(index, problem.answer) == 0.0  # no answer tag, no reward


def test_reasoning_gym_levels_and_errors() -> None:
    pytest.importorskip("reasoning_gym")
    chosen = load_task("rg:chain_sum:0,2-3", num_prompts=9, seed=0)
    assert sorted(set(chosen.prompt_groups())) == [0, 2, 3] and sorted(chosen.groups) == [0, 2, 3]
    plain = load_task("rg:gsm_symbolic", num_prompts=2, seed=0)  # no curriculum: one group
    assert plain.prompt_groups() == [0, 0] and plain.groups == {0: "default configuration"}
    with pytest.raises(ValueError, match="did you mean chain_sum"):
        load_task("rg:chain_summ", num_prompts=4, seed=0)
    with pytest.raises(ValueError, match=r"curriculum levels 0\.\.10"):
        load_task("rg:chain_sum:11", num_prompts=4, seed=0)
    with pytest.raises(ValueError, match="bad level list"):
        load_task("rg:chain_sum:easy", num_prompts=4, seed=0)
    with pytest.raises(ValueError, match="no curriculum"):
        load_task("rg:gsm_symbolic:1", num_prompts=4, seed=0)


def test_arithmetic_takes_a_tier_list() -> None:
    task = load_task("arithmetic:0,5-8", num_prompts=50, seed=1)
    tiers = [p.meta["tier"] for p in task.problems]
    assert set(tiers) == {0, 5, 6, 7, 8} and sorted(task.groups) == [0, 5, 6, 7, 8]
    assert max(tiers.count(t) for t in set(tiers)) - min(tiers.count(t) for t in set(tiers)) <= 1  # even
    assert [p.prompt for p in load_task("arithmetic:0-8", num_prompts=20, seed=2).problems] == [
        p.prompt for p in load_task("arithmetic", num_prompts=20, seed=2).problems
    ]
    with pytest.raises(ValueError, match=r"non-empty subset of 0\.\.8"):
        load_task("arithmetic:3,9", num_prompts=4, seed=0)
    with pytest.raises(ValueError, match="bad level list"):
        load_task("arithmetic:hard", num_prompts=4, seed=0)
