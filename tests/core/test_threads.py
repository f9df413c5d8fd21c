"""Parallel kernels called from many threads at once (core/_parallel.py).

numba's `workqueue` threading layer aborts the whole process when two threads launch parallel kernels
concurrently, so each scenario runs in a child interpreter: a crash is then a test failure, not a
crashed test run. The child is forced onto `workqueue` (the layer that breaks) as well as run on the
default layer, and every thread's results must equal the single-threaded ones bit for bit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import threading
    import numpy as np
    from selector_service.core import BeliefArrays, apply_results, close_step, dps_scores, wmi_scores
    from selector_service.core import dps
    from selector_service.core._parallel import PARALLEL_MIN

    dps.CLOSE_PARALLEL_MIN = 0  # the close's parallel kernel from PARALLEL_MIN observed prompts on

    n = PARALLEL_MIN * 3  # above the threshold: every call below takes the parallel kernels
    rng = np.random.default_rng(0)
    alpha = 1 + rng.gamma(0.5, 20, n)
    beta = 1 + rng.gamma(0.5, 20, n)

    def make_beliefs():
        ba = BeliefArrays.new(n)
        ids = np.arange(0, n, 3)
        states = (ids % 3 + 1).astype(np.int8)
        apply_results(ba, ids, np.where(states == 1, 0.0, 4.0), np.full(ids.size, 4.0), states, 1.0, 1.0, 1.0)
        return ba

    def work(results, slot):
        ba = make_beliefs()
        out = []
        for _ in range(6):
            out.append(wmi_scores(alpha, beta, None, 8, 3.0, 0.3))
            out.append(np.array(close_step(ba, 0.7)))
            out.append(dps_scores(ba.obs_prior[: ba.observed], None, 0.1))
        out.append(ba.obs_d[: ba.observed].copy())
        results[slot] = out

    expected = {}
    work(expected, 0)
    results = {}
    threads = [threading.Thread(target=work, args=(results, i)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(6):
        for got, want in zip(results[i], expected[0], strict=True):
            assert np.array_equal(got, want), "a thread computed different bits"
    print("ok", len(results))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("layer", ["workqueue", "default"])
def test_parallel_kernels_from_many_threads(layer):
    env = dict(os.environ)
    env.pop("NUMBA_THREADING_LAYER", None)
    if layer != "default":
        env["NUMBA_THREADING_LAYER"] = layer
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, f"child exited {proc.returncode}:\\n{proc.stdout}\\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip() == "ok 6"
