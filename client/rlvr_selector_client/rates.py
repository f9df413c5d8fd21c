"""Per-prompt pass rates from a file, each with the number of samples behind it, uploaded to a dataset
(docs/strategies.md, "Starting cold"): the rates a dataset ships, or a profile measured for the run.

    python -m rlvr_selector_client.rates import FILE --dataset NAME [--format F] [--column C]
        [--samples-column S | --samples N] [--model M] [--profile] [--offset O] [--service-url URL]
    python -m rlvr_selector_client.rates check FILE [same reading options]   # reads, uploads nothing

Row i of the file is prompt id i (JSONL line, parquet row, JSON array entry), NeMo-Gym's profiles
excepted (their ``_ng_task_index``). Formats (``--format``, default ``auto``: told apart by the file's
extension and first row):

- ``column``: a JSONL, parquet or JSON-array-of-objects file whose ``--column`` (default ``pass_rate``;
  a dotted path reaches into nested objects, ``extra_info.pass_rate``) holds each prompt's rate in
  [0, 1] or null; the samples behind it come from ``--samples-column`` (default ``pass_samples`` when
  the file has it) or ``--samples N`` for every row.
- ``array``: a JSON array with one rate in [0, 1] or null per prompt (``--samples N`` for their count).
- ``skywork``: Skywork-OR1-RL-Data's ``extra_info.model_difficulty.<model>`` (``--model``, default
  ``DeepSeek-R1-Distill-Qwen-7B``; the card lists ``-1.5B``, ``-7B`` and ``-32B``): how many of 16
  samples of that model failed (SkyworkAI/Skywork-OR1 issue 40: "16 means the model got 16 incorrect on
  16 attempts"), so the rate is ``(16 - d) / 16`` from 16 samples. Skywork's own scripts keep ``1 <= d
  <= 15`` (or1_scripts/data_preprocess/download_and_filter_data_7b.py).
- ``polaris``: Polaris-Dataset-53K's ``difficulty``, "the pass rate of the problem estimated by
  Deepseek-R1-distill-Qwen-7B" (its card), a string ``"k/8"``: rate k/8 from 8 samples (a bare number
  in [0, 1] is a rate from ``--samples``, default 8).
- ``nemo-gym``: the ``<rollouts>_reward_profiling.jsonl`` that NeMo-Gym's ``gym eval profile`` writes
  (nemo_gym 0.7.0, nemo_gym/reward_profile.py ``RewardProfiler.write_to_disk``, lines 488-512, one row per
  task from ``profile_from_data``, lines 367-471; run by ``gym eval profile``, nemo_gym/cli/eval.py
  ``reward_profile``, line 616): a task's rate is its ``mean/reward`` (the pass rate
  for binary rewards; it must lie in [0, 1]), from ``num_rollouts`` samples, for prompt id
  ``_ng_task_index``; a task profiled without rollouts has no row and stays unknown.

Every row is read and checked before anything is sent: a rate outside [0, 1], a count below 1, a
missing column, a count out of range, a file of the wrong length for the dataset, an unknown format or a
task profiled twice refuse the whole import with an error naming the file and the row, and nothing is
uploaded. Rates that come with the data cost the run nothing; ``--profile`` says the samples were rolled
out for this run with its starting policy, and the dataset counts them as its profiling rollouts
(docs/api.md section 2).

Imports only the standard library and the client (httpx); pyarrow is imported when a parquet file is
read (``pip install pyarrow``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr_selector_client.contract import PASS_SAMPLES_MAX

__all__ = ["FORMATS", "Rates", "RatesError", "main", "read_rates", "upload_rates"]

#: The --format choices; "auto" tells them apart (module docstring).
FORMATS = ("auto", "column", "array", "skywork", "polaris", "nemo-gym")
#: Skywork-OR1-RL-Data: samples per prompt behind model_difficulty, and the model read by default.
SKYWORK_SAMPLES = 16
SKYWORK_MODEL = "DeepSeek-R1-Distill-Qwen-7B"
SKYWORK_MODELS = (
    "DeepSeek-R1-Distill-Qwen-1.5B",
    "DeepSeek-R1-Distill-Qwen-7B",
    "DeepSeek-R1-Distill-Qwen-32B",
)
#: Polaris-Dataset-53K: samples behind a bare-number difficulty.
POLARIS_SAMPLES = 8
#: The columns of a NeMo-Gym reward profile row that an import reads.
NEMO_TASK, NEMO_RATE, NEMO_COUNT = "_ng_task_index", "mean/reward", "num_rollouts"
#: Exit statuses of the command line, as trainer-client's.
EXIT_OK, EXIT_CONFIG, EXIT_SERVICE = 0, 2, 3


class RatesError(ValueError):
    """A file that cannot be imported; the message names the file and the row, and says what to fix."""


@dataclass(frozen=True)
class Rates:
    """Per prompt id (from 0): a pass rate (None = unknown) and the samples behind it (None = unknown,
    the dataset's prior_strength then weighs the rate); `source` and `format` say where they came from."""

    pass_rate: list[float | None]
    pass_samples: list[int | None]
    source: str
    format: str

    def __len__(self) -> int:
        return len(self.pass_rate)

    @property
    def known(self) -> int:
        """Prompts with a rate."""
        return sum(r is not None for r in self.pass_rate)

    @property
    def samples(self) -> int:
        """The samples behind the known rates (those with a count)."""
        return sum(n for n in self.pass_samples if n is not None)

    @property
    def counted(self) -> bool:
        """Every known rate has its count."""
        return all(
            n is not None for r, n in zip(self.pass_rate, self.pass_samples, strict=True) if r is not None
        )

    def summary(self) -> str:
        """One line: how many rates, their counts and spread."""
        rates = [r for r in self.pass_rate if r is not None]
        if not rates:
            return f"{self.source} ({self.format}): {len(self)} prompts, none with a rate"
        counts = sorted({n for n in self.pass_samples if n is not None})
        spread = (
            "no sample counts (each rate weighs the dataset's prior_strength)"
            if not counts
            else f"{self.samples} samples behind them ({_range(counts)} per prompt)"
        )
        return (
            f"{self.source} ({self.format}): {len(self)} prompts, {len(rates)} with a rate "
            f"(mean {sum(rates) / len(rates):.3f}; {sum(r == 0.0 for r in rates)} at 0, "
            f"{sum(r == 1.0 for r in rates)} at 1), {spread}"
        )


def _range(values: Sequence[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]}..{values[-1]}"


# --------------------------------------------------------------------------------------------------
# Reading rows
# --------------------------------------------------------------------------------------------------


def _rows_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) per non-blank line."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield f"line {number}", json.loads(line)
            except json.JSONDecodeError as exc:
                raise RatesError(
                    f"{path}: line {number} is not valid JSON ({exc.msg}): one object per line"
                ) from None


