"""The replay's service side: a real service on its embedded store in a temporary folder, started the way
the product starts it (`launcher.ServiceProcess`: ``python -m selector_service serve``), and one arm per
strategy it offers, driven over REST with the typed client.

A strategy's arm has a dataset of its own, named `dataset_name(arm)` (the name is also the key of the
service's seeded streams, so a replay is the same on every run), with the log's group size as its K.
Epoch e is the service's step e: the arm selects at step e, then reports its picks' groups with
``successes`` and ``trials`` (their counts after the success threshold, as ``/observe`` counts rewards
in binary mode). An arm with the profile (``NAME+profile``) first uploads epoch 0's pass rates
(``PUT /datasets/{name}/metadata``), with ``prior_strength`` the profile's samples per prompt.

The service picks from the whole pool; when an epoch did not observe every prompt, the arm asks for B
plus the prompts the epoch lacks and keeps the first B the epoch observed, in the service's order (best
first; a walk's order for the walks). The prompts it did not keep are not reported, which a walk takes
as not consumed (docs/methods.md §7).
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from rlvr_selector_client.client import InvalidRequest, Result, SelectorClient
from selector_service.replay.protocol import ArmSkipped, EpochTable
from selector_service.server.launcher import ServiceProcess, ServiceStartError

__all__ = ["OBSERVE_CHUNK", "ServiceArm", "dataset_name", "embedded_service"]

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


class ServiceArm:
    """A strategy of the service as an arm of the replay (module docstring)."""

    def __init__(
        self,
        client: SelectorClient,
        strategy: str,
        *,
        profile: bool,
        seed: int = 0,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.strategy = strategy
        self.profile = profile
        self.name = f"{strategy}+profile" if profile else strategy
        self.dataset = dataset_name(self.name)
        self.seed = seed
        self.params = dict(params or {})
        self.n_prompts = 0
        self.created = False

    def begin(self, table: EpochTable) -> None:
        self.n_prompts = table.n_prompts
        k = int(min(max(round(float(np.median(np.concatenate([e.trials for e in table.epochs])))), 1), 1024))
        settings: dict[str, Any] = {"rollouts_per_prompt": k}
        if self.profile:
            settings["prior_strength"] = table.profile_samples
        try:
            self.client.create_dataset(self.dataset, table.n_prompts, **settings)
            self.created = True
            if self.profile:
                rates = table.profile_rates()
                self.client.upload_metadata(
                    self.dataset, pass_rate=[None if math.isnan(r) else float(r) for r in rates]
                )
        except InvalidRequest as exc:
            raise ArmSkipped(f"the service refused {self.name}'s dataset: {exc}") from None

    def pick(self, epoch: int, candidates: np.ndarray, batch_size: int) -> np.ndarray:
        ask = min(self.n_prompts, batch_size + self.n_prompts - candidates.size)
        try:
            selection = self.client.select(
                self.dataset, epoch, ask, self.strategy, params=self.params or None, seed=self.seed
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
                self.client.observe(self.dataset, epoch, results, request_id=f"{self.dataset}-{epoch}-{lo}")
            except InvalidRequest as exc:  # a group the service cannot take (over its K limit, say)
                raise ArmSkipped(f"the service refused {self.name}'s outcomes: {exc}") from None

    def end(self) -> None:
        if self.created:
            self.client.delete_dataset(self.dataset)  # frees the service's memory for the next arm
            self.created = False
