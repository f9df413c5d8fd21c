"""A rollout log written by verl 0.9.1's own dump code (``trainer.rollout_data_dir``) replays.

tests/integrations/frameworks/drive_verl_dump.py runs verl's trainer for three epochs in its cached venv
(generation and the GPU workers faked, as for the adapters' tests); here the folder it dumped is read
back, every group checked against what the fake policy earned, and replayed by `selector-service replay`
on a service of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from selector_service.replay.logs import prompt_key, read_log
from selector_service.replay.protocol import epochs_of
from selector_service.server import cli
from tests.integrations.frameworks import common, venvs

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]


def run_dump_driver(workdir: Path) -> dict[str, Any]:
    try:
        python, _ = venvs.ensure_locked("verl09")
    except venvs.VenvError as exc:
        pytest.fail(f"the verl09 venv could not be built:\n{exc}")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    script = ROOT / "tests" / "integrations" / "frameworks" / "drive_verl_dump.py"
    proc = subprocess.run(
        [str(python), str(script), "--workdir", str(workdir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("DRIVER-REPORT ")]
    assert proc.returncode == 0 and lines, (
        f"drive_verl_dump.py failed:\n{(proc.stdout + proc.stderr)[-8000:]}"
    )
    return json.loads(lines[-1].removeprefix("DRIVER-REPORT "))


def test_a_verl_rollout_dump_replays(tmp_path, capsys):
    report = run_dump_driver(tmp_path / "verl")
    assert report["verl"] == "0.9.1" and report["sampler"] == "RandomSampler"
    dump = Path(report["dump"])
    assert report["files"] == sorted(f"{step}.jsonl" for step in range(1, report["steps"] + 1))

    log = read_log(dump)  # the folder is told apart by itself
    assert log.format == "verl" and log.hashed and log.per_rollout
    # Every rollout the policy answered is one line of the dump, pooled into its (step, prompt) group.
    fed = report["fed"]
    assert log.rows == len(fed) == 12 * 3 * 4 and log.n_prompts == 12 and log.n_groups == 12 * 3
    texts = {}
    for line in (dump / "1.jsonl").read_text().splitlines():
        text = json.loads(line)["input"]
        texts[common.prompt_id_of(text)] = text
    table = epochs_of(log)
    assert table.n_epochs == 3 and table.run_batch_size == 3
    assert all(epoch.size == 12 for epoch in table.epochs)  # verl's sampler: every prompt once an epoch
    earned: dict[int, list[float]] = defaultdict(list)
    for pid, reward in fed:
        earned[int(pid)].append(reward)
    index = {int(k): i for i, k in enumerate(log.keys.tolist())}
    for pid in texts:
        i = index[prompt_key(texts[pid])]
        mine = [int(e.successes[e.ids == i][0]) for e in table.epochs]
        rewards = earned[pid]
        assert mine == [int(sum(rewards[4 * e : 4 * e + 4])) for e in range(3)], pid
        assert all(int(e.trials[e.ids == i][0]) == 4 for e in table.epochs)

    out = tmp_path / "replay"
    arms = "uniform,filter,filter_reprofile,insight,insight+profile,dps"
    assert cli.main(["replay", str(dump), "--arms", arms, "--out", str(out), "--no-progress"]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (line["epochs"], line["prompts"], line["batch_size"]) == (3, 12, 3)
    assert list(line["arms"]) == arms.split(",")
    assert (out / "replay.json").is_file() and (out / "replay.png").is_file()
