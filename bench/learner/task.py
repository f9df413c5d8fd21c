"""The learner's task: integer arithmetic written character by character, with an exact verifier.

A problem is ``a OP b`` with OP one of ``+ - *`` and operands of a given number of digits (its *kind*:
``("+", 3, 2)`` adds a 3-digit and a 2-digit number). The kinds grade difficulty for a small
transformer: one-digit sums are solved at once, six-digit sums and three-by-three-digit products are
out of reach of a few minutes of pre-training, and the kinds between give a spread of pass rates, as a
math set gives an LLM.

Text and tokens. The prompt is ``"{a}{op}{b}"``; the trainer renders it the way it renders any prompt
for a tokenizer without a chat template (``trainer_client.model.render_prompt``: the message and a
newline), so the model sees ``"123+45\\n"`` and answers ``"168"`` then its end-of-sequence token. One token
per character (`CharTokenizer`), plus PAD, EOS and BOS.

The verifier is exact on purpose: a completion is right when its text IS the answer's decimal form
(no spaces, no leading zeros, a minus sign for a negative result) and the model ended it with EOS.
The decoded text of a completion that ran into the length cap, or that holds PAD or BOS (decoded as
``"?"``), never equals an answer, because the cap is longer than any answer. So a completion is
rewarded exactly when its tokens are the answer's tokens followed by EOS, and the probability that a
sample is rewarded is the product of the model's probabilities of those tokens: one teacher-forced
forward pass gives every prompt's true current pass rate (`bench.learner.policy.exact_pass_rates`),
which is what the oracle selects with and what "sampled accuracy" is measured as, with no sampling
noise.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

CHARS = "0123456789+-*\n"
PAD, EOS, BOS = 0, 1, 2
VOCAB_SIZE = 3 + len(CHARS)
_TO_ID = {c: i + 3 for i, c in enumerate(CHARS)}
_SPECIAL_TEXT = "?"  # how PAD and BOS decode: a character no answer holds

OPS = ("+", "-", "*")
# Operand digits per operator. Sums and differences of up to six digits, products of up to three by
# three: wide enough that the hardest kinds stay unsolved after pre-training.
MAX_DIGITS = {"+": (6, 6), "-": (6, 6), "*": (3, 3)}


class CharTokenizer:
    """One token per character of `CHARS`, with the interface the trainer uses (``__call__`` and
    ``decode``; no chat template)."""

    chat_template = None
    pad_token_id = PAD
    eos_token_id = EOS
    bos_token_id = BOS
    vocab_size = VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        try:
            return [_TO_ID[c] for c in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the task's alphabet {CHARS!r}") from None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        ids = self.encode(text)
        return {"input_ids": [BOS, *ids] if add_special_tokens else ids}

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. EOS ends nothing here (the engine stops at it) and is dropped when
        ``skip_special_tokens``; PAD and BOS decode as ``"?"`` either way, so a completion holding them
        never verifies."""
        out = []
        for token in ids:
            if token == EOS:
                if not skip_special_tokens:
                    out.append("<eos>")
            elif token in (PAD, BOS):
                out.append(_SPECIAL_TEXT)
            else:
                out.append(CHARS[token - 3])
        return "".join(out)


@dataclass(frozen=True)
class Kind:
    """A difficulty configuration: the operator and the operands' digit counts."""

    op: str
    digits_a: int
    digits_b: int

    def __str__(self) -> str:
        return f"{self.digits_a}{self.op}{self.digits_b}"


def all_kinds() -> list[Kind]:
    """Every kind of the family, in a fixed order (their index is the group the service can be told)."""
    return [
        Kind(op, a, b)
        for op in OPS
        for a in range(1, MAX_DIGITS[op][0] + 1)
        for b in range(1, MAX_DIGITS[op][1] + 1)
    ]


KINDS = all_kinds()
KIND_INDEX = {kind: i for i, kind in enumerate(KINDS)}


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randrange(0 if digits == 1 else 10 ** (digits - 1), 10**digits)


def evaluate(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}")


@dataclass(frozen=True)
class Problem:
    """One prompt: its user message, its answer text and its kind's index (``group``)."""

    prompt: str
    answer: str
    group: int
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


def _digits(rng: random.Random, most: int) -> int:
    """A digit count in 1..most, fewer digits likelier: P(d) proportional to most + 1 - d."""
    return rng.choices(range(1, most + 1), weights=range(most, 0, -1))[0]


def draw_problem(rng: random.Random, kind: Kind | None = None) -> Problem:
    """A problem of ``kind``, or of a kind drawn from the family's distribution: the operator uniform,
    each operand's digit count d in 1..max with probability proportional to max + 1 - d (a six-digit
    operand is six times rarer than a one-digit one). Pre-training and the pools draw from it."""
    if kind is None:
        op = rng.choice(OPS)
        kind = Kind(op, _digits(rng, MAX_DIGITS[op][0]), _digits(rng, MAX_DIGITS[op][1]))
    a, b = _operand(rng, kind.digits_a), _operand(rng, kind.digits_b)
    return Problem(f"{a}{kind.op}{b}", str(evaluate(a, kind.op, b)), KIND_INDEX[kind])


def max_answer_chars() -> int:
    """The longest answer of the family (a completion cap above it keeps the verifier exact)."""

    def extremes(digits: int) -> tuple[int, int]:
        return (0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

    return max(
        len(str(evaluate(a, kind.op, b)))
        for kind in KINDS
        for a in extremes(kind.digits_a)
        for b in extremes(kind.digits_b)
    )


#: Completion cap of every generation: two tokens past the longest answer and its EOS, so a completion
#: that hits the cap is longer than any answer.
MAX_NEW_TOKENS = max_answer_chars() + 2


def reward(problem: Problem, completion: str) -> float:
    """1.0 when ``completion`` (decoded, EOS dropped) is exactly the answer, else 0.0."""
    return 1.0 if completion == problem.answer else 0.0


@dataclass(frozen=True)
class ArithmeticTask:
    """A prompt set in the shape the trainer's loop takes (``trainer_client.train.TaskLike``)."""

    problems: list[Problem]
    name: str = "char-arithmetic"
    system_prompt: str | None = None

    def reward(self, index: int, completion: str) -> float:
        if not 0 <= index < len(self.problems):
            raise IndexError(f"prompt index {index} is out of range ({len(self.problems)} prompts)")
        return reward(self.problems[index], completion)

    def groups(self) -> list[int]:
        return [p.group for p in self.problems]


def prompt_tokens(tokenizer: CharTokenizer, problems: Sequence[Problem]) -> list[list[int]]:
    """The token ids the trainer feeds for each problem (the message and its newline)."""
    return [tokenizer.encode(p.prompt + "\n") for p in problems]


def answer_tokens(tokenizer: CharTokenizer, problems: Sequence[Problem]) -> list[list[int]]:
    """The tokens a rewarded completion consists of: the answer, then EOS."""
    return [[*tokenizer.encode(p.answer), EOS] for p in problems]
