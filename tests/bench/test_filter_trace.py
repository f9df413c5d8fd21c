"""bench/filter_trace.py is the product's replay: its uniform, static, default and latest-group arms are
`selector-service replay`'s `uniform`, `filter`, `filter_reprofile` and `filter_latest_outcome`, epoch for
epoch on the same service; the profile it charges is the service's count; the prompts a filter keeps at
the end are judged by the service's filter code (the static one keeps the profile's mixed prompts)."""

from __future__ import annotations

import json

import numpy as np

from bench import filter_trace as ft
from selector_service.replay import command
from selector_service.replay.protocol import is_mixed
from selector_service.server import cli

SHARED = {
    ft.UNIFORM: "uniform",
    ft.STATIC: "filter",
    ft.DEFAULT: "filter_reprofile",
    ft.LATEST: "filter_latest_outcome",
}
N, EPOCHS, BATCH = 40, 6, 10


def _trace(tmp_path):
    """An accuracy file: N prompts, EPOCHS epochs of 8 rollouts, each prompt's rate drifting upwards."""
    rng = np.random.default_rng(3)
    start = rng.uniform(0, 1, N)
    acc = {
        str(i): [float(rng.binomial(8, min(1.0, start[i] + 0.08 * e)) / 8) for e in range(EPOCHS)]
        for i in range(N)
    }
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(acc))
    return path


def test_its_arms_are_the_replay_commands(tmp_path, service):
    path = _trace(tmp_path)
    table = ft.load(path)
    specs = [s for s in ft.arms(quick=True) if s.name in SHARED or s.name == "filter b=0.3"]
    assert len(specs) == 5
    runs = ft.run(table, specs, BATCH, 1, service.url)
    out = tmp_path / "replay"
    args = cli._parser().parse_args(
        ["replay", str(path), "--batch-size", str(BATCH), "--arms", ",".join(SHARED.values()), "--no-plot",
         "--no-progress", "--out", str(out)]
    )  # fmt: skip
    assert command.run(args, service_url=service.url) == 0
    detail = json.loads((out / "replay.json").read_text())["arms"]
    for name, arm in SHARED.items():
        mine = runs[name].results[0]
        theirs = [0 if x is None else round(x * BATCH) for x in detail[arm]["esr_per_epoch"]]
        assert mine.mixed.tolist() == theirs, name
        assert mine.profile_rollouts == detail[arm]["profile_rollouts"] == (0 if arm == "uniform" else N * 8)
    first = table.epochs[0]
    assert runs[ft.STATIC].kept == [int(is_mixed(first.successes, first.trials).sum())]
    assert runs[ft.STATIC].config["params"]["reprofile"] is False
    summary = ft.summarize(runs["filter b=0.3"])
    assert summary["profiling_rollouts"] == N * 8 and summary["rollouts"] == (EPOCHS - 1) * BATCH * 8
    assert 0 < summary["kept_at_end"]["mean"] <= N and runs[ft.UNIFORM].kept == [None]
