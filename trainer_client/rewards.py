"""Verifiers: turn a model completion into a reward, without ever executing model output.

Two families:

- Final-answer tasks (procedural arithmetic, GSM8K, MATH). `extract_answer` finds what the model
  committed to, in this order: the last complete ``\\boxed{...}`` (nested braces allowed), the value
  stated on the line of the last "Answer:" / "answer is" marker (the whole line when it is one number,
  else the number after the line's last ``=`` or "is" in its first sentence: "Answer: 6 * 8 = 48" is
  48), a GSM8K-style ``#### n`` line, and finally the last number anywhere in the completion (the
  lenient fallback: a small model that writes "7 + 5 = 12" gets credit). `answers_match` decides
  equality with Hugging Face's ``math-verify`` (the verifier TRL and open-r1 use: SymPy equality of
  numbers, fractions, radicals, sets, intervals, matrices, ``\\text{}`` choices). Plain numbers are
  read here first, exactly, and handed to it as rationals, because its own reading of them is made for
  other conventions: ``2 3/4`` is the mixed number 11/4 (not 23/4, and not 3), ``1,234`` a thousands
  separator (not a European decimal), ``$5`` and ``50%`` plain 5 and 50. Extraction stays ours because
  it encodes this project's prompt contract (the "Answer:" line, ``####``), which no library knows.
- Countdown (TinyZero's game): the completion must put an equation in ``<answer>...</answer>``. Reward
  1.0 when the equation uses every given number exactly once (the multiset of numbers in the equation
  equals the given one, TinyZero's rule) and evaluates to the target within 1e-5; 0.1 when an answer
  tag is present but the equation is wrong, malformed or uses other numbers; 0.0 without an answer tag.
  Departures from TinyZero's reference scorer, all deliberate: the equation is parsed by a small
  recursive-descent evaluator over exact fractions (no ``eval``, no ``**``, no decimals, bounded
  length and nesting), and the last answer tag anywhere in the completion counts (TinyZero reads only
  the last line, because its prompts end the transcript with the answer).

Every function here is total: malformed input yields ``None`` or a zero reward, never an exception.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

__all__ = [
    "COUNTDOWN_CORRECT",
    "COUNTDOWN_FORMAT",
    "answers_match",
    "countdown_reward",
    "evaluate_equation",
    "extract_answer",
    "gsm8k_final_answer",
    "last_answer_tag",
    "last_boxed",
    "math_reward",
    "parse_number",
]

COUNTDOWN_CORRECT = 1.0
COUNTDOWN_FORMAT = 0.1

# Longest equation / deepest parenthesis nesting the Countdown evaluator accepts. Real answers are a few
# dozen characters; the bounds keep adversarial completions from costing time or recursion depth.
_MAX_EQUATION_CHARS = 256
_MAX_NESTING = 32
# Numbers with more digits than this are not answers, they are degenerate output (and slow to convert).
_MAX_NUMBER_CHARS = 64
# Longest non-numeric answer handed to SymPy, and how long it may think about one comparison.
_MAX_ANSWER_CHARS = 512
_SYMPY_TIMEOUT_S = 5

# A number as people write it: optional sign, thousands separators, decimals, or a/b.
# The sign only counts when it does not follow a word character or a closing bracket, so "12-5"
# yields 12 and 5, not 12 and -5.
_PLAIN_NUMBER = (
    r"(?:(?<![\w)\]}])-)?(?:\d+[ \t]+\d+\s*/\s*\d+(?![\d.])|(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
    r"(?:\s*/\s*\d+(?:\.\d+)?)?)"
)
_LATEX_FRAC = r"-?\\[dt]?frac\s*\{[^{}]*\}\s*\{[^{}]*\}"
_NUMBER_TOKEN = re.compile(rf"{_LATEX_FRAC}|{_PLAIN_NUMBER}")
_ANSWER_MARKER = re.compile(r"\banswer\b\s*(?:is\b|:|=)", re.IGNORECASE)
_GSM8K_MARKER = "####"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=\S)")
_STATES = re.compile(r"=|\bis\b", re.IGNORECASE)  # what separates a computation from its value
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_BOX_COMMANDS = ("\\boxed", "\\fbox")

# Decorations around a number that do not change its value.
_TEXT_BLOCK = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{[^{}]*\}")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_FRAC_BRACED = re.compile(r"^(-?)\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}$")
_FRAC_SHORT = re.compile(r"^(-?)\\[dt]?frac\s*(\d)(\d)$")  # \frac12
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)$")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_MIXED = re.compile(r"^(-?)(\d+)\s+(\d+)/(\d+)$")


def parse_number(text: str | None) -> Fraction | None:
    """The exact value of a number written as text, or None when it is not a single number.

    Accepts signs, ``$``/``\\$``, thousands separators (``1,234``), decimals (``12.50``, ``12.``),
    trailing ``%`` and units in ``\\text{...}``, ``a/b``, mixed numbers (``2 3/4`` = 11/4),
    ``\\frac{a}{b}`` (also ``\\dfrac``, ``\\tfrac``, ``\\frac12``), and surrounding ``$...$`` or
    ``\\(...\\)``. ``1,2`` is not a number (ambiguous), neither are ``1 234`` and ``3 apples and 4
    pears``.
    """
    if text is None:
        return None
    s = text.strip()
    if not s or len(s) > _MAX_NUMBER_CHARS * 2:
        return None
    s = _TEXT_BLOCK.sub("", s)
    s = _DEGREES.sub("", s)
    for old in ("\\left", "\\right", "\\!", "\\,", "\\;", "{,}", "\\$", "$", "\\(", "\\)", "\\%", "%"):
        s = s.replace(old, "")
    s = s.strip().rstrip(".,;:").strip()
    while len(s) >= 2 and s[0] in "({[" and s[-1] in ")}]" and _balanced(s[1:-1]):
        s = s[1:-1].strip()
    # Spaces are meaningful inside a number ("2 3/4" is not 23/4): only those around a slash go.
    s = re.sub(r"\s*/\s*", "/", s)
    if not s or len(s) > _MAX_NUMBER_CHARS:
        return None

    if match := _FRAC_BRACED.match(s) or _FRAC_SHORT.match(s):
        sign, numerator, denominator = match.groups()
        return _ratio(parse_number(numerator), parse_number(denominator), negative=sign == "-")
    if match := _MIXED.match(s):  # 2 3/4: a whole number and a proper fraction
        sign, whole, numerator, denominator = match.groups()
        if not 0 < int(numerator) < int(denominator):
            return None
        value = int(whole) + Fraction(int(numerator), int(denominator))
        return -value if sign else value
    if any(char.isspace() for char in s):
        return None
    if s.count("/") == 1:
        numerator, denominator = s.split("/")
        return _ratio(parse_number(numerator), parse_number(denominator), negative=False)
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    if not _DECIMAL.match(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def _ratio(numerator: Fraction | None, denominator: Fraction | None, *, negative: bool) -> Fraction | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    value = numerator / denominator
    return -value if negative else value


def _balanced(s: str) -> bool:
    depth = 0
    for char in s:
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


def _math_value(text: str) -> list[Any]:
    """``text`` as math-verify's parsed form: our exact reading of a plain number as a SymPy rational,
    else math-verify's own parse of it as a boxed LaTeX answer ([] when it cannot be read)."""
    value = parse_number(text)
    if value is not None:
        import sympy

        return [sympy.Rational(value.numerator, value.denominator), text]
    if len(text) > _MAX_ANSWER_CHARS or not _balanced_braces(text):
        return []
    from math_verify import LatexExtractionConfig, parse

    return parse(
        "\\boxed{" + text + "}",
        extraction_config=[LatexExtractionConfig(boxed_match_priority=0)],
        parsing_timeout=_timeout_s(),
    )