def _rows_parquet(path: Path, wanted: Sequence[str] | None) -> Iterator[tuple[str, Any]]:
    """(where, record) per row of the columns among `wanted` (dotted paths; None: every column)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise RatesError(f"{path}: reading parquet files needs pyarrow: pip install pyarrow") from None
    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow's errors have no common public base
        raise RatesError(f"{path} is not a parquet file pyarrow can read ({exc})") from None
    names = table.schema_arrow.names
    columns = None if wanted is None else sorted({c for c in (_top(w, names) for w in wanted) if c})
    if columns == []:
        raise RatesError(
            f"{path}: none of its columns holds pass rates that an import knows (its columns: "
            f"{', '.join(names[:12])}); name the rates' column with --column"
        )
    row = 0
    for batch in table.iter_batches(columns=columns):
        for record in batch.to_pylist():
            yield f"row {row}", record
            row += 1


def _top(path: str, names: Sequence[str]) -> str | None:
    """The top-level column a dotted `path` starts with (the longest one that exists), or None."""
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in names:
            return ".".join(parts[:end])
    return None


_MISSING = object()


def _get(record: Any, path: str) -> Any:
    """`record`'s value at a dotted `path` (a key may itself hold dots: "DeepSeek-R1-Distill-Qwen-1.5B"
    is tried whole first), or _MISSING."""
    if not isinstance(record, Mapping):
        return _MISSING
    if path in record:
        return record[path]
    head, dot, rest = path.partition(".")
    while dot:
        if head in record:
            found = _get(record[head], rest)
            if found is not _MISSING:
                return found
        more, dot, rest = rest.partition(".")
        head = f"{head}.{more}"
    return _MISSING


# --------------------------------------------------------------------------------------------------
# Checking values
# --------------------------------------------------------------------------------------------------


def _rate(value: Any, where: str, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RatesError(f"{where}: {what} {value!r} must be a number in [0, 1] or null")
    if not 0.0 <= value <= 1.0:
        raise RatesError(f"{where}: {what} {value!r} must lie in [0, 1]")
    return float(value)


def _count(value: Any, where: str, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise RatesError(
            f"{where}: {what} {value!r} must be a whole number of samples (1..{PASS_SAMPLES_MAX})"
        )
    if not 1 <= value <= PASS_SAMPLES_MAX:
        raise RatesError(f"{where}: {what} {value!r} must lie in 1..{PASS_SAMPLES_MAX} (at least one sample)")
    return int(value)


def _fraction(value: Any, where: str, what: str, samples: int) -> tuple[float | None, int | None]:
    """A Polaris difficulty: "k/n" (rate k/n from n samples) or a bare rate from `samples`."""
    if isinstance(value, str):
        head, slash, tail = value.strip().partition("/")
        try:
            successes, total = int(head), int(tail)
        except ValueError:
            successes, total = -1, 0
        if not slash or total < 1 or not 0 <= successes <= total or total > PASS_SAMPLES_MAX:
            raise RatesError(f'{where}: {what} {value!r} must be "k/n" with 0 <= k <= n, n >= 1 (e.g. "3/8")')
        return successes / total, total
    rate = _rate(value, where, what)
    return rate, None if rate is None else samples


# --------------------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------------------


def _detect(path: Path, first: Any, column: str | None) -> str:
    """The format of a file of records whose first record is `first` (module docstring)."""
    if column is not None:
        return "column"
    if isinstance(first, Mapping):
        if NEMO_TASK in first and NEMO_RATE in first:
            return "nemo-gym"
        if _get(first, "extra_info.model_difficulty") is not _MISSING:
            return "skywork"
        if "pass_rate" in first:
            return "column"
        if isinstance(first.get("difficulty"), str) and "/" in first["difficulty"]:
            return "polaris"
        keys = ", ".join(sorted(first)[:12])
        raise RatesError(
            f"{path}: cannot tell which column holds the pass rates (first row's columns: {keys}); name it "
            "with --column, or give --format skywork | polaris | nemo-gym"
        )
    raise RatesError(f"{path}: the first row is {type(first).__name__}, not an object: give --format")


def _records(path: Path, fmt: str, wanted: Sequence[str] | None) -> tuple[str, Iterator[tuple[str, Any]]]:
    """(format, rows) of a file of records: JSONL, parquet or a JSON array of objects."""
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return fmt, _rows_parquet(path, wanted)
    if suffix == ".json":
        data = _load_json(path)
        if not isinstance(data, list):
            raise RatesError(
                f"{path} must hold a JSON array (of pass rates, or of records), got {type(data).__name__}"
            )
        if fmt == "array" or (fmt == "auto" and not any(isinstance(v, Mapping) for v in data[:1])):
            return "array", iter([(f"entry {i}", v) for i, v in enumerate(data)])
        return fmt, iter([(f"entry {i}", v) for i, v in enumerate(data)])
    return fmt, _rows_jsonl(path)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RatesError(f"{path} is not valid JSON ({exc})") from None


def read_rates(
    path: str | os.PathLike[str],
    *,
    format: str = "auto",
    column: str | None = None,
    samples_column: str | None = None,
    samples: int | None = None,
    model: str | None = None,
    size: int | None = None,
) -> Rates:
    """Every prompt's pass rate and sample count from `path` (module docstring for the formats and
    options). `size`: the dataset's prompts, when known: a file must then have exactly that many
    (a NeMo-Gym profile: task indices below it, the rest unknown). RatesError names the file and the
    row of the first bad value; nothing is half-read."""
    source = Path(path)
    if format not in FORMATS:
        raise RatesError(f"unknown format {format!r}: choose one of {', '.join(FORMATS)}")
    if samples is not None:
        samples = _count(samples, "--samples", "the sample count")
    if samples is not None and samples_column is not None:
        raise RatesError("give the samples behind the rates as --samples N or --samples-column, not both")
    if model is not None and format not in ("auto", "skywork"):
        raise RatesError(f"--model names a Skywork-OR1 model; format {format!r} has none")
    if not source.is_file():
        raise RatesError(f"{source} cannot be read: no such file")
    wanted = [
        c
        for c in (column, samples_column, "pass_rate", "pass_samples", "extra_info", "difficulty",
                  NEMO_TASK, NEMO_RATE, NEMO_COUNT)
        if c
    ]  # fmt: skip
    try:
        fmt, rows = _records(source, format, wanted)
        first_row = next(rows, None)
        if first_row is None:
            raise RatesError(f"{source} holds no rows: one per prompt")
        if fmt == "auto":
            fmt = _detect(source, first_row[1], column)
        rows = _chain(first_row, rows)
        if fmt == "array":
            rates = _read_array(source, rows, samples)
        elif fmt == "nemo-gym":
            rates = _read_nemo(source, rows, size)
        else:
            rates = _read_column(source, fmt, rows, column, samples_column, samples, model)
    except OSError as exc:
        raise RatesError(f"{source} cannot be read ({exc.strerror or exc})") from None
    if size is not None and len(rates) != size:
        raise RatesError(
            f"{source} has {len(rates)} prompts for a dataset of {size}: one row per prompt id, in the "
            "dataset's order"
        )
    return rates


def _chain(first: tuple[str, Any], rest: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    yield first
    yield from rest


def _read_array(source: Path, rows: Iterator[tuple[str, Any]], samples: int | None) -> Rates:
    rates, counts = [], []
    for where, value in rows:
        rate = _rate(value, f"{source}: {where}", "pass rate")
        rates.append(rate)
        counts.append(None if rate is None else samples)
    return Rates(rates, counts, str(source), "array")


def _read_column(
    source: Path,
    fmt: str,
    rows: Iterator[tuple[str, Any]],
    column: str | None,
    samples_column: str | None,
    samples: int | None,
    model: str | None,
) -> Rates:
    if fmt == "skywork":
        if samples_column is not None:
            raise RatesError(
                "--samples-column does not apply to Skywork-OR1's counts: each is out of --samples (16)"
            )
        chosen = model or SKYWORK_MODEL
        column = column or f"extra_info.model_difficulty.{chosen}"
        samples = samples or SKYWORK_SAMPLES
    elif fmt == "polaris":
        if samples_column is not None:
            raise RatesError('--samples-column does not apply to Polaris: "k/n" carries its count')
        column = column or "difficulty"
        samples = samples or POLARIS_SAMPLES
    else:
        column = column or "pass_rate"
    rates: list[float | None] = []
    counts: list[int | None] = []
    count_column = samples_column
    for index, (where, record) in enumerate(rows):
        at = f"{source}: {where} (prompt {index})"
        value = _get(record, column)
        if value is _MISSING:
            hint = _column_hint(record, fmt, model)
            raise RatesError(f"{at} has no column {column!r}{hint}")
        if fmt == "skywork":
            assert samples is not None
            failed = _count_of(value, at, column, samples)
            rate, count = (None, None) if failed is None else ((samples - failed) / samples, samples)
        elif fmt == "polaris":
            assert samples is not None
            rate, count = _fraction(value, at, column, samples)
        else:
            rate = _rate(value, at, column)
            if (
                index == 0
                and count_column is None
                and samples is None
                and _get(record, "pass_samples") is not _MISSING
            ):
                count_column = "pass_samples"
            if count_column is not None:
                raw = _get(record, count_column)
                if raw is _MISSING:
                    raise RatesError(f"{at} has no column {count_column!r} (the samples behind its rate)")
                count = _count(raw, at, count_column)
            else:
                count = samples
            if rate is None:
                count = None
        rates.append(rate)
        counts.append(count)
    return Rates(rates, counts, str(source), fmt)


def _count_of(value: Any, where: str, what: str, samples: int) -> int | None:
    """A Skywork model_difficulty: the failed samples, 0..samples, or null."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value != int(value)
        or not 0 <= value <= samples
    ):
        raise RatesError(f"{where}: {what} {value!r} must be a whole count of failed samples in 0..{samples}")
    return int(value)


