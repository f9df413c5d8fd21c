"""Verifiers on tricky strings: number spellings, boxed answers, answer markers, Countdown equations.

Answer equality goes through math-verify (Hugging Face's verifier); these tests pin what the
combination of our extraction and its comparison does on the strings that used to be scored wrong.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from trainer_client.rewards import (
    COUNTDOWN_CORRECT,
    COUNTDOWN_FORMAT,
    answers_match,
    countdown_reward,
    evaluate_equation,
    extract_answer,
    gsm8k_final_answer,
    last_answer_tag,
    last_boxed,
    math_reward,
    parse_number,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12", Fraction(12)),
        ("  -7 ", Fraction(-7)),
        ("+7", Fraction(7)),
        ("1,234", Fraction(1234)),
        ("1,234,567.25", Fraction(123456725, 100)),
        ("$1,200", Fraction(1200)),
        ("\\$5", Fraction(5)),
        ("12.0", Fraction(12)),
        ("12.", Fraction(12)),
        ("12.50", Fraction(25, 2)),
        (".5", Fraction(1, 2)),
        ("3/4", Fraction(3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("-\\dfrac{10}{4}", Fraction(-5, 2)),
        ("\\tfrac{1}{3}", Fraction(1, 3)),
        ("\\frac12", Fraction(1, 2)),
        ("50\\%", Fraction(50)),
        ("(5)", Fraction(5)),
        ("$\\frac{7}{2}$", Fraction(7, 2)),
        ("90^\\circ", Fraction(90)),
        ("12 \\text{ dollars}", Fraction(12)),
        ("1{,}000", Fraction(1000)),
        ("2 3/4", Fraction(11, 4)),  # a mixed number, not 23/4
        ("-2 3/4", Fraction(-11, 4)),
        ("3 / 4", Fraction(3, 4)),
        ("\\frac {1} {2}", Fraction(1, 2)),
    ],
)
def test_parse_number_accepts_common_spellings(text: str, value: Fraction) -> None:
    assert parse_number(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "1,2",
        "12,34",
        "3 apples and 4 pears",
        "x",
        "1/0",
        "\\frac{1}{0}",
        "1e5",
        "--3",
        "1.2.3",
        "1 234",  # spaces inside a number are not dropped
        "2 5/4",  # not a proper mixed number
        "6 * 8 = 48",
        None,
    ],
)
def test_parse_number_rejects_non_numbers(text: str | None) -> None:
    assert parse_number(text) is None


def test_parse_number_refuses_huge_inputs_quickly() -> None:
    assert parse_number("9" * 10_000) is None


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{2}", "2"),
        ("\\boxed{a{b{c}}d}", "a{b{c}}d"),
        ("\\boxed{\\{-3, 3\\}}", "\\{-3, 3\\}"),
        ("done: \\boxed{12} and then \\boxed{13", "12"),  # the open box of a truncated completion is skipped
        ("\\fbox{7}", "7"),
        ("\\boxed 5$", "5"),
        ("\\boxed { 9 }", "9"),
    ],
)
def test_last_boxed(text: str, content: str) -> None:
    assert last_boxed(text) == content


@pytest.mark.parametrize("text", ["no box here", "\\boxed{never closed", "\\boxedx{1}"])
def test_last_boxed_absent(text: str) -> None:
    assert last_boxed(text) is None


def test_gsm8k_final_answer() -> None:
    assert gsm8k_final_answer("work\n#### 1,335") == "1,335"
    assert gsm8k_final_answer("a #### 3\nmore #### 72\ntrailing") == "72"
    assert gsm8k_final_answer("####   ") is None
    assert gsm8k_final_answer("no marker 5") is None


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("The answer is \\boxed{12}. Also 99.", "12"),
        ("Answer: 12 apples. I hope this helps! 3", "12"),
        ("**Answer:** $1,200", "1,200"),
        ("The answer is -4.", "-4"),
        ("answer:\n 14", "14"),
        ("Answer: \\frac{3}{4}", "\\frac{3}{4}"),
        ("so #### 72", "72"),
        ("7 + 5 = 12", "12"),  # last-number fallback
        ("12-5", "5"),  # a hyphen after a digit is subtraction, not a sign
        ("It is 3 then 4/5", "4/5"),
        ("Answer is 7", "7"),
        ("Answer: 6 * 8 = 48", "48"),  # the value the marker line states, not its first number
        ("Answer: 6 * 8 = 48.\nThen 6 more", "48"),
        ("The answer is 3 + 4 = 7, so 7", "7"),
        ("Answer: The product of 6 and 8 is 48.", "48"),
        ("Answer: 48 (because 6 * 8)", "48"),
        ("Answer: 2 3/4", "2 3/4"),
        ("Answer: 2 3/4 cups", "2 3/4"),
        ("I ate 2 3/4", "2 3/4"),  # the fallback keeps a mixed number whole
    ],
)
def test_extract_answer(completion: str, answer: str) -> None:
    assert extract_answer(completion) == answer


def test_extract_answer_none_without_numbers() -> None:
    assert extract_answer("I do not know.") is None


@pytest.mark.parametrize(
    ("predicted", "expected", "match"),
    [
        ("1000.0", "1,000", True),
        ("$1,000", "1000", True),
        ("0.5", "\\frac{1}{2}", True),
        ("1/2", "0.50", True),
        ("0.33", "\\frac{1}{3}", False),
        ("12", "13", False),
        ("\\dfrac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}", True),  # non-numeric: normalised text
        ("2 \\sqrt{3}", "2\\sqrt{3}", True),
        ("\\sqrt{2}", "\\sqrt{3}", False),
        ("seven", "7", False),
        (None, "7", False),
        ("", "", False),
        ("2 3/4", "11/4", True),
        ("2 3/4", "\\frac{11}{4}", True),
        ("2 3/4", "23/4", False),
        ("\\text{(A)}", "\\text{(A)}", True),  # MATH's text answers
        ("(A)", "\\text{(A)}", True),
        ("\\text{(B)}", "\\text{(A)}", False),
        ("\\text{Monday}", "\\text{Monday}", True),
        ("\\text{Monday}", "\\text{Tuesday}", False),
        ("[-2, 3)", "[-2,3)", True),
        ("[-2, 3)", "[-2,3]", False),
        ("\\{2, 1\\}", "\\{1,2\\}", True),
        ("x^2+2x+1", "(x+1)^2", True),
        ("\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt3}{2}", True),
        ("1/3", "0.333333", False),  # plain numbers compare exactly
        ("\\frac{1}{2", "\\frac{1}{2}", False),  # unbalanced: not parsed, not an error
    ],
)
def test_answers_match(predicted: str | None, expected: str, match: bool) -> None:
    assert answers_match(predicted, expected) is match


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("So the answer is \\boxed{\\text{(A)}}.", "\\text{(A)}", 1.0),
        ("So the answer is \\boxed{\\text{(A)}}.", "\\text{(C)}", 0.0),
        ("6 * 8 means six eights. Answer: 6 * 8 = 48", "48", 1.0),
        ("6 * 8 means six eights. Answer: 6 * 8 = 48", "6", 0.0),
        ("Answer: 2 3/4", "11/4", 1.0),
        ("Answer: 2 3/4", "23/4", 0.0),
        ("The area is \\boxed{\\frac{\\sqrt{3}}{4}}", "\\frac{\\sqrt3}{4}", 1.0),
        ("The roots are \\boxed{\\{-3, 3\\}}", "\\{3,-3\\}", 1.0),
        ("I am not sure.", "7", 0.0),
        ("\\boxed{" + "(" * 300 + "}", "1", 0.0),  # garbage is a zero, never an exception
    ],
)
def test_math_reward_on_strings_that_were_scored_wrong(completion: str, answer: str, reward: float) -> None:
    assert math_reward(completion, answer) == reward


def test_math_reward_binary() -> None:
    assert math_reward("Let me think. 7 + 5 = 12. Answer: 12", "12") == 1.0
    assert math_reward("Answer: 13", "12") == 0.0
    # The boxed answer wins over the marker and over later numbers.
    assert math_reward("Answer: 3. Final: \\boxed{12}. Step 4", "12") == 1.0


@pytest.mark.parametrize(
    ("equation", "value"),
    [
        ("(3 + 5) * 2", Fraction(16)),
        ("3 + 5 * 2", Fraction(13)),
        ("8 / (3 - 8 / 3)", Fraction(24)),
        ("-3 + 5", Fraction(2)),
        ("10 - 2 - 3", Fraction(5)),  # left associative
        ("12 / 4 / 3", Fraction(1)),
        ("((7))", Fraction(7)),
    ],
)
def test_evaluate_equation(equation: str, value: Fraction) -> None:
    assert evaluate_equation(equation) == value


@pytest.mark.parametrize(
    "equation",
    [
        "5 / 0",
        "5 / (3 - 3)",
        "2 ** 3",
        "(1 + 2",
        "1 + 2)",
        "1 +",
        "",
        "2 3",
        "1.5 * 2",
        "__import__('os').system('true')",
        "abs(-3)",
        "(" * 40 + "1" + ")" * 40,
        "1+" * 200 + "1",
    ],
)
def test_evaluate_equation_rejects(equation: str) -> None:
    assert evaluate_equation(equation) is None


@pytest.mark.parametrize(
    ("completion", "numbers", "target", "reward"),
    [
        ("<think>try</think><answer>(3 + 5) * 2</answer>", [3, 5, 2], 16, COUNTDOWN_CORRECT),
        ("<answer> 2*(5+3) </answer>", [3, 5, 2], 16, COUNTDOWN_CORRECT),
        ("<answer>8/(3-8/3)</answer>", [8, 3, 8, 3], 24, COUNTDOWN_CORRECT),  # exact fractions
        ("<answer>3 + 5 * 2</answer>", [3, 5, 2], 16, COUNTDOWN_FORMAT),  # wrong value
        ("<answer>(3 + 5) * 2 = 16</answer>", [3, 5, 2], 16, COUNTDOWN_FORMAT),  # '=16' uses 16
        ("<answer>(3 + 5) * 2</answer>", [3, 5, 2, 7], 16, COUNTDOWN_FORMAT),  # 7 unused
        ("<answer>(3 + 3) * 2</answer>", [3, 5, 2], 12, COUNTDOWN_FORMAT),  # 3 twice, 5 never
        ("<answer>3 * 5 + 1</answer>", [3, 5], 16, COUNTDOWN_FORMAT),  # 1 not given
        ("<answer>2 ** 4</answer>", [2, 4], 16, COUNTDOWN_FORMAT),
        ("<answer>5 / (3 - 3)</answer>", [5, 3, 3], 1, COUNTDOWN_FORMAT),
        ("<answer></answer>", [1], 1, COUNTDOWN_FORMAT),
        ("<answer>__import__('os')</answer>", [1], 1, COUNTDOWN_FORMAT),
        ("<answer>1</answer> then <answer>(3 + 5) * 2</answer>", [3, 5, 2], 16, COUNTDOWN_CORRECT),
        ("(3 + 5) * 2", [3, 5, 2], 16, 0.0),  # no tag
        ("<answer>(3 + 5) * 2", [3, 5, 2], 16, 0.0),  # unclosed tag
    ],
)
def test_countdown_reward(completion: str, numbers: list[int], target: int, reward: float) -> None:
    assert countdown_reward(completion, numbers, target) == reward


def test_countdown_reward_huge_answer_is_bounded() -> None:
    completion = "<answer>" + "9" * 5000 + "</answer>"
    assert countdown_reward(completion, [9], 9) == COUNTDOWN_FORMAT


def test_last_answer_tag_takes_the_last_and_strips() -> None:
    assert last_answer_tag("<answer> 1 </answer>\n<ANSWER>2 + 3</ANSWER>") == "2 + 3"
    assert last_answer_tag("nothing") is None
