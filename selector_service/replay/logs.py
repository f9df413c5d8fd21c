"""A run's per-prompt outcomes, read from what runs write: one group per (step, prompt).

Formats (`read_log`, `fmt="auto"` tells them apart):

- ``rows``: JSONL or parquet, one row per group, ``{"step": 12, "prompt_id": 17, "rewards": [1, 0, 1, 1]}``
  or with ``"successes": 3, "trials": 4`` instead of ``rewards``. The column names are `Columns`' (any
  other names are mapped on the command line). A reward column that holds one number per row makes each
  row one rollout; the rows of one (step, prompt) then pool into its group.
- ``verl``: verl's rollout dump (``trainer.rollout_data_dir``): a folder of ``<step>.jsonl`` files, one
  line per rollout. verl 0.9.1 writes them in ``RayPPOTrainer._write_generations``
  (verl/trainer/ppo/ray_trainer.py:454-477; the v1 trainer's twin, verl/trainer/ppo/v1/trainer_base.py:
  1226-1260): ``input`` (the decoded prompt), ``output``, ``gts``, ``score`` (the sum of the sample's
  token-level scores), ``step`` (the trainer's global step), then the reward function's extra fields and
  ``request_id`` or ``uid`` when present. The prompt is its text (``input``), the reward ``score``.
- ``accuracy``: a JSON object ``{prompt: [accuracy at epoch 0, epoch 1, ...]}``, accuracies in multiples
  of 1/R for R rollouts per prompt per epoch (One-Shot-RLVR's ``acc_step_500.json``). Value j of a prompt
  is taken as its epoch j; the file does not say where a prompt missed an epoch, so only the epochs every
  prompt has are read (the shortest list).

Prompts: a key that is an integer is the prompt's id; a key that is text is identified by the first 8
bytes of the SHA-256 of its UTF-8 encoding, read as a big-endian unsigned integer (`prompt_key`), which
is the same in every process and on every machine. The replay numbers the distinct keys 0..N-1 in
increasing order. Rewards go through the success threshold as ``/observe`` does in binary mode
(docs/methods.md §0): a rollout succeeds when its reward is >= the threshold.

Errors (`LogError`) name the file and the line (JSONL, from 1) or row (parquet, from 0) and say what to
do; nothing is read half: a log is accepted whole or refused.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np

__all__ = ["FORMATS", "VERL_COLUMNS", "Columns", "LogError", "RunLog", "prompt_key", "read_log"]

FORMATS = ("auto", "rows", "verl", "accuracy")
Format = Literal["auto", "rows", "verl", "accuracy"]


class LogError(ValueError):
    """The log cannot be replayed; the message names the line or row and says what to change."""


@dataclass(frozen=True)
class Columns:
    """Which column holds what (``rewards``, or ``successes`` and ``trials``)."""

    prompt: str = "prompt_id"
    step: str = "step"
    rewards: str = "rewards"
    successes: str = "successes"
    trials: str = "trials"


#: The fields of verl's rollout dump (module docstring).
VERL_COLUMNS = Columns(prompt="input", step="step", rewards="score")


def prompt_key(text: str) -> int:
    """A prompt given as text: the first 8 bytes of the SHA-256 of its UTF-8 text, big-endian."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


@dataclass(frozen=True)
class RunLog:
    """One group per (step, prompt), sorted by step, then prompt.

    `prompts` are dense ids 0..N-1; `keys[i]` is prompt i's key (its integer id in the log, or the hash of
    its text when `hashed`)."""

    steps: np.ndarray  # int64[G]
    prompts: np.ndarray  # int64[G]
    successes: np.ndarray  # int64[G]
    trials: np.ndarray  # int64[G]
    keys: np.ndarray  # int64[N] or uint64[N]
    hashed: bool
    rows: int
    format: str
    source: str
    #: The rows are one per rollout (pooled into groups), not one per group.
    per_rollout: bool = False
    #: With ``accuracy``: epochs beyond the shortest prompt's list, left out.
    notes: tuple[str, ...] = field(default=())

    @property
    def n_prompts(self) -> int:
        return int(self.keys.size)

    @property
    def n_groups(self) -> int:
        return int(self.steps.size)


