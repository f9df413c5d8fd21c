"""The replay's arms on a real service (the module's, on the shared Redis): the static filter keeps exactly
the prompts mixed in the profile, for one group size or a spread of them; the re-profiled filter drops
the prompts the run solves; the profile's rollouts are the service's own count; a select's filter applies
to a strategy's arm, and a strategy that takes none is skipped with the service's reason."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from rlvr_selector_client import SelectorClient
from selector_service.replay.arms import build_arm
from selector_service.replay.protocol import epochs_of, is_mixed, replay
from tests.replay.test_protocol import make_log


def _log(n: int, epochs: int, sizes, outcome):
    """Every prompt in every epoch (one step each); prompt i's group at epoch e has sizes[i] rollouts and
    outcome(i, e, size) successes."""
    steps, prompts, successes, trials = [], [], [], []
    for e in range(epochs):
        for i in range(n):
            steps.append(e)
            prompts.append(i)
            trials.append(int(sizes[i]))
            successes.append(int(outcome(i, e, int(sizes[i]))))
    return make_log(steps, prompts, successes, trials, n)


def _run(client, table, name, batch, **kwargs):
    """The arm `name` on a dataset of its own, its picks per epoch recorded."""
    arm = build_arm(name, client, **kwargs)
    arm.dataset = f"replay-test-{uuid.uuid4().hex[:10]}"
    picks: dict[int, list[int]] = {}
    see = arm.see

    def record(epoch, ids, successes, trials):
        picks[epoch] = sorted(ids.tolist())
        see(epoch, ids, successes, trials)

    arm.see = record
    (result,) = replay(table, [arm], batch)
    return result, picks


@pytest.mark.parametrize("spread", [False, True])
def test_the_static_filter_keeps_exactly_the_prompts_mixed_in_the_profile(service, spread):
    """B = the prompts mixed in epoch 0: every epoch the static arm picks exactly them, whatever they do
    later (here every prompt is mixed from epoch 1 on), and the service counts epoch 0's rollouts."""
    rng = np.random.default_rng(1)
    n = 60
    sizes = rng.integers(2, 9, n) if spread else np.full(n, 4)  # 2 to 8: one bound at k = 1 cannot do
    first = [int(rng.integers(0, s + 1)) for s in sizes]
    table = epochs_of(_log(n, 5, sizes, lambda i, e, s: first[i] if e == 0 else 1))
    mixed = np.flatnonzero(is_mixed(np.array(first), sizes)).tolist()
    assert 0 < len(mixed) < n
    with SelectorClient(service.url) as client:
        result, picks = _run(client, table, "filter", len(mixed))
        assert result.skipped is None
        assert picks == {e: mixed for e in range(1, 5)}
        assert result.profile_rollouts == int(sizes.sum())
        # A smaller batch: only those prompts, never one solved or failed in the profile.
        _, picks = _run(client, table, "filter", len(mixed) // 3)
        assert all(set(p) <= set(mixed) for p in picks.values())


def test_the_reprofiled_filter_drops_what_the_run_solves(service):
    """Every prompt is mixed in the profile; from epoch 1 on prompts 0..9 come out all solved, 10..19
    mixed. The static filter keeps picking the solved ones; the re-profiled one (the service's beliefs)
    leaves them once they have come out solved a few times."""
    table = epochs_of(_log(20, 12, np.full(20, 4), lambda i, e, s: 2 if e == 0 or i >= 10 else s))
    with SelectorClient(service.url) as client:
        static, _ = _run(client, table, "filter", 10)
        reprofiled, picks = _run(client, table, "filter_reprofile", 10)
    assert reprofiled.profile_rollouts == static.profile_rollouts == 80
    assert static.mixed[-3:].sum() < 25  # about half its picks are the solved prompts
    assert reprofiled.mixed[-3:].tolist() == [10, 10, 10] and picks[11] == list(range(10, 20))


def test_a_select_filter_applies_to_a_strategy_arm_and_greso_is_skipped(service):
    """uniform+profile+filter never picks a prompt its profile says is solved (4/4 at K = 4: P(all 4
    succeed) = 5/9 >= 0.5, the default bound), uniform+profile does, and so does the filter with a bound
    above 5/9; greso takes no filter and the service says why."""
    table = epochs_of(_log(30, 3, np.full(30, 4), lambda i, e, s: s if i < 10 else 1))
    with SelectorClient(service.url) as client:
        result, picks = _run(client, table, "uniform+profile+filter", 15)
        assert result.skipped is None and all(min(p) >= 10 for p in picks.values())
        assert result.profile_rollouts == 120
        for name, settings in (("uniform+profile", None), ("uniform+profile+filter", {"solved": 0.9})):
            _, picks = _run(client, table, name, 15, filter=settings)
            assert any(min(p) < 10 for p in picks.values()), name
        skipped, _ = _run(client, table, "greso+filter", 15)
    assert skipped.skipped is not None and "greso" in skipped.skipped and "filter" in skipped.skipped
