"""Built-in model materialization: several trainers started at once write the checkpoint once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trainer_client import model


def test_concurrent_first_use_materializes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(model.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(model, "_find_gguf", lambda package, pattern: tmp_path / "weights.gguf")
    calls: list[Path] = []

    def slow_materialize(gguf_path: Path, target: Path) -> None:
        calls.append(target)
        time.sleep(0.3)  # long enough that every other thread arrives while this one writes
        if target.exists():
            raise FileExistsError(f"{target} written twice")
        target.mkdir(parents=True)
        (target / model._READY_MARKER).write_text("done\n")

    monkeypatch.setattr(model, "_materialize_from_gguf", slow_materialize)
    results: list[Path] = []
    errors: list[BaseException] = []

    def first_use() -> None:
        try:
            results.append(model.resolve_model("smollm2-135m"))
        except BaseException as exc:  # collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=first_use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(calls) == 1
    assert results == [tmp_path / "cache" / "smollm2-135m"] * 4
    assert (results[0] / model._READY_MARKER).exists()
