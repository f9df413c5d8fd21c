"""Prometheus metrics. No per-prompt labels: only endpoint, method, status, dataset, state, le.

Request metrics are ordinary counters/histograms; with several worker processes the CLI sets
PROMETHEUS_MULTIPROC_DIR and they are aggregated from every worker's files. Dataset metrics are computed
at scrape time from the serving process's beliefs after it caught up with the store, so every worker
reports the same values (they are functions of the shared log).

Dataset series are capped: each dataset has about 35 of them, so at most SELECTOR_METRICS_MAX_DATASETS
datasets get their own (`dataset="<name>"`), the most active ones: those whose log moved most recently,
then those with the most records. Every other dataset is summed into one set of series labelled
`dataset="_other"` (prompts, observed prompts, results, rollouts, steps, lags, the posterior-mean
histogram; evidence and DPS shares are means weighted by prompts, the open step the largest); per-group
series only for datasets of their own. A scrape then costs about (cap + 1) x 35 lines whatever the
number of datasets. When a dataset enters or leaves the cap, `_other`'s counters step by its totals
(Prometheus reads a step down as a counter reset).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from selector_service.core.coldstart import group_statistics
from selector_service.dataset.history import LAG_LABELS
from selector_service.dataset.state import DatasetState
from selector_service.errors import InsufficientMemory, NotFound, ServiceError

if TYPE_CHECKING:
    from selector_service.replication.engine import Engine

log = logging.getLogger("selector_service")
#: The `dataset` label value of the series that sum every dataset beyond the cap.
OTHER = "_other"

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MEAN_BUCKETS = tuple(round(x, 2) for x in np.linspace(0.05, 1.0, 20))

REQUESTS = Counter(
    "selector_http_requests", "HTTP requests by route template and status.", ["endpoint", "method", "status"]
)
LATENCY = Histogram(
    "selector_http_request_duration_seconds",
    "HTTP request latency by route template.",
    ["endpoint", "method"],
    buckets=LATENCY_BUCKETS,
)
CONNECTIONS_REFUSED = Counter(
    "selector_http_connections_refused",
    "Connections the HTTP server closed before the app answered, by status: 431 (head too large), 408 "
    "(head or body too slow), 503 (over SELECTOR_MAX_CONNECTIONS); 'closed' for a body too slow after "
    "its answer.",
    ["status"],
)
CATCHUP = Histogram(
    "selector_store_catchup_seconds",
    "Time to catch up with a dataset's log before answering.",
    buckets=LATENCY_BUCKETS,
)


class DatasetCollector:
    """Per-dataset gauges from the beliefs this process holds (call `update` before collecting)."""

    def __init__(self, max_group_labels: int = 64, max_datasets: int = 50) -> None:
        self._rows: dict[str, dict[str, Any]] = {}
        self._cache: dict[str, tuple[tuple[str, str, int], dict[str, Any]]] = {}
        #: Per-group gauges only for datasets with at most this many groups (bounded label values).
        self.max_group_labels = max_group_labels
        #: Series of their own for at most this many datasets, in `ranking` order; the rest in `_other`.
        self.max_datasets = max_datasets
        self.ranking: list[str] | None = None

    def row(self, st: DatasetState) -> dict[str, Any]:
        """The dataset's statistics (O(N) work, cached until its beliefs move). Call with the lock held."""
        key = (st.spec.uid, st.cursor, st.open_step)
        cached = self._cache.get(st.spec.name)
        if cached is None or cached[0] != key:
            cached = (key, _heavy_stats(st, self.max_group_labels))
            self._cache[st.spec.name] = cached
        return cached[1]

    def put(self, name: str, row: dict[str, Any], lag: int) -> None:
        """Publishes one dataset's row as soon as it is computed (a refresh goes on with the next)."""
        self._rows[name] = dict(row, lag=lag)

    def keep(self, names: Iterable[str]) -> None:
        """Forgets the rows of datasets not in `names` (deleted since)."""
        names = set(names)
        self._rows = {k: v for k, v in self._rows.items() if k in names}
        self._cache = {k: v for k, v in self._cache.items() if k in names}

    def shown(self) -> dict[str, dict[str, Any]]:
        """label value -> row: the ranked datasets of their own (at most `max_datasets`), then `_other`
        summing the rest, when there is a rest."""
        ranked = self.ranking if self.ranking is not None else sorted(self._rows)
        own = [name for name in ranked if name in self._rows][: self.max_datasets]
        chosen = set(own)
        rest = [row for name, row in self._rows.items() if name not in chosen]
        out = {name: self._rows[name] for name in own}
        if rest:
            out[OTHER] = _aggregate(rest)
        return out

    def collect(self) -> Iterable[Any]:
        fam = {
            "prompts": GaugeMetricFamily(
                "selector_dataset_prompts", "Prompts in the dataset.", labels=["dataset"]
            ),
            "open_step": GaugeMetricFamily(
                "selector_dataset_open_step", "Open training step.", labels=["dataset"]
            ),
            "observed": GaugeMetricFamily(
                "selector_dataset_prompts_observed", "Prompts observed at least once.", labels=["dataset"]
            ),
            "evidence": GaugeMetricFamily(
                "selector_dataset_mean_evidence", "Mean Beta evidence alpha + beta.", labels=["dataset"]
            ),
            "eff": GaugeMetricFamily(
                "selector_dataset_effective_ratio",
                "Last closed step: share of observed prompts partially solved (non-zero GRPO advantage).",
                labels=["dataset"],
            ),
            "acc": GaugeMetricFamily(
                "selector_dataset_dps_accuracy",
                "Last closed step: share of observed prompts whose DPS most likely state was right.",
                labels=["dataset"],
            ),
            "share": GaugeMetricFamily(
                "selector_dataset_dps_predicted_share",
                "Share of prompts whose most likely DPS state for the open step is each state.",
                labels=["dataset", "state"],
            ),
            "lag": GaugeMetricFamily(
                "selector_store_lag_records",
                "Log records this process caught up at its last sync of the dataset.",
                labels=["dataset"],
            ),
            "group_mean": GaugeMetricFamily(
                "selector_group_posterior_mean",
                "Mean over a group's prompts of their posterior mean, cold priors included (datasets with "
                "at most SELECTOR_MAX_GROUP_LABELS groups).",
                labels=["dataset", "group"],
            ),
            "group_observed": GaugeMetricFamily(
                "selector_group_observed_share",
                "Share of a group's prompts observed at least once.",
                labels=["dataset", "group"],
            ),
            "group_rate": GaugeMetricFamily(
                "selector_group_rate",
                "A group's success rate (alpha0 + S_g) / (alpha0 + beta0 + T_g) from its decayed sums.",
                labels=["dataset", "group"],
            ),
        }
        results = CounterMetricFamily(
            "selector_dataset_results", "Observation results received.", labels=["dataset"]
        )
        rollouts = CounterMetricFamily("selector_dataset_rollouts", "Rollouts received.", labels=["dataset"])
        profiling = GaugeMetricFamily(
            "selector_dataset_profile_rollouts",
            "Rollouts spent profiling the prompts: the sample counts uploaded with profile true (they can be "
            "replaced, so this can fall).",
            labels=["dataset"],
        )
        total = GaugeMetricFamily(
            "selector_dataset_total_rollouts",
            "Every rollout of the run: those received plus the profiling ones.",
            labels=["dataset"],
        )
        closed = CounterMetricFamily("selector_dataset_steps_closed", "Steps closed.", labels=["dataset"])
        by_lag = CounterMetricFamily(
            "selector_dataset_results_by_lag",
            "Observation results by lag: steps between the step reported and the open step they were "
            f"applied at (0 = on time; lags of {LAG_LABELS} and more share the label '{LAG_LABELS}+').",
            labels=["dataset", "lag"],
        )
        hist = HistogramMetricFamily(
            "selector_dataset_posterior_mean",
            "Distribution of the prompts' posterior means.",
            labels=["dataset"],
        )
        for name, r in self.shown().items():
            fam["prompts"].add_metric([name], r["size"])
            fam["open_step"].add_metric([name], r["open_step"])
            fam["observed"].add_metric([name], r["observed"])
            fam["evidence"].add_metric([name], r["evidence"])
            fam["lag"].add_metric([name], r["lag"])
            if r["eff"] is not None:
                fam["eff"].add_metric([name], r["eff"])
                fam["acc"].add_metric([name], r["acc"])
            for state, share in zip(("unsolved", "partial", "solved"), r["shares"], strict=True):
                fam["share"].add_metric([name, state], share)
            results.add_metric([name], r["results"])
            rollouts.add_metric([name], r["rollouts"])
            profiling.add_metric([name], r["profile_rollouts"])
            total.add_metric([name], r["rollouts"] + r["profile_rollouts"])
            closed.add_metric([name], r["steps_closed"])
            for lag, count in r["by_lag"].items():
                by_lag.add_metric([name, lag], count)
            hist.add_metric([name], r["buckets"], r["mean_sum"])
            for group, mean, observed, rate in r["groups"]:
                fam["group_mean"].add_metric([name, group], mean)
                fam["group_observed"].add_metric([name, group], observed)
                fam["group_rate"].add_metric([name, group], rate)
        yield from fam.values()
        yield from (results, rollouts, profiling, total, closed, by_lag, hist)


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One row for many datasets: counts summed, evidence and shares weighted by prompts, the open step
    the largest, no per-group rows and no last-step ratios (they describe one dataset's close)."""
    size = sum(r["size"] for r in rows)
    weight = [r["size"] / max(size, 1) for r in rows]
    by_lag: dict[str, float] = {}
    for r in rows:
        for lag, count in r["by_lag"].items():
            by_lag[lag] = by_lag.get(lag, 0) + count
    buckets = [(le, sum(r["buckets"][i][1] for r in rows)) for i, (le, _) in enumerate(rows[0]["buckets"])]
    return {
        "size": size,
        "open_step": max(r["open_step"] for r in rows),
        "observed": sum(r["observed"] for r in rows),
        "evidence": sum(w * r["evidence"] for w, r in zip(weight, rows, strict=True)),
        "eff": None,
        "acc": None,
        "shares": [sum(w * r["shares"][i] for w, r in zip(weight, rows, strict=True)) for i in range(3)],
        "results": sum(r["results"] for r in rows),
        "rollouts": sum(r["rollouts"] for r in rows),
        "profile_rollouts": sum(r["profile_rollouts"] for r in rows),
        "steps_closed": sum(r["steps_closed"] for r in rows),
        "by_lag": dict(sorted(by_lag.items())),
        "buckets": buckets,
        "mean_sum": sum(r["mean_sum"] for r in rows),
        "groups": [],
        "lag": sum(r.get("lag", 0) for r in rows),
    }


def _group_rows(st: DatasetState, max_labels: int) -> list[tuple[str, float, float, float]]:
    """(group, posterior mean, observed share, rate) per group in use, when there are at most `max_labels`."""
    if not st.arrays.shared.n_groups > 0 or np.count_nonzero(st.arrays.shared.group_size) > max_labels:
        return []
    stats = group_statistics(st.arrays)
    return [
        (str(int(g)), float(m), float(o), float(r))
        for g, m, o, r in zip(
            stats["group"], stats["posterior_mean"], stats["observed_share"], stats["rate"], strict=True
        )
    ]


def _heavy_stats(st: DatasetState, max_group_labels: int = 64) -> dict[str, Any]:
    """O(N) statistics, cached per (uid, cursor, open step) so repeated scrapes cost nothing."""
    a = st.arrays
    n = st.spec.size
    mean = a.alpha / (a.alpha + a.beta)
    counts, _ = np.histogram(mean, bins=(0.0, *MEAN_BUCKETS))
    cum = np.cumsum(counts)
    buckets = [(repr(float(le)), float(c)) for le, c in zip(MEAN_BUCKETS, cum, strict=True)]
    buckets[-1] = ("1.0", float(n))
    buckets.append(("+Inf", float(n)))
    lc = st.last_close
    if lc is not None and lc.observed:
        eff, acc = lc.partial / lc.observed, lc.correct / lc.observed
    else:
        eff = acc = None
    if lc is not None:
        pred = np.array([lc.predicted_unsolved, lc.predicted_partial, lc.predicted_solved], dtype=float)
    else:
        pred = _argmax_shares(st)
    return {
        "size": n,
        "open_step": st.open_step,
        "observed": st.prompts_observed(),
        "evidence": float((a.alpha + a.beta).mean()),
        "eff": eff,
        "acc": acc,
        "shares": (pred / max(n, 1)).tolist(),
        "results": st.results,
        "rollouts": st.rollouts,
        "profile_rollouts": st.profile_rollouts(),
        "steps_closed": st.steps_closed,
        "by_lag": {
            (f"{lag}+" if lag >= LAG_LABELS else str(lag)): count
            for lag, count in sorted(st.results_by_lag.items())
        },
        "buckets": buckets,
        "mean_sum": float(mean.sum()),
        "groups": _group_rows(st, max_group_labels),
    }


def _argmax_shares(st: DatasetState) -> np.ndarray:
    """Before the first close: count the priors' most likely states (ties shared equally)."""
    return st.arrays.predicted_state_counts().astype(float)


def render(collector: DatasetCollector) -> bytes:
    """The exposition text: request metrics (all workers when multiprocess) + dataset metrics."""
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # prometheus_client leaves it unannotated
    else:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    body = generate_latest(registry)
    dataset_registry = CollectorRegistry()
    dataset_registry.register(collector)
    return body + generate_latest(dataset_registry)


class Scrape:
    """What GET /metrics answers: the exposition text, after a bounded wait for fresh dataset gauges.

    Dataset gauges come from a catch-up with the store. A scrape waits for it at most `wait_s`; a slower
    one (a frozen store, a long replay) goes on in the background, and this scrape and the next ones
    report the last complete figures until it ends. One refresh runs at a time.
    """

    def __init__(self, max_group_labels: int, wait_s: float, max_datasets: int = 50) -> None:
        self.collector = DatasetCollector(max_group_labels, max_datasets)
        self.wait_s = wait_s
        self._task: asyncio.Task[None] | None = None
        self._records: dict[str, int] = {}  # each dataset's record count at the last refresh
        self._moved: dict[str, float] = {}  # when its record count was last seen to change

    async def render(self, engine: Engine) -> bytes:
        task = self._task
        if task is None or task.done():
            task = self._task = asyncio.get_running_loop().create_task(self._refresh(engine))
        await asyncio.wait({task}, timeout=self.wait_s)
        return render(self.collector)

    def cancel(self) -> None:
        """Stops a refresh still running (at shutdown)."""
        if self._task is not None:
            self._task.cancel()

    def rank(self, records: dict[str, int]) -> list[str]:
        """The datasets by activity: most recently moved first (a record appended since the previous
        refresh), then most records, then name. The first refresh knows only the record counts."""
        now = time.monotonic()
        for name, count in records.items():
            if name in self._records and count != self._records[name]:
                self._moved[name] = now
        self._records = dict(records)
        self._moved = {k: v for k, v in self._moved.items() if k in records}
        return sorted(records, key=lambda n: (-self._moved.get(n, 0.0), -records[n], n))

    async def _refresh(self, engine: Engine) -> None:
        """Catches up with every dataset, most active first, publishing each row as it is computed: a
        scrape that stops waiting shows the top datasets first (after a restart too, when every
        dataset is loaded again)."""
        try:
            names = await engine.list_datasets()
            order = self.rank(await engine.record_counts(names))
            self.collector.ranking = order
            self.collector.keep(order)
            for name in order:
                try:
                    row = await engine.read(name, self.collector.row)
                except (NotFound, InsufficientMemory):
                    continue  # deleted meanwhile, or not held by this process (its budget says why)
                stats = engine.sync_stats.get(name)
                self.collector.put(name, row, stats.records if stats else 0)
        except ServiceError as exc:
            log.warning("metrics keep their last dataset gauges: %s", exc.detail)
