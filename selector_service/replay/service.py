"""The replay's service side: a real service on its embedded store in a temporary folder, started the way
the product starts it (`launcher.ServiceProcess`: ``python -m selector_service serve``), and `ServiceArm`,
an arm that is a configuration of the service (a strategy with its parameters, a select's filter, dataset
settings, the profile or not), driven over REST with the typed client.

A service arm has a dataset of its own, named `dataset_name(arm)` (the name is also the key of the
service's seeded streams, so a replay is the same on every run), with the log's group size as its K.
Epoch e is the service's step e: the arm selects at step e, then reports its picks' groups with
``successes`` and ``trials`` (their counts after the success threshold, as ``/observe`` counts rewards
in binary mode). An arm with the profile first uploads epoch 0's pass rates, each with its group's size
as ``pass_samples`` and ``profile: true`` (``PUT /datasets/{name}/metadata``): each rate weighs its
samples, and the service counts them as the dataset's profiling rollouts, which the arm reports
(`ServiceArm.profile_rollouts`, read from the dataset's summary before it is deleted).

The service picks from the whole pool; when an epoch did not observe every prompt, the arm asks for B
plus the prompts the epoch lacks and keeps the first B the epoch observed, in the service's order (best
first; a walk's order for the walks). The prompts it did not keep are not reported, which a walk takes
as not consumed (docs/methods.md §7).
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_selector_client.client import InvalidRequest, Result, SelectorClient
from selector_service.launcher import ServiceProcess, ServiceStartError
from selector_service.replay.protocol import ArmSkipped, EpochTable

__all__ = ["OBSERVE_CHUNK", "ServiceArm", "dataset_name", "embedded_service", "profile_upload"]

#: Results per /observe request (a larger pick goes in several, all filed at the epoch's step).
OBSERVE_CHUNK = 50_000


def dataset_name(arm: str) -> str:
    """The dataset (and stream key) of an arm: ``replay-insight``, ``replay-insight.profile``."""
    return "replay-" + arm.replace("+", ".")


@contextmanager
def embedded_service(start_timeout_s: float = 180.0) -> Iterator[str]:
    """A service of its own on its embedded Valkey in a temporary folder (removed afterwards), with every
    setting at its default (the caller's SELECTOR_* variables are not passed on) but the store's fsync,
    which a throwaway store does not need. Yields its URL; raises RuntimeError when it cannot start."""
    with tempfile.TemporaryDirectory(prefix="selector-replay-") as tmp:
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SELECTOR_")}
        env["SELECTOR_EMBEDDED_FSYNC"] = "everysec"
        env["SELECTOR_LOG_LEVEL"] = "warning"
        service = ServiceProcess(data_dir=Path(tmp) / "data", env=env, log_path=Path(tmp) / "service.log")
        try:
            service.start(timeout_s=start_timeout_s)
        except ServiceStartError as exc:
            raise RuntimeError(f"the replay's service did not start: {exc}") from None
        try:
            yield service.url
        finally:
            service.stop()


def profile_upload(table: EpochTable) -> tuple[list[float | None], list[int | None]]:
    """Epoch 0 as a profile: each prompt's pass rate there and its group's size (None for a prompt the
    epoch did not observe)."""
    first = table.epochs[0]
    rates: list[float | None] = [None] * table.n_prompts
    samples: list[int | None] = [None] * table.n_prompts
    for i, s, t in zip(first.ids.tolist(), first.successes.tolist(), first.trials.tolist(), strict=True):
        rates[i], samples[i] = s / t, t
    return rates, samples


class ServiceArm:
    """A configuration of the service as an arm of the replay (module docstring): `strategy` with
    `params`, a select's `filter` object (None: none), dataset `settings` beyond K (beta_decay, ...), with
    the profile uploaded or not. Named ``STRATEGY``, ``STRATEGY+profile`` unless `name` says otherwise;
    its dataset is `dataset_name(name)` unless `dataset` says otherwise."""

    def __init__(
        self,
        client: SelectorClient,
        strategy: str,
        *,
        profile: bool,
        seed: int = 0,
        params: Mapping[str, Any] | None = None,
        filter: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
        name: str | None = None,
        dataset: str | None = None,
    ) -> None:
        self.client = client
        self.strategy = strategy
        self.profile = profile
        self.name = name or (f"{strategy}+profile" if profile else strategy)
        self.dataset = dataset or dataset_name(self.name)
        self.seed = seed
        self.params = dict(params or {})
        self.filter = None if filter is None else dict(filter)
        self.settings = dict(settings or {})
        self.profile_rollouts = 0
        self.n_prompts = 0
        #: The dataset's K: the log's median group size (at most the service's 1024).
        self.k = 0
        self.created = False
        #: Names this arm's reports (their request ids), apart from an earlier replay's on the same service.
        self.run = f"replay-{uuid.uuid4().hex[:12]}"

    def begin(self, table: EpochTable) -> None:
        self.n_prompts = table.n_prompts
        median = float(np.median(np.concatenate([e.trials for e in table.epochs])))
        self.k = int(min(max(round(median), 1), 1024))
        try:
            self.client.create_dataset(
                self.dataset, table.n_prompts, rollouts_per_prompt=self.k, **self.settings
            )
            self.created = True
            if self.profile:
                rates, samples = profile_upload(table)
                self.client.upload_metadata(self.dataset, pass_rate=rates, pass_samples=samples, profile=True)
        except InvalidRequest as exc:
            raise ArmSkipped(f"the service refused {self.name}'s dataset: {exc}") from None

    def pick(self, epoch: int, candidates: np.ndarray, batch_size: int) -> np.ndarray:
        ask = min(self.n_prompts, batch_size + self.n_prompts - candidates.size)
        try:
            selection = self.client.select(
                self.dataset,
                epoch,
                ask,
                self.strategy,
                params=self.params or None,
                seed=self.seed,
                filter=self.filter,
            )
        except InvalidRequest as exc:
            raise ArmSkipped(f"the service refused {self.name}: {exc}") from None
        ids = np.asarray(selection.prompt_ids, dtype=np.int64)
        if ask > batch_size:
            ids = ids[np.isin(ids, candidates)][:batch_size]
        return ids

    def see(self, epoch: int, ids: np.ndarray, successes: np.ndarray, trials: np.ndarray) -> None:
        for lo in range(0, ids.size, OBSERVE_CHUNK):
            results = [
                Result(int(i), successes=int(s), trials=int(t))
                for i, s, t in zip(
                    ids[lo : lo + OBSERVE_CHUNK].tolist(),
                    successes[lo : lo + OBSERVE_CHUNK].tolist(),
                    trials[lo : lo + OBSERVE_CHUNK].tolist(),
                    strict=True,
                )
            ]
            try:
                self.client.observe(self.dataset, epoch, results, request_id=f"{self.run}-{epoch}-{lo}")
            except InvalidRequest as exc:  # a group the service cannot take (over its K limit, say)
                raise ArmSkipped(f"the service refused {self.name}'s outcomes: {exc}") from None

    def end(self) -> None:
        if self.created:
            try:  # what the service counted as the profile's rollouts
                summary = self.client.get_dataset(self.dataset).raw.get("summary") or {}
                self.profile_rollouts = int(summary.get("profile_rollouts") or 0)
            finally:
                self.client.delete_dataset(self.dataset)  # frees the service's memory for the next arm
                self.created = False