def _column_hint(record: Any, fmt: str, model: str | None) -> str:
    if fmt == "skywork":
        found = _get(record, "extra_info.model_difficulty")
        if isinstance(found, Mapping):
            return f" (its models: {', '.join(sorted(found))}; choose one with --model)"
        return " (Skywork-OR1-RL-Data rows carry extra_info.model_difficulty)"
    if isinstance(record, Mapping):
        return f" (its columns: {', '.join(sorted(record)[:12])}; name the rates' column with --column)"
    return ""


def _read_nemo(source: Path, rows: Iterator[tuple[str, Any]], size: int | None) -> Rates:
    found: dict[int, tuple[float, int, str]] = {}
    for where, record in rows:
        at = f"{source}: {where}"
        if not isinstance(record, Mapping):
            raise RatesError(f"{at} is not an object: a NeMo-Gym reward profile has one per task")
        for key in (NEMO_TASK, NEMO_RATE, NEMO_COUNT):
            if key not in record:
                raise RatesError(
                    f"{at} has no {key!r}: not a row of a NeMo-Gym reward profile (gym eval profile)"
                )
        task = record[NEMO_TASK]
        if isinstance(task, bool) or not isinstance(task, int) or task < 0:
            raise RatesError(f"{at}: {NEMO_TASK} {task!r} must be a task index >= 0")
        if size is not None and task >= size:
            raise RatesError(f"{at}: task {task} is beyond the dataset's {size} prompts (ids 0..{size - 1})")
        if task in found:
            raise RatesError(
                f"{at}: task {task} is profiled twice (first at {found[task][2]}): a profile of several agents "
                "has one row per agent; profile one agent's rollouts"
            )
        rate = _rate(record[NEMO_RATE], f"{at} (task {task})", NEMO_RATE)
        count = _count(record[NEMO_COUNT], f"{at} (task {task})", NEMO_COUNT)
        if rate is not None and count is not None:
            found[task] = (rate, count, where)
    length = size if size is not None else (max(found) + 1 if found else 0)
    rates: list[float | None] = [None] * length
    counts: list[int | None] = [None] * length
    for task, (rate, count, _) in found.items():
        rates[task], counts[task] = rate, count
    return Rates(rates, counts, str(source), "nemo-gym")


