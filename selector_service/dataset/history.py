"""Step history (docs/api.md, "Step history"): one row per closed step of a dataset, written when the step
closes, from the figures the state gathered while it was open.

A `DatasetState` is a pure function of the log it applied (state.py), and so is its `StepHistory`: the
figures are taken from log records as they are applied and from the close itself, in log order, so
every replica and every restart writes the same rows bit for bit. Snapshots and exports carry the rows
and the open step's figures (`header` / `arrays`, checked again by `from_parts` when read back).

What a row says about step s, and where it comes from:

    selected, selects, strategies
                   the select requests of step s: each select appends its strategy, batch size and a
                   digest of its request to the log record that opens step s or, at the open step, to a
                   record of its own (Store.commit_close), committed only once its answer is chosen (a
                   refused or failed select counts nothing). A request sent again (same strategy,
                   parameters, seed, batch size: the same batch) counts once, and at the open step a
                   replica that already counted it appends nothing.
    observed       prompts observed at s (several results of one prompt count once)
    results, rollouts, mean_reward
                   results applied while s was open (late ones included), their trials, and their
                   successes / trials (fractional rewards summed)
    all_solved, mixed, none_solved
                   shares of those results whose rollouts all succeeded, some, none
    dps_predicted  the DPS belief of step s averaged over the prompts observed at s, computed before
                   their results: the shares of (unsolved, partially solved, solved) DPS expected
    dps_accuracy   share of those prompts whose most likely DPS state was the state observed
    late           results applied while s was open that were reported for an earlier step, by lag
                   (s minus the step reported; lags of LAG_LABELS and more share one label)
    groups         per group of the metadata: the results applied at s for its prompts and their mean
                   reward, for the ROW_GROUPS groups with most results (then the lower group id);
                   groups_omitted counts the others
    prompts_observed  prompts ever observed when s closed
    profile_rollouts, total_rollouts
                   when s closed: the dataset's profiling rollouts (coldstart: the sample counts uploaded
                   as profiled), and every rollout applied by then plus those

Bound: the newest HISTORY_STEPS rows are served. Up to SLACK more are held and then dropped at once, so
that keeping the bound costs an amortized copy of eight rows per close, and how many are held depends
on the number of closes alone (replicas agree). At most ~40 MB per dataset at the bound (with groups;
~17 MB without), allocated as rows arrive.

Cost: per observe record one numba pass over its ids (`_fresh_priors`) and, with groups, a bincount;
per select record a string split; per close a row (bench/bench_history.py measures all three, and the
requests, against the same work without history).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np

from rlvr_selector_client.contract import MAX_GROUPS, PASS_SAMPLES_MAX

#: Rows served: the newest closed steps.
HISTORY_STEPS = 100_000
#: Rows held beyond HISTORY_STEPS before the oldest are dropped, all at once.
SLACK = HISTORY_STEPS // 8
#: Groups described in one row.
ROW_GROUPS = 8
#: Select requests told apart per step (further distinct ones are counted without a digest check).
MAX_DIGESTS = 4096
#: Lags are counted up to this value; larger lags share it (the same labels as the metrics').
LAG_LABELS = 8
LAGS = LAG_LABELS + 1
#: Snapshot arrays of the history carry this name prefix.
HISTORY_PREFIX = "history."
#: Strategy names a row may count (the registry's names are shorter and of these characters).
_STRATEGY = re.compile(r"[a-z][a-z0-9_]{0,63}")
_DIGEST = re.compile(r"[0-9a-f]{1,64}")
_MAX_STRATEGIES = 64
_COUNT_MAX = 2**62
#: No step has this many select requests; below it a row's strategy counts sum without overflow.
_SELECTS_MAX = 2**56
#: The most trials one result may carry (core/domain.py TRIALS_MAX, the API's bound).
_TRIALS_MAX = 10**9

# name -> (dtype, shape after the row axis) of every per-row column, in snapshot order.
ROW_COLUMNS: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
    "step": (np.dtype(np.int64), ()),
    "selected": (np.dtype(np.int64), ()),
    "selects": (np.dtype(np.int64), ()),
    "observed": (np.dtype(np.int64), ()),
    "results": (np.dtype(np.int64), ()),
    "rollouts": (np.dtype(np.float64), ()),
    "successes": (np.dtype(np.float64), ()),
    "all_solved": (np.dtype(np.int64), ()),
    "none_solved": (np.dtype(np.int64), ()),
    "dps_predicted": (np.dtype(np.float64), (3,)),  # NaN when no prompt was observed
    "dps_correct": (np.dtype(np.int64), ()),
    "prompts_observed": (np.dtype(np.int64), ()),
    "late": (np.dtype(np.int64), (LAGS,)),  # by lag; [0] counts the results on time
    "group_at": (np.dtype(np.int64), ()),  # first entry of the row in the group entries
    "group_n": (np.dtype(np.int64), ()),
    "group_omitted": (np.dtype(np.int64), ()),
    "profile_rollouts": (np.dtype(np.int64), ()),
    "total_rollouts": (np.dtype(np.float64), ()),
}
#: Per-row strategy counts: one column per name in `StepHistory.names` (in order of first use).
STRATEGY_COLUMN = "strategies"
#: The groups of the rows, row after row (ROW_GROUPS at most per row).
ENTRY_COLUMNS: dict[str, np.dtype] = {
    "group": np.dtype(np.int32),
    "group_results": np.dtype(np.int64),
    "group_successes": np.dtype(np.float64),
    "group_trials": np.dtype(np.float64),
}
#: The open step's per-group figures, indexed by group id.
OPEN_COLUMNS: dict[str, np.dtype] = {
    "open_group_results": np.dtype(np.int64),
    "open_group_successes": np.dtype(np.float64),
    "open_group_trials": np.dtype(np.float64),
}
_UNIFORM = float(np.float32(1.0 / 3.0))  # the DPS prior of a never-observed prompt, as stored


def _grown(arr: np.ndarray, rows: int) -> np.ndarray:
    out = np.zeros((rows, *arr.shape[1:]), dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _number(x: float) -> int | float:
    """A whole float as an int (rollouts are whole numbers of trials), else the float."""
    return int(x) if float(x).is_integer() else float(x)


@numba.njit(nogil=True, cache=True)
def _fresh_priors(
    ids: np.ndarray, hmm_slot: np.ndarray, obs_state: np.ndarray, prior_cols: np.ndarray
) -> tuple[np.ndarray, int, int]:
    """(sum of the DPS priors, count of never-observed, count) over the prompts of one observe record
    that are observed for the first time at the open step: the first result of each prompt in the record
    whose prompt has no observed state yet. Priors are summed in record order; a never-observed prompt
    holds the uniform prior and is only counted (the caller adds it). One sort of the record's ids finds
    each prompt's first result; ids are within the dataset (checked before any record is written).
    `prior_cols`: obs_prior's columns (3, M). The slow twin: tests/service/test_history.py."""
    m = ids.size
    first = np.ones(m, dtype=np.bool_)
    ordered = np.sort(ids)
    repeats = False
    for j in range(1, m):
        if ordered[j] == ordered[j - 1]:
            repeats = True
            break
    if repeats:  # rare: several results of one prompt in one record
        first[:] = False
        order = np.argsort(ids, kind="mergesort")  # stable: a run's first entry is its earliest result
        for j in range(m):
            if j == 0 or ids[order[j]] != ids[order[j - 1]]:
                first[order[j]] = True
    acc = np.zeros(3, dtype=np.float64)
    unseen = 0
    count = 0
    for i in range(m):
        if not first[i]:
            continue
        slot = hmm_slot[ids[i]]
        if slot < 0:
            unseen += 1
            count += 1
        elif obs_state[slot] == 0:
            for c in range(3):
                acc[c] += prior_cols[c, slot]
            count += 1
    return acc, unseen, count