def _timeout_s() -> int | None:
    """math-verify bounds SymPy work with SIGALRM, which only the main thread may use; elsewhere the
    input length bound (``_MAX_ANSWER_CHARS``) is the only limit."""
    return _SYMPY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _balanced_braces(text: str) -> bool:
    depth = 0
    for char in text:
        depth += (char == "{") - (char == "}")
        if depth < 0:
            return False
    return depth == 0


def answers_match(predicted: str | None, expected: str) -> bool:
    """Whether a predicted final answer equals the reference, decided by math-verify's ``verify``
    (numbers compared exactly after our reading of them, see the module docstring)."""
    if predicted is None or not predicted.strip() or not expected.strip():
        return False
    gold = _math_value(expected)
    if not gold:
        return False
    guess = _math_value(predicted)
    if not guess:
        return False
    from math_verify import verify

    try:
        return bool(verify(gold, guess, timeout_seconds=_timeout_s()))
    except Exception:  # a verifier must never crash the loop: what cannot be verified is wrong
        return False


def last_boxed(text: str) -> str | None:
    """Content of the last complete ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces included.

    A box left open (a truncated completion) is skipped in favour of an earlier complete one. The
    brace-less form ``\\boxed 5`` yields the token after the space.
    """
    starts = sorted(
        (m.start(), m.end())
        for command in _BOX_COMMANDS
        for m in re.finditer(re.escape(command) + r"(?![A-Za-z])", text)
    )
    for _start, end in reversed(starts):
        rest = text[end:]
        stripped = rest.lstrip()
        if stripped.startswith("{"):
            content = _braced_content(stripped)
            if content is not None:
                return content.strip()
        elif rest[:1] == " " and stripped:
            token = re.match(r"[^\s$]+", stripped)
            if token:
                return token.group(0)
    return None