# ---- reading rows ---------------------------------------------------------------------------------------
@dataclass
class _Rows:
    """Rows as read, before grouping: where each came from (for errors) and its values."""

    label: str  # "line" or "row"
    steps: list[int] = field(default_factory=list)
    keys: list[int] = field(default_factory=list)
    successes: list[int] = field(default_factory=list)
    trials: list[int] = field(default_factory=list)
    where: list[int] = field(default_factory=list)  # line (from 1) or row (from 0)
    files: list[int] = field(default_factory=list)  # index into `paths`
    paths: list[Path] = field(default_factory=list)
    hashed: bool | None = None
    per_rollout: bool | None = None
    texts: dict[str, int] = field(default_factory=dict)  # text -> key (a cache; also names prompts in errors)

    def at(self, i: int) -> str:
        """Where row i came from, as a user finds it."""
        return f"{self.paths[self.files[i]]}: {self.label} {self.where[i]}"

    def shown(self, key: int) -> str:
        if not self.hashed:
            return str(key)
        for text, value in self.texts.items():
            if value == key:
                return repr(text if len(text) <= 60 else text[:57] + "...")
        return f"#{key}"  # pragma: no cover - every hashed key came from a text


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _where(path: Path, label: str, at: int) -> str:
    return f"{path}: {label} {at}"


def _key(rows: _Rows, value: Any, place: str, column: str) -> int:
    if isinstance(value, str):
        if rows.hashed is False:
            raise LogError(f"{place}: prompt {value!r} is text where earlier rows gave integer ids")
        rows.hashed = True
        key = rows.texts.get(value)
        if key is None:
            key = rows.texts[value] = prompt_key(value)
        return key
    if isinstance(value, int) and not isinstance(value, bool):
        if rows.hashed is True:
            raise LogError(f"{place}: prompt {value!r} is an integer id where earlier rows gave text")
        rows.hashed = False
        return value
    raise LogError(
        f"{place}: the prompt ({column!r}) must be an integer id or the prompt's text, not {value!r}"
    )


def _kind(rows: _Rows, per_rollout: bool, place: str) -> None:
    if rows.per_rollout is None:
        rows.per_rollout = per_rollout
    elif rows.per_rollout != per_rollout:
        was = "one number per rollout" if rows.per_rollout else "a group per row"
        raise LogError(
            f"{place}: this row is {'a rollout' if per_rollout else 'a group'}, earlier rows {was}"
        )


def _reward(value: Any, place: str, column: str) -> float:
    if not _is_number(value):
        raise LogError(f"{place}: reward {value!r} (column {column!r}) is not a number")
    if not math.isfinite(value):
        raise LogError(f"{place}: reward {value!r} (column {column!r}) is not finite")
    return float(value)


def _count(value: Any, place: str, name: str) -> int:
    if not _is_number(value) or not math.isfinite(value) or value != int(value):
        raise LogError(f"{place}: {name} {value!r} is not a whole number")
    return int(value)


def _missing(place: str, column: str, row: dict[str, Any], option: str) -> LogError:
    present = ", ".join(repr(k) for k in list(row)[:12])
    return LogError(
        f"{place}: no column {column!r} (this row has {present}); name the column that holds it with {option}"
    )


def _add_row(rows: _Rows, row: Any, place: str, cols: Columns, threshold: float) -> None:
    if not isinstance(row, dict):
        raise LogError(f"{place}: a row is a JSON object, not {type(row).__name__}")
    try:
        raw_step = row[cols.step]
    except KeyError:
        raise _missing(place, cols.step, row, "--step-column") from None
    if isinstance(raw_step, bool) or not isinstance(raw_step, int):
        raise LogError(f"{place}: step {raw_step!r} (column {cols.step!r}) is not an integer")
    try:
        raw_key = row[cols.prompt]
    except KeyError:
        raise _missing(place, cols.prompt, row, "--prompt-column") from None
    key = _key(rows, raw_key, place, cols.prompt)
    if cols.rewards in row:
        value = row[cols.rewards]
        if isinstance(value, list):
            _kind(rows, False, place)
            if not value:
                raise LogError(f"{place}: rewards (column {cols.rewards!r}) is an empty list")
            rewards = [_reward(r, place, cols.rewards) for r in value]
            successes = sum(1 for r in rewards if r >= threshold)
            trials = len(rewards)
        else:
            _kind(rows, True, place)
            successes = int(_reward(value, place, cols.rewards) >= threshold)
            trials = 1
    elif cols.successes in row or cols.trials in row:
        _kind(rows, False, place)
        if cols.successes not in row:
            raise _missing(place, cols.successes, row, "--successes-column")
        if cols.trials not in row:
            raise _missing(place, cols.trials, row, "--trials-column")
        successes = _count(row[cols.successes], place, "successes")
        trials = _count(row[cols.trials], place, "trials")
        if trials < 1 or not 0 <= successes <= trials:
            raise LogError(
                f"{place}: successes {successes} of {trials} trials: need 0 <= successes <= trials >= 1"
            )
    else:
        raise _missing(
            place, cols.rewards, row, "--reward-column (or --successes-column and --trials-column)"
        )
    rows.steps.append(raw_step)
    rows.keys.append(key)
    rows.successes.append(successes)
    rows.trials.append(trials)