# --------------------------------------------------------------------------------------------------
# Uploading
# --------------------------------------------------------------------------------------------------


def upload_rates(client: Any, dataset: str, rates: Rates, *, profile: bool = False, offset: int = 0) -> Any:
    """Uploads `rates` to `dataset` (a SelectorClient's upload_metadata: every value is checked before
    the first request) for prompts offset.., their counts with them; `profile` counts those samples as
    the dataset's profiling rollouts. Returns the MetadataAck."""
    if profile and not rates.counted:
        raise RatesError(
            f"{rates.source}: --profile counts the samples behind each rate, and some rates have none: give "
            "them (--samples N or --samples-column)"
        )
    has_counts = any(n is not None for n in rates.pass_samples)
    return client.upload_metadata(
        dataset,
        pass_rate=rates.pass_rate,
        pass_samples=rates.pass_samples if has_counts else None,
        profile=profile,
        offset=offset,
    )


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m rlvr_selector_client.rates",
        description="Import per-prompt pass rates, each with the samples behind it, into a dataset of the "
        "selector service.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    upload = commands.add_parser("import", help="read a file of rates and upload them to a dataset")
    check = commands.add_parser("check", help="read a file of rates and summarise it; uploads nothing")
    for sub in (upload, check):
        sub.add_argument("file", type=Path, help="JSONL, parquet or JSON file")
        sub.add_argument("--format", choices=FORMATS, default="auto", help="how to read it (default: auto)")
        sub.add_argument("--column", help="the rates' column (dotted path into nested objects)")
        sub.add_argument("--samples-column", help="the column of the samples behind each rate")
        sub.add_argument("--samples", type=int, help="the samples behind every rate")
        sub.add_argument(
            "--model", help=f"Skywork-OR1: the model whose counts to read (default {SKYWORK_MODEL})"
        )
    upload.add_argument(
        "--dataset", required=True, help="the dataset (it must exist: your trainer creates it)"
    )
    upload.add_argument(
        "--service-url",
        default=os.environ.get("SELECTOR_URL", "http://127.0.0.1:8000"),
        help="base URL (default: env SELECTOR_URL, else http://127.0.0.1:8000)",
    )
    upload.add_argument("--token", help="bearer token (default: env SELECTOR_API_TOKEN; never printed)")
    upload.add_argument(
        "--offset",
        type=int,
        help="first prompt id the file's rows are for (default 0, and the file must then cover the dataset)",
    )
    upload.add_argument(
        "--profile",
        action="store_true",
        help="the samples were rolled out for this run with its starting policy: count them as its "
        "profiling rollouts (default: rates that came with the data, free)",
    )
    return parser