def _braced_content(s: str) -> str | None:
    """Given a string starting with ``{``, the text up to its matching ``}``; None if never closed."""
    depth = 0
    for position, char in enumerate(s):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return s[1:position]
    return None


def gsm8k_final_answer(solution: str) -> str | None:
    """The final answer of a GSM8K-style solution: the text after the last ``####`` (one line)."""
    position = solution.rfind(_GSM8K_MARKER)
    if position < 0:
        return None
    line = solution[position + len(_GSM8K_MARKER) :].strip().splitlines()
    return line[0].strip() if line and line[0].strip() else None


def _first_number(text: str) -> str | None:
    match = _NUMBER_TOKEN.search(text)
    return match.group(0) if match else None


def _last_number(text: str) -> str | None:
    last = None
    for match in _NUMBER_TOKEN.finditer(text):
        last = match.group(0)
    return last


def _stated_value(line: str) -> str | None:
    """The value an answer line states: the whole line when it is one number ("2 3/4", "$1,200"),
    else the first number after the last ``=`` or "is" of its first sentence ("6 * 8 = 48" -> 48,
    "The result is 48" -> 48), else that sentence's first number ("12 apples. Hope this helps! 3" -> 12).
    """
    whole = line.strip().rstrip(".,;:").strip()
    if parse_number(whole) is not None:
        return whole
    sentence = _SENTENCE_END.split(line, maxsplit=1)[0]
    cuts = [m.end() for m in _STATES.finditer(sentence)]
    if cuts:
        found = _first_number(sentence[cuts[-1] :])
        if found is not None:
            return found
    return _first_number(sentence)


def extract_answer(completion: str) -> str | None:
    """What the completion commits to as its final answer (see the module docstring for the order).

    Returns the answer as text (for `answers_match`), or None when the completion has no number and
    no boxed answer at all.
    """
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    markers = list(_ANSWER_MARKER.finditer(completion))
    if markers:
        tail = completion[markers[-1].end() :]
        lines = tail.strip().splitlines()
        value = _stated_value(lines[0]) if lines else None
        if value is not None:
            return value
        found = _first_number(tail)
        if found is not None:
            return found
    hashed = gsm8k_final_answer(completion)
    if hashed is not None:
        return hashed if parse_number(hashed) is not None else (_first_number(hashed) or hashed)
    return _last_number(completion)