def _jsonl_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    try:
        with path.open("rb") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    yield number, line
    except OSError as exc:
        raise LogError(f"cannot read {path}: {exc}") from None


def _read_jsonl(rows: _Rows, path: Path, cols: Columns, threshold: float) -> None:
    decoder = msgspec.json.Decoder()
    rows.paths.append(path)
    file_index = len(rows.paths) - 1
    for number, line in _jsonl_lines(path):
        place = _where(path, "line", number)
        try:
            row = decoder.decode(line)
        except msgspec.DecodeError as exc:
            raise LogError(f"{place}: not a JSON object ({exc})") from None
        _add_row(rows, row, place, cols, threshold)
        rows.where.append(number)
        rows.files.append(file_index)


def _numeric_array(column: Any, name: str, path: Path, integer: bool) -> np.ndarray:
    """A parquet column of numbers as numpy (float64, or int64 when `integer`), refusing nulls, text,
    NaN and (for `integer`) fractions with the first offending row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if column.null_count:
        row = int(np.flatnonzero(np.asarray(pc.is_null(column)))[0])
        raise LogError(f"{path}: row {row}: {name} is missing (null)")
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        first = column.slice(0, 1).to_pylist()[0] if len(column) else None
        raise LogError(f"{path}: row 0: {name} {first!r} is not a number (the column holds {kind})")
    values = column.to_numpy()
    if pa.types.is_floating(kind):
        bad = ~np.isfinite(values)
        if integer:
            bad |= values != np.floor(values)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            what = "a whole number" if integer else "finite"
            raise LogError(f"{path}: row {row}: {name} {values[row]!r} is not {what}")
    out: np.ndarray = values.astype(np.int64) if integer else values.astype(np.float64)
    return out


def _read_parquet(rows: _Rows, path: Path, cols: Columns, threshold: float) -> None:
    try:
        import pyarrow as pa
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - the replay extra installs it
        raise LogError(
            "reading parquet needs pyarrow: pip install 'rlvr-selector[replay]' (or pyarrow)"
        ) from None
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise LogError(f"cannot read {path} as parquet: {exc}") from None
    names = table.column_names
    shown = ", ".join(repr(n) for n in names[:12])

    def need(column: str, option: str) -> Any:
        if column not in names:
            raise LogError(f"{path}: no column {column!r} (it has {shown}); name the column with {option}")
        return table.column(column).combine_chunks()

    n = table.num_rows
    steps = _numeric_array(need(cols.step, "--step-column"), "step", path, integer=True)
    prompt = need(cols.prompt, "--prompt-column")
    if prompt.null_count:
        row = int(np.flatnonzero(np.asarray(pc.is_null(prompt)))[0])
        raise LogError(f"{path}: row {row}: the prompt ({cols.prompt!r}) is missing (null)")
    if pa.types.is_integer(prompt.type):
        if rows.hashed is True:
            raise LogError(f"{path}: row 0: integer prompt ids where earlier rows gave text")
        rows.hashed = False
        keys = prompt.to_numpy().astype(np.int64).tolist()
    elif pa.types.is_string(prompt.type) or pa.types.is_large_string(prompt.type):
        if rows.hashed is False:
            raise LogError(f"{path}: row 0: prompts as text where earlier rows gave integer ids")
        rows.hashed = True
        keys = []
        for text in prompt.to_pylist():
            key = rows.texts.get(text)
            if key is None:
                key = rows.texts[text] = prompt_key(text)
            keys.append(key)
    else:
        raise LogError(
            f"{path}: row 0: the prompt ({cols.prompt!r}) must be an integer id or the prompt's text, "
            f"not {prompt.type}"
        )
    if cols.rewards in names:
        rewards = table.column(cols.rewards).combine_chunks()
        kind = rewards.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
            _kind(rows, False, f"{path}: row 0")
            if rewards.null_count:
                row = int(np.flatnonzero(np.asarray(pc.is_null(rewards)))[0])
                raise LogError(f"{path}: row {row}: rewards is missing (null)")
            lengths = np.asarray(pc.list_value_length(rewards)).astype(np.int64)
            if (lengths < 1).any():
                row = int(np.flatnonzero(lengths < 1)[0])
                raise LogError(f"{path}: row {row}: rewards (column {cols.rewards!r}) is an empty list")
            flat = pc.list_flatten(rewards)
            try:
                values = _numeric_array(flat, "reward", path, integer=False)
            except LogError as exc:  # name the row, not the position in the flattened list
                bad = _first_bad_reward(flat)
                row = int(np.searchsorted(np.cumsum(lengths), bad, side="right"))
                message = str(exc).split(": ", 2)[-1]
                raise LogError(f"{path}: row {row}: {message}") from None
            starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
            successes = np.add.reduceat((values >= threshold).astype(np.int64), starts)
            trials = lengths
        else:
            _kind(rows, True, f"{path}: row 0")
            values = _numeric_array(rewards, "reward", path, integer=False)
            successes = (values >= threshold).astype(np.int64)
            trials = np.ones(n, dtype=np.int64)
    elif cols.successes in names or cols.trials in names:
        _kind(rows, False, f"{path}: row 0")
        successes = _numeric_array(need(cols.successes, "--successes-column"), "successes", path, True)
        trials = _numeric_array(need(cols.trials, "--trials-column"), "trials", path, True)
        bad = (trials < 1) | (successes < 0) | (successes > trials)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise LogError(
                f"{path}: row {row}: successes {successes[row]} of {trials[row]} trials: need 0 <= "
                "successes <= trials >= 1"
            )
    else:
        raise LogError(
            f"{path}: no column {cols.rewards!r} (it has {shown}); name the reward column with "
            "--reward-column (or --successes-column and --trials-column)"
        )
    rows.paths.append(path)
    rows.steps.extend(steps.tolist())
    rows.keys.extend(keys)
    rows.successes.extend(np.asarray(successes).tolist())
    rows.trials.extend(np.asarray(trials).tolist())
    rows.where.extend(range(n))
    rows.files.extend([len(rows.paths) - 1] * n)


def _first_bad_reward(flat: Any) -> int:
    """Position of the first null, non-number or non-finite value of a flattened reward list."""
    values = flat.to_pylist()
    for i, value in enumerate(values):
        if not _is_number(value) or not math.isfinite(value):
            return i
    return 0  # pragma: no cover - called only when a value is bad


def _group(rows: _Rows, fmt: str, source: str, notes: Iterable[str] = ()) -> RunLog:
    if not rows.steps:
        raise LogError(f"{source}: the log holds no rows")
    keys = np.asarray(rows.keys, dtype=np.uint64 if rows.hashed else np.int64)
    distinct, prompts = np.unique(keys, return_inverse=True)
    prompts = prompts.astype(np.int64).reshape(-1)
    steps = np.asarray(rows.steps, dtype=np.int64)
    successes = np.asarray(rows.successes, dtype=np.int64)
    trials = np.asarray(rows.trials, dtype=np.int64)
    order = np.lexsort((prompts, steps))
    steps, prompts = steps[order], prompts[order]
    successes, trials = successes[order], trials[order]
    same = (steps[1:] == steps[:-1]) & (prompts[1:] == prompts[:-1])
    if rows.per_rollout:
        starts = np.flatnonzero(np.concatenate(([True], ~same)))
        successes = np.add.reduceat(successes, starts)
        trials = np.add.reduceat(trials, starts)
        steps, prompts = steps[starts], prompts[starts]
    elif same.any():
        i = int(np.flatnonzero(same)[0])
        first, second = sorted((int(order[i]), int(order[i + 1])))
        raise LogError(
            f"{rows.at(second)}: prompt {rows.shown(int(keys[second]))} is seen twice in step "
            f"{int(steps[i])} (first at {rows.at(first)}): a row is one group, a step holds one per "
            "prompt; a log of one row per rollout gives a single number per row"
        )
    return RunLog(
        steps=steps,
        prompts=prompts,
        successes=successes,
        trials=trials,
        keys=distinct,
        hashed=bool(rows.hashed),
        rows=len(rows.steps),
        format=fmt,
        source=source,
        per_rollout=bool(rows.per_rollout),
        notes=tuple(notes),
    )


# ---- the accuracy file ----------------------------------------------------------------------------------
def _read_accuracy(path: Path, trials: int) -> RunLog:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise LogError(f"cannot read {path} as JSON: {exc}") from None
    if not isinstance(raw, dict) or not raw:
        raise LogError(f"{path}: an accuracy file is a JSON object {{prompt: [accuracy per epoch, ...]}}")
    for key, values in raw.items():
        if not isinstance(values, list) or not values:
            raise LogError(
                f"{path}: prompt {key!r}: a non-empty list of accuracies, one per epoch, is needed"
            )
    digits = all(key.isdigit() for key in raw)
    names = sorted(raw, key=lambda k: (len(k), k)) if digits else sorted(raw)
    shortest = min(len(raw[k]) for k in names)
    longest = max(len(raw[k]) for k in names)
    rows = _Rows(label="prompt", hashed=not digits, per_rollout=False)
    rows.paths.append(path)
    for key in names:
        ident = int(key) if digits else rows.texts.setdefault(key, prompt_key(key))
        for epoch, value in enumerate(raw[key][:shortest]):
            place = f"{path}: prompt {key!r}, epoch {epoch}"
            if not _is_number(value) or not math.isfinite(value) or not 0.0 <= value <= 1.0:
                raise LogError(f"{place}: accuracy {value!r} is not a number in [0, 1]")
            successes = round(value * trials)
            if abs(successes - value * trials) > 1e-6:
                raise LogError(
                    f"{place}: accuracy {value!r} is not a multiple of 1/{trials}: give the rollouts per "
                    "prompt per epoch with --trials"
                )
            rows.steps.append(epoch)
            rows.keys.append(ident)
            rows.successes.append(successes)
            rows.trials.append(trials)
            rows.where.append(epoch)
            rows.files.append(0)
    notes = []
    if longest > shortest:
        notes.append(
            f"prompts have {shortest} to {longest} epochs; the file does not say where a prompt missed one, "
            f"so the first {shortest} (every prompt's) are replayed"
        )
    return _group(rows, "accuracy", str(path), notes)


# ---- dispatch -------------------------------------------------------------------------------------------
def _verl_files(path: Path) -> list[Path]:
    files = [p for p in path.iterdir() if p.suffix == ".jsonl"]
    if not files:
        raise LogError(
            f"{path}: a folder to replay holds <step>.jsonl files (verl's rollout_data_dir); none here"
        )
    return sorted(files, key=lambda p: (0, int(p.stem), "") if p.stem.isdigit() else (1, 0, p.stem))


def _first_row(path: Path) -> Any:
    for _, line in _jsonl_lines(path):
        try:
            return msgspec.json.decode(line)
        except msgspec.DecodeError:
            return None
    return None


def detect_format(path: Path) -> str:
    """``verl`` for a folder or a JSONL file whose rows carry ``input`` and ``score``; ``accuracy`` for a
    ``.json`` file; else ``rows``."""
    if path.is_dir():
        return "verl"
    if path.suffix == ".json":
        return "accuracy"
    if path.suffix == ".parquet":
        return "rows"
    row = _first_row(path)
    if isinstance(row, dict) and "input" in row and "score" in row and "prompt_id" not in row:
        return "verl"
    return "rows"


def read_log(
    path: str | Path,
    *,
    fmt: str = "auto",
    columns: Columns | None = None,
    success_threshold: float = 1.0,
    trials: int = 8,
) -> RunLog:
    """Read the log at `path` (module docstring); `columns` overrides the format's column names, `trials`
    is an accuracy file's rollouts per prompt per epoch. Raises LogError."""
    path = Path(path)
    if not path.exists():
        raise LogError(f"no log at {path}")
    if fmt not in FORMATS:
        raise LogError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")
    if not math.isfinite(success_threshold):
        raise LogError(f"the success threshold must be a finite number, got {success_threshold}")
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt == "accuracy":
        if trials < 1:
            raise LogError(f"--trials must be >= 1, got {trials}")
        return _read_accuracy(path, trials)
    cols = columns or (VERL_COLUMNS if fmt == "verl" else Columns())
    files = _verl_files(path) if path.is_dir() else [path]
    rows = _Rows(label="line")
    for file in files:
        if file.suffix == ".parquet":
            rows.label = "row"
            _read_parquet(rows, file, cols, success_threshold)
        else:
            _read_jsonl(rows, file, cols, success_threshold)
    return _group(rows, fmt, str(path))