@dataclass(frozen=True)
class Bounds:
    """What the rest of a snapshot says its history may hold: the dataset's size, and the
    state's steps closed, prompts ever observed, results and trials applied (all steps), and the open
    step's results and trials so far (SharedState.step_counts). A history holds no more than these
    allow (`StepHistory.from_parts`)."""

    size: int
    steps_closed: int
    prompts_observed: int
    results: int
    rollouts: float
    open_results: float
    open_rollouts: float


class StepHistory:
    """The rows of one dataset's closed steps and the figures of its open step (module docstring)."""

    def __init__(self) -> None:
        self.n = 0  # rows held
        self.cols = {name: np.zeros((0, *shape), dtype=dt) for name, (dt, shape) in ROW_COLUMNS.items()}
        self.names: list[str] = []  # strategies, in order of first use: columns of `strat`
        self.strat = np.zeros((0, 0), dtype=np.int64)
        self.entries = {name: np.zeros(0, dtype=dt) for name, dt in ENTRY_COLUMNS.items()}
        self.e = 0  # group entries held
        self._reset_open()
        self.open_groups = {name: np.zeros(0, dtype=dt) for name, dt in OPEN_COLUMNS.items()}

    def _reset_open(self) -> None:
        self.selected = 0
        self.selects = 0
        self.open_strategies: dict[str, int] = {}
        self.digests: list[str] = []
        self._digest_set: set[str] = set()
        self.pred = np.zeros(3, dtype=np.float64)  # sum of the DPS priors of the prompts observed
        self.fresh = 0  # prompts observed at the open step
        self.late = np.zeros(LAGS, dtype=np.int64)

    # ---- the open step ------------------------------------------------------------------------------
    @staticmethod
    def parse_note(note: bytes | str) -> tuple[str, int, str]:
        """(strategy, batch size, digest) of a select's note in a log record (`select_note`); ValueError."""
        text = note.decode() if isinstance(note, bytes) else note
        parts = text.split(" ")
        if len(parts) != 3 or not _STRATEGY.fullmatch(parts[0]) or not _DIGEST.fullmatch(parts[2]):
            raise ValueError(f"malformed select note {text[:200]!r}")
        batch = int(parts[1])
        if not 1 <= batch <= _COUNT_MAX:
            raise ValueError(f"select note with batch size {batch}")
        return parts[0], batch, parts[2]

    def counted(self, note: str) -> bool:
        """Whether the select of this note (`select_note`) was already counted at the open step (False
        past MAX_DIGESTS distinct ones, where no digest is kept)."""
        return note.rpartition(" ")[2] in self._digest_set

    def select(self, strategy: str, batch: int, digest: str) -> None:
        """Counts a select request at the open step (one already counted there is not counted again)."""
        if digest in self._digest_set:
            return
        if len(self.digests) < MAX_DIGESTS:
            self.digests.append(digest)
            self._digest_set.add(digest)
        self.selects += 1
        self.selected += batch
        self.open_strategies[strategy] = self.open_strategies.get(strategy, 0) + 1

    def observe(self, ba: Any, ids: np.ndarray, successes: np.ndarray, trials: np.ndarray, lag: int) -> None:
        """Counts one observe record's results at the open step; runs before the beliefs take them (the
        DPS priors and the step states are read as they were before)."""
        m = ids.size
        self.late[min(lag, LAG_LABELS)] += m
        if m:
            prior_sum, unseen, count = _fresh_priors(ids, ba.hmm_slot, ba.obs_state, ba.obs_prior.T)
            if count:
                self.pred += prior_sum
                self.pred += unseen * _UNIFORM
                self.fresh += count
        if ba.shared.grouped:
            groups = ba.group[ids]
            grouped = groups >= 0
            if grouped.any():
                self._count_groups(groups[grouped], successes[grouped], trials[grouped], ba.shared.n_groups)

    def _count_groups(
        self, groups: np.ndarray, successes: np.ndarray, trials: np.ndarray, n_groups: int
    ) -> None:
        uniq, inverse = np.unique(groups, return_inverse=True)
        if int(uniq[-1]) >= self.open_groups["open_group_results"].shape[0]:  # as many as the dataset has
            self.open_groups = {k: _grown(v, n_groups) for k, v in self.open_groups.items()}
        og = self.open_groups
        og["open_group_results"][uniq] += np.bincount(inverse, minlength=uniq.size)
        og["open_group_successes"][uniq] += np.bincount(inverse, weights=successes, minlength=uniq.size)
        og["open_group_trials"][uniq] += np.bincount(inverse, weights=trials, minlength=uniq.size)

    # ---- closing a step -----------------------------------------------------------------------------
    def close(
        self,
        step: int,
        counts: np.ndarray,
        stats: Any,
        prompts_observed: int,
        profile_rollouts: int = 0,
        total_rollouts: float = 0.0,
    ) -> None:
        """Writes the row of `step` from the open step's figures, the shared state's step counts taken
        before the close reset them (shared.STEP_*: results, all-solved, all-failed, successes,
        trials), the close's CloseStats and the running totals of rollouts (the dataset's profiling
        rollouts, and every rollout applied so far plus those); then starts the next step's figures."""
        if self.n == self.cols["step"].shape[0]:
            self._grow_rows()
        i = self.n
        c = self.cols
        c["step"][i] = step
        c["selected"][i] = self.selected
        c["selects"][i] = self.selects
        c["observed"][i] = stats.observed
        c["results"][i] = int(counts[0])
        c["all_solved"][i] = int(counts[1])
        c["none_solved"][i] = int(counts[2])
        c["successes"][i] = counts[3]
        c["rollouts"][i] = counts[4]
        c["dps_predicted"][i] = self.pred / self.fresh if self.fresh else np.nan
        c["dps_correct"][i] = stats.correct
        c["prompts_observed"][i] = prompts_observed
        c["late"][i] = self.late
        c["profile_rollouts"][i] = profile_rollouts
        c["total_rollouts"][i] = total_rollouts
        if self.open_strategies:
            for name in self.open_strategies:
                if name not in self.names:
                    self.names.append(name)
            if self.strat.shape[1] < len(self.names):
                grown = np.zeros((self.strat.shape[0], len(self.names)), dtype=np.int64)
                grown[:, : self.strat.shape[1]] = self.strat
                self.strat = grown
            self.strat[i] = 0
            for name, count in self.open_strategies.items():
                self.strat[i, self.names.index(name)] = count
        elif self.strat.shape[1]:
            self.strat[i] = 0
        self._close_groups(i)
        self.n += 1
        self._reset_open()
        if self.n > HISTORY_STEPS + SLACK:
            self._drop(self.n - HISTORY_STEPS)

    def _close_groups(self, i: int) -> None:
        c = self.cols
        c["group_at"][i] = self.e
        og = self.open_groups
        res = og["open_group_results"]
        hit = np.flatnonzero(res) if res.size else res[:0]
        if not hit.size:
            c["group_n"][i] = 0
            c["group_omitted"][i] = 0
            return
        order = hit[np.lexsort((hit, -res[hit]))][:ROW_GROUPS]
        k = order.size
        if self.e + k > self.entries["group"].shape[0]:
            size = max(self.e + k, 2 * self.entries["group"].shape[0], 64)
            self.entries = {name: _grown(arr, size) for name, arr in self.entries.items()}
        span = slice(self.e, self.e + k)
        self.entries["group"][span] = order
        self.entries["group_results"][span] = res[order]
        self.entries["group_successes"][span] = og["open_group_successes"][order]
        self.entries["group_trials"][span] = og["open_group_trials"][order]
        self.e += k
        c["group_n"][i] = k
        c["group_omitted"][i] = hit.size - k
        for arr in og.values():
            arr[hit] = 0

    def _grow_rows(self) -> None:
        size = min(max(64, 2 * self.cols["step"].shape[0]), HISTORY_STEPS + SLACK + 1)
        self.cols = {name: _grown(arr, size) for name, arr in self.cols.items()}
        self.strat = _grown(self.strat, size)

    def _drop(self, k: int) -> None:
        """Drops the k oldest rows (and their group entries)."""
        e0 = int(self.cols["group_at"][k]) if k < self.n else self.e
        for arr in self.cols.values():
            arr[: self.n - k] = arr[k : self.n]
        self.strat[: self.n - k] = self.strat[k : self.n]
        self.cols["group_at"][: self.n - k] -= e0
        for arr in self.entries.values():
            arr[: self.e - e0] = arr[e0 : self.e]
        self.n -= k
        self.e -= e0

    # ---- reading ------------------------------------------------------------------------------------
    def first_served(self) -> int:
        """Index of the oldest row served (the newest HISTORY_STEPS are)."""
        return max(0, self.n - HISTORY_STEPS)

    def rows(self, since: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """Rows of steps >= `since`, oldest first, at most `limit`; and the step to ask from next."""
        lo = self.first_served()
        steps = self.cols["step"][lo : self.n]
        i = lo + int(np.searchsorted(steps, since, side="left"))
        j = min(self.n, i + limit)
        out = [self.row(k) for k in range(i, j)]
        return out, (int(self.cols["step"][j - 1]) + 1 if j > i else since)

    def row(self, k: int) -> dict[str, Any]:
        c = self.cols
        results = int(c["results"][k])
        solved, failed = int(c["all_solved"][k]), int(c["none_solved"][k])
        trials = float(c["rollouts"][k])
        observed = int(c["observed"][k])
        pred = c["dps_predicted"][k]
        late = c["late"][k]
        row: dict[str, Any] = {
            "step": int(c["step"][k]),
            "selected": int(c["selected"][k]),
            "selects": int(c["selects"][k]),
            "observed": observed,
            "results": results,
            "rollouts": _number(trials),
            "mean_reward": _share(float(c["successes"][k]), trials),
            "all_solved": _share(solved, results),
            "mixed": _share(results - solved - failed, results),
            "none_solved": _share(failed, results),
            "dps_predicted": None if math.isnan(pred[0]) else [float(x) for x in pred],
            "dps_accuracy": _share(int(c["dps_correct"][k]), observed),
            "late": {lag_label(lag): int(late[lag]) for lag in range(1, LAGS) if late[lag]},
            "strategies": {
                name: int(self.strat[k, j]) for j, name in enumerate(self.names) if self.strat[k, j]
            },
            "prompts_observed": int(c["prompts_observed"][k]),
            "profile_rollouts": int(c["profile_rollouts"][k]),
            "total_rollouts": _number(float(c["total_rollouts"][k])),
        }
        at, n = int(c["group_at"][k]), int(c["group_n"][k])
        if n or c["group_omitted"][k]:
            e = self.entries
            row["groups"] = {
                str(int(e["group"][q])): {
                    "results": int(e["group_results"][q]),
                    "mean_reward": _share(float(e["group_successes"][q]), float(e["group_trials"][q])),
                }
                for q in range(at, at + n)
            }
            row["groups_omitted"] = int(c["group_omitted"][k])
        return row

    # ---- snapshots ----------------------------------------------------------------------------------
    def header(self) -> dict[str, Any]:
        """The history's part of a snapshot header (its arrays: `arrays`)."""
        return {
            "strategies": list(self.names),
            "open": {
                "selected": self.selected,
                "selects": self.selects,
                "strategies": dict(self.open_strategies),
                "digests": list(self.digests),
                "pred": [float(x) for x in self.pred],
                "fresh": self.fresh,
                "late": [int(x) for x in self.late],
            },
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """The rows held and the open step's group figures, as snapshot arrays (views: copy to keep)."""
        out = {HISTORY_PREFIX + name: arr[: self.n] for name, arr in self.cols.items()}
        out[HISTORY_PREFIX + STRATEGY_COLUMN] = self.strat[: self.n]
        out.update({HISTORY_PREFIX + name: arr[: self.e] for name, arr in self.entries.items()})
        out.update({HISTORY_PREFIX + name: arr for name, arr in self.open_groups.items()})
        return out

    @staticmethod
    def check_layout(layout: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> None:
        """Checks the history arrays a snapshot header declares (names without the prefix) before
        anything is allocated; ValueError."""
        expected = {**{k: v[0] for k, v in ROW_COLUMNS.items()}, STRATEGY_COLUMN: np.dtype(np.int64)}
        expected.update(ENTRY_COLUMNS)
        expected.update(OPEN_COLUMNS)
        if set(layout) != set(expected):
            raise ValueError(
                f"history arrays: missing {sorted(set(expected) - set(layout))}, "
                f"unknown {sorted(set(layout) - set(expected))}"
            )
        rows = layout["step"][1][0] if layout["step"][1] else -1
        entries = layout["group"][1][0] if layout["group"][1] else -1
        open_g = layout["open_group_results"][1][0] if layout["open_group_results"][1] else -1
        if not 0 <= rows <= HISTORY_STEPS + SLACK:
            raise ValueError(f"history holds {rows} rows; at most {HISTORY_STEPS + SLACK} are kept")
        if not 0 <= entries <= rows * ROW_GROUPS or not 0 <= open_g <= MAX_GROUPS:
            raise ValueError("history group arrays are larger than a history can hold")
        strat = layout[STRATEGY_COLUMN][1]
        shapes = {name: (rows, *shape) for name, (_, shape) in ROW_COLUMNS.items()}
        shapes[STRATEGY_COLUMN] = (rows, strat[1] if len(strat) == 2 else -1)
        shapes.update({name: (entries,) for name in ENTRY_COLUMNS})
        shapes.update({name: (open_g,) for name in OPEN_COLUMNS})
        for name, (dtype, shape) in layout.items():
            if np.dtype(dtype) != expected[name] or tuple(shape) != shapes[name]:
                raise ValueError(f"history array {name!r} is {np.dtype(dtype)}{tuple(shape)}")
        if not 0 <= shapes[STRATEGY_COLUMN][1] <= _MAX_STRATEGIES:
            raise ValueError(f"history counts {shapes[STRATEGY_COLUMN][1]} strategies")

    @classmethod
    def from_parts(
        cls, header: Any, arrays: Mapping[str, np.ndarray], open_step: int, n_groups: int, bounds: Bounds
    ) -> StepHistory:
        """Rebuilds a history from `header()` and `arrays()` (names without the prefix), checking that
        every figure is one a history could hold for a dataset whose open step is `open_step`, which
        has `n_groups` groups and the `bounds` the rest of the snapshot sets; ValueError otherwise."""
        hist = cls()
        if not isinstance(header, dict) or not isinstance(header.get("open"), dict):
            raise ValueError("the snapshot's history header is missing or malformed")
        cls.check_layout({k: (v.dtype, v.shape) for k, v in arrays.items()})
        names = header.get("strategies")
        if (
            not isinstance(names, list)
            or len(names) != arrays[STRATEGY_COLUMN].shape[1]
            or len(set(names)) != len(names)
            or not all(isinstance(s, str) and _STRATEGY.fullmatch(s) for s in names)
        ):
            raise ValueError(f"history strategies {str(names)[:200]} do not match its counts")
        c = {name: np.array(arrays[name]) for name in ROW_COLUMNS}
        n = c["step"].shape[0]
        steps = c["step"]
        if n and (steps[0] < 0 or np.any(np.diff(steps) <= 0) or steps[-1] >= open_step):
            raise ValueError("history steps must increase and lie below the open step")
        counts = ("selected", "selects", "observed", "results", "all_solved", "none_solved")
        counts += ("dps_correct", "prompts_observed", "late", "group_n", "group_omitted", "profile_rollouts")
        for name in counts:
            if np.any(c[name] < 0) or np.any(c[name] > _COUNT_MAX):
                raise ValueError(f"history column {name!r} holds a count out of range")
        strat = np.array(arrays[STRATEGY_COLUMN])
        impossible = {  # field -> whether some row holds a figure no step could have
            "strategies": np.any(strat < 0),
            "rollouts": not all(
                np.isfinite(f).all() and (f >= 0).all() for f in (c["rollouts"], c["successes"])
            ),
            "total_rollouts": not (
                np.isfinite(c["total_rollouts"]).all() and (c["total_rollouts"] >= 0).all()
            ),
            "successes": np.any(c["successes"] > c["rollouts"]),
            "all_solved": np.any(c["all_solved"] + c["none_solved"] > c["results"]),
            "late": np.any(c["late"].sum(axis=1) != c["results"]),
            "dps_correct": np.any(c["dps_correct"] > c["observed"]),
            "group_n": np.any(c["group_n"] > ROW_GROUPS),
        }
        bad = [field for field, wrong in impossible.items() if wrong]
        if bad:
            raise ValueError(f"history field {bad[0]!r}: rows hold figures no step could have")
        pred = c["dps_predicted"]
        known = ~np.isnan(pred[:, 0])
        if (
            np.any(np.isnan(pred[known]))
            or np.any(~np.isnan(pred[~known]))
            or np.any((pred[known] < 0) | (pred[known] > 1))
        ):
            raise ValueError("history DPS predictions must be shares in [0, 1] (or absent)")
        e = {name: np.array(arrays[name]) for name in ENTRY_COLUMNS}
        total = e["group"].shape[0]
        at = c["group_at"]
        if n and (
            at[0] != 0 or np.any(at[1:] != (at + c["group_n"])[:-1]) or at[-1] + c["group_n"][-1] != total
        ):
            raise ValueError("history group entries do not line up with its rows")
        if (
            np.any(e["group"] < 0)
            or np.any(e["group"] >= MAX_GROUPS)
            or np.any(e["group_results"] < 1)
            or not all(
                np.isfinite(e[k]).all() and (e[k] >= 0).all() for k in ("group_successes", "group_trials")
            )
            or np.any(e["group_successes"] > e["group_trials"])
        ):
            raise ValueError("history group entries hold figures no step could have")
        og = {name: np.array(arrays[name]) for name in OPEN_COLUMNS}
        if (
            og["open_group_results"].shape[0] > max(n_groups, 0)
            or np.any(og["open_group_results"] < 0)
            or not all(
                np.isfinite(og[k]).all() and (og[k] >= 0).all()
                for k in ("open_group_successes", "open_group_trials")
            )
        ):
            raise ValueError("history open group figures are out of range")
        hist.n, hist.cols, hist.names, hist.strat = n, c, list(names), strat
        hist.entries, hist.e, hist.open_groups = e, total, og
        hist._load_open(header["open"])
        hist._check_bounds(bounds, n_groups)
        return hist

    def _check_bounds(self, b: Bounds, n_groups: int) -> None:
        """Refuses figures that the checks of `from_parts` let through but that no dataset of this size,
        and totals could have written (ValueError naming the field): a forged export with
        intact checksums must not be served. Each bound below holds for every history this service
        writes (tests/service/test_import_domain.py draws genuine ones)."""
        c, n, size = self.cols, self.n, b.size
        results, observed, selects = c["results"], c["observed"], c["selects"]

        def refuse(field: str, what: str) -> None:
            raise ValueError(f"history field {field!r}: {what}")

        if n > b.steps_closed:
            refuse(
                "steps_closed",
                f"the history holds {n} rows but the header counts {b.steps_closed} steps closed",
            )
        if np.any(observed > np.minimum(results, size)):
            refuse("observed", f"a row counts more prompts observed than its results or the {size} prompts")
        seen = c["prompts_observed"]
        if n and (np.any(np.diff(seen) < 0) or seen[-1] > b.prompts_observed or np.any(observed > seen)):
            refuse(
                "prompts_observed",
                f"must not decrease, count the row's observed prompts and stay within the {b.prompts_observed} "
                "prompts the dataset has observed",
            )
        cap = np.minimum(selects, _COUNT_MAX // max(size, 1)) * size  # each select's batch <= size
        if np.any(selects > _SELECTS_MAX) or np.any(c["selected"] < selects) or np.any(c["selected"] > cap):
            refuse("selected", f"a row's batch sizes must lie between 1 and {size} per select request")
        if self.strat.shape[1] and np.any(self.strat.sum(axis=1) != selects):
            refuse("strategies", "a row's counts by strategy must sum to its select requests")
        elif not self.strat.shape[1] and np.any(selects):
            refuse("strategies", "a row counts select requests but no strategy")
        trials = c["rollouts"]
        if np.any(trials < results) or np.any(trials > results.astype(np.float64) * _TRIALS_MAX):
            refuse("rollouts", f"a row's trials must lie between 1 and {_TRIALS_MAX} per result")
        if int(results.astype(object).sum()) + b.open_results > b.results:
            refuse("results", f"the rows and the open step hold more results than the {b.results} applied")
        if math.fsum(trials) + b.open_rollouts > b.rollouts * (1 + 1e-9) + 1e-6:
            refuse("rollouts", f"the rows and the open step hold more trials than the {b.rollouts:g} applied")
        # The running total of rollouts applied (the row's total less its profiling) only grows, holds at
        # least each row's own, and never more than the state applied.
        applied = c["total_rollouts"] - c["profile_rollouts"]
        slack = 1e-9 * np.maximum(np.abs(applied), 1.0)
        if np.any(c["profile_rollouts"] > size * PASS_SAMPLES_MAX):
            refuse(
                "profile_rollouts", f"a row counts more than {PASS_SAMPLES_MAX} profiling rollouts per prompt"
            )
        if n and (
            np.any(np.diff(applied) < trials[1:] - slack[1:])
            or np.any(applied < trials - slack)
            or applied[-1] > b.rollouts * (1 + 1e-9) + 1e-6
        ):
            refuse(
                "total_rollouts",
                f"a row's total less its profiling must grow by at least the row's rollouts and stay within "
                f"the {b.rollouts:g} applied",
            )
        late = c["late"]
        lags = np.arange(LAGS)
        # A row at step s counts lags <= s (results selected at step 0 or later); max_lag does not bound
        # them: results reported with their selected_step are filed however late they come.
        if np.any(late[lags[None, :] > c["step"][:, None]]):
            refuse("late", "a row counts results selected before step 0")
        pred = c["dps_predicted"]
        known = ~np.isnan(pred[:, 0])
        if np.any(known != (observed > 0)) or np.any(np.abs(pred[known].sum(axis=1) - 1) > 1e-5):
            refuse(
                "dps_predicted", "a row with observed prompts has shares summing to 1, one without has none"
            )
        self._check_group_bounds(n_groups)
        self._check_open_bounds(b)

    def _check_group_bounds(self, n_groups: int) -> None:
        c, e = self.cols, self.entries
        g, g_res, g_trials = e["group"], e["group_results"], e["group_trials"]
        if np.any(g >= n_groups) or np.any(c["group_n"] + c["group_omitted"] > n_groups):
            raise ValueError(f"history field 'groups': a row names more groups than the dataset's {n_groups}")
        if np.any((c["group_omitted"] > 0) & (c["group_n"] < ROW_GROUPS)):
            raise ValueError(
                f"history field 'groups_omitted': a row omits groups but lists fewer than {ROW_GROUPS}"
            )
        row = np.repeat(np.arange(self.n), c["group_n"])
        same = row[1:] == row[:-1]
        ordered = (g_res[:-1] > g_res[1:]) | ((g_res[:-1] == g_res[1:]) & (g[:-1] < g[1:]))
        per_row = np.bincount(row, weights=g_res.astype(np.float64), minlength=self.n)
        trials_per_row = np.bincount(row, weights=g_trials, minlength=self.n)
        if (
            np.any(same & ~ordered)
            or np.any(g_trials < g_res)
            or np.any(g_trials > g_res.astype(np.float64) * _TRIALS_MAX)
            or np.any(per_row > c["results"])
            or np.any(trials_per_row > c["rollouts"] * (1 + 1e-9))
        ):
            raise ValueError(
                "history field 'groups': a row's groups must be distinct, ordered by results, and hold at "
                "most the row's results and trials"
            )

    def _check_open_bounds(self, b: Bounds) -> None:
        """The open step's figures (header `open`) against the size and the open step's results."""
        if self.fresh > b.size or self.fresh > b.open_results:
            raise ValueError(
                f"history open figure 'fresh' = {self.fresh} exceeds the open step's prompts observed"
            )
        if self.selects > _SELECTS_MAX or not self.selects <= self.selected <= self.selects * b.size:
            raise ValueError(
                f"history open figure 'selected' = {self.selected} is not 1..{b.size} per select"
            )
        if int(self.late.sum()) != b.open_results:
            raise ValueError(
                f"history open figure 'late' must count the open step's {b.open_results:g} results"
            )
        if abs(float(self.pred.sum()) - self.fresh) > 1e-5 * max(self.fresh, 1):
            raise ValueError("history open figure 'pred' must sum to the prompts it averages ('fresh')")
        og = self.open_groups
        if og["open_group_results"].sum(dtype=np.float64) > b.open_results or np.any(
            og["open_group_trials"] < og["open_group_results"]
        ):
            raise ValueError("history open figure 'open_group_results' exceeds the open step's results")

    def _load_open(self, doc: dict[str, Any]) -> None:
        def count(key: str, value: Any = None) -> int:
            v = doc.get(key) if value is None else value
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= _COUNT_MAX:
                raise ValueError(f"history open figure {key!r} = {str(v)[:100]} is not a count")
            return v

        self.selected, self.selects, self.fresh = count("selected"), count("selects"), count("fresh")
        strategies = doc.get("strategies")
        digests = doc.get("digests")
        pred, late = doc.get("pred"), doc.get("late")
        if (
            not isinstance(strategies, dict)
            or len(strategies) > _MAX_STRATEGIES
            or not all(isinstance(s, str) and _STRATEGY.fullmatch(s) for s in strategies)
            or not isinstance(digests, list)
            or len(digests) > MAX_DIGESTS
            or len(set(digests)) != len(digests)
            or not all(isinstance(d, str) and _DIGEST.fullmatch(d) for d in digests)
            or not isinstance(pred, list)
            or len(pred) != 3
            or not isinstance(late, list)
            or len(late) != LAGS
        ):
            raise ValueError("the snapshot's history of the open step is malformed")
        self.open_strategies = {s: count(f"strategies.{s}", v) for s, v in strategies.items()}
        if sum(self.open_strategies.values()) != self.selects or len(digests) > self.selects:
            raise ValueError("the snapshot's history of the open step counts its selects twice")
        self.digests, self._digest_set = list(digests), set(digests)
        values = []
        for x in pred:
            if isinstance(x, bool) or not isinstance(x, int | float) or not (0 <= x <= max(self.fresh, 0)):
                raise ValueError(f"history open figure 'pred' holds {str(x)[:50]}")
            values.append(float(x))
        self.pred = np.array(values, dtype=np.float64)
        self.late = np.array([count("late", v) for v in late], dtype=np.int64)


def lag_label(lag: int) -> str:
    """The label of a lag in a row's `late` (and in the metrics): "1" .. "7", then "8+"."""
    return f"{lag}+" if lag >= LAG_LABELS else str(lag)


def select_note(strategy: str, batch_size: int, digest: str) -> str:
    """What a select appends to the log record of its step (StepHistory.parse_note reads it)."""
    return f"{strategy} {batch_size} {digest}"