def math_reward(completion: str, answer: str) -> float:
    """1.0 when the completion's final answer equals `answer` (see `answers_match`), else 0.0."""
    return 1.0 if answers_match(extract_answer(completion), answer) else 0.0


# --------------------------------------------------------------------------------------------------
# Countdown
# --------------------------------------------------------------------------------------------------


def last_answer_tag(completion: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` in the completion (stripped), or None."""
    matches = _ANSWER_TAG.findall(completion)
    return matches[-1].strip() if matches else None


_EQUATION_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*/()]))")


def _tokenize_equation(equation: str) -> list[str] | None:
    tokens: list[str] = []
    position = 0
    while position < len(equation):
        match = _EQUATION_TOKEN.match(equation, position)
        if match is None:
            if equation[position:].strip() == "":
                break
            return None  # a character that is not a digit, operator, parenthesis or space
        tokens.append(match.group(1) or match.group(2))
        position = match.end()
    return tokens


class _EquationParser:
    """Recursive descent over ``expr := term (('+'|'-') term)*``, ``term := factor (('*'|'/') factor)*``,
    ``factor := ('+'|'-') factor | integer | '(' expr ')'``, evaluated with exact fractions."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.position = 0
        self.depth = 0

    def parse(self) -> Fraction:
        value = self._expression()
        if self.position != len(self.tokens):
            raise ValueError("unexpected trailing tokens")
        return value

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise ValueError("unexpected end of equation")
        self.position += 1
        return token

    def _expression(self) -> Fraction:
        value = self._term()
        while self._peek() in ("+", "-"):
            operator = self._take()
            right = self._term()
            value = value + right if operator == "+" else value - right
        return value

    def _term(self) -> Fraction:
        value = self._factor()
        while self._peek() in ("*", "/"):
            operator = self._take()
            if operator == "*" and self._peek() == "*":
                raise ValueError("exponentiation is not a Countdown operation")
            right = self._factor()
            if operator == "*":
                value = value * right
            else:
                if right == 0:
                    raise ValueError("division by zero")
                value = value / right
        return value

    def _factor(self) -> Fraction:
        token = self._take()
        if token in ("+", "-"):
            self.depth += 1
            if self.depth > _MAX_NESTING:
                raise ValueError("nested too deeply")
            operand = self._factor()
            self.depth -= 1
            return operand if token == "+" else -operand
        if token == "(":
            self.depth += 1
            if self.depth > _MAX_NESTING:
                raise ValueError("nested too deeply")
            value = self._expression()
            if self._take() != ")":
                raise ValueError("unbalanced parentheses")
            self.depth -= 1
            return value
        if token.isdigit():
            return Fraction(int(token))
        raise ValueError(f"unexpected token {token!r}")


def evaluate_equation(equation: str) -> Fraction | None:
    """Exact value of an arithmetic expression over non-negative integers with ``+ - * /`` and
    parentheses, or None when it is malformed, divides by zero, or is too long / too deeply nested.

    This is the only way equations are evaluated: model output is never passed to ``eval``.
    """
    if len(equation) > _MAX_EQUATION_CHARS:
        return None
    tokens = _tokenize_equation(equation)
    if not tokens:
        return None
    try:
        return _EquationParser(tokens).parse()
    except ValueError:
        return None


def countdown_reward(
    completion: str,
    numbers: Sequence[int],
    target: int,
    *,
    format_score: float = COUNTDOWN_FORMAT,
    correct_score: float = COUNTDOWN_CORRECT,
) -> float:
    """TinyZero's Countdown reward: `correct_score` for a right equation in the last answer tag,
    `format_score` for any other answer tag, 0.0 without one (see the module docstring)."""
    equation = last_answer_tag(completion)
    if equation is None:
        return 0.0
    if len(equation) > _MAX_EQUATION_CHARS:
        return format_score
    used = [int(token) for token in re.findall(r"\d+", equation)]
    if Counter(used) != Counter(int(n) for n in numbers):
        return format_score
    value = evaluate_equation(equation)
    if value is None or abs(float(value) - target) >= 1e-5:
        return format_score
    return correct_score