def _read(args: argparse.Namespace, size: int | None) -> Rates:
    return read_rates(
        args.file,
        format=args.format,
        column=args.column,
        samples_column=args.samples_column,
        samples=args.samples,
        model=args.model,
        size=size,
    )


def _import(args: argparse.Namespace) -> int:
    from rlvr_selector_client.client import NotFound, SelectorClient

    if args.offset is not None and args.offset < 0:
        raise RatesError(f"--offset must be >= 0, got {args.offset}")
    with SelectorClient(args.service_url, token=args.token) as client:
        try:
            info = client.get_dataset(args.dataset)
        except NotFound:
            print(
                f"error: the service at {args.service_url} has no dataset {args.dataset!r}: create it first "
                "(your trainer's adapter does, or POST /datasets), then import",
                file=sys.stderr,
            )
            return EXIT_SERVICE
        offset = args.offset or 0
        # Without --offset the file covers the dataset: exactly its size (a NeMo-Gym profile: task
        # indices below it). With one, it covers prompts offset.. and must end within the dataset.
        rates = _read(args, info.size if args.offset is None else None)
        if offset + len(rates) > info.size:
            raise RatesError(
                f"{rates.source}: {len(rates)} prompts from --offset {offset} run past the dataset's "
                f"{info.size} prompts"
            )
        ack = upload_rates(client, args.dataset, rates, profile=args.profile, offset=offset)
    cost = "counted as profiling rollouts" if args.profile else "free: they came with the data"
    print(rates.summary())
    print(
        f"imported into {args.dataset!r} from prompt {offset} ({cost}); the dataset now has "
        f"{ack.prompts_with_pass_rate} prompts with a rate, {ack.prompts_with_pass_samples} with a count, "
        f"and {ack.profile_rollouts} profiling rollouts"
    )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m rlvr_selector_client.rates``; returns the exit status."""
    from rlvr_selector_client.client import SelectorError

    args = _parser().parse_args(argv)
    try:
        if args.command == "check":
            print(_read(args, None).summary())
            return EXIT_OK
        return _import(args)
    except RatesError as exc:
        print(f"error: {exc}; nothing was uploaded", file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as exc:  # the client's own checks of an upload (before anything is sent)
        print(f"error: {exc}; nothing was uploaded", file=sys.stderr)
        return EXIT_CONFIG
    except SelectorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SERVICE


if __name__ == "__main__":
    sys.exit(main())
