"""The recommendation rule (rlvr_selector_client.recommend): each row of its table picks what it says for
the runs it covers, what it returns is runnable as is, and it imports nothing heavy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rlvr_selector_client.recommend import RULES, Known, decision_table, recommend, static_filter_params

ROOT = Path(__file__).resolve().parents[2]


def test_a_known_rate_on_a_pool_larger_than_the_run_recommends_insight_on_the_rates():
    rec = recommend(200_000, 0.5, 256, Known.profile(8))
    assert (rec.strategy, rec.arm, rec.upload_pass_rates, rec.prior_strength) == (
        "insight",
        "insight+profile",
        True,
        8,
    )
    assert rec.params == {"mu": 0.5} and "--regime best" in rec.why and rec.select_filter is None
    shipped = recommend(20_000, 1.9, 256, Known.rate())
    assert shipped.arm == "insight+profile" and shipped.prior_strength == 16  # a rate without a count


def test_a_pool_visited_again_and_again_recommends_uniform_whatever_is_known():
    """The epochs regime: neither a profile, the filter nor INSIGHT beat uniform held-out there."""
    for known in (Known.nothing(), Known.rate(), Known.profile(8)):
        rec = recommend(2_000, 12, 32, known)
        assert (rec.arm, rec.params, rec.upload_pass_rates) == ("uniform", {}, False)
        assert "--regime epochs" in rec.why
    assert recommend(20_000, 2.0, 256, Known.profile(16)).arm == "uniform"  # the boundary: 2 visits
    assert recommend(200_000, 0.5, 64).arm == "uniform"  # nothing to go on


def test_every_rule_names_its_evidence_and_every_kind_and_shape_is_covered():
    assert all(rule.evidence and rule.buys and "@" not in rule.buys for rule in RULES)
    for kind in ("nothing", "rate", "profile"):
        for epochs in (0.01, 1.99, 2.0, 100.0):
            assert recommend(1_000, epochs, 8, Known(kind, 4.0)).strategy  # a row for every run


def test_the_decision_table_is_the_rules():
    table = decision_table()
    rows = table.strip().splitlines()[2:]
    assert len(rows) == len(RULES)
    for row, rule in zip(rows, RULES, strict=True):
        assert rule.when in row and rule.runs in row and rule.evidence in row


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda: recommend(0, 1, 1), "pool_size"),
        (lambda: recommend(10, 0, 1), "epochs"),
        (lambda: recommend(10, 1, 0), "batch_size"),
        (lambda: Known("guess"), "kind"),
        (lambda: Known.profile(0), "samples"),
    ],
)
def test_bad_inputs_are_refused(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_it_imports_only_the_standard_library():
    """Without site-packages (python -S) only the standard library can load: the module must still run
    (the adapters and the trainer import it; the package's __init__ needs httpx, so the file is loaded)."""
    code = (
        "import importlib.util, sys; s = importlib.util.spec_from_file_location('r', sys.argv[1]);"
        " m = importlib.util.module_from_spec(s); sys.modules['r'] = m; s.loader.exec_module(m);"
        " print(m.recommend(10, 3, 2).arm)"
    )
    path = ROOT / "client" / "rlvr_selector_client" / "recommend.py"
    out = subprocess.run([sys.executable, "-S", "-c", code, str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "uniform", out.stderr


@pytest.mark.parametrize("seed", range(12))
def test_the_static_filter_settings_keep_exactly_the_prompts_strictly_between_0_and_1(seed):
    """Judged by the service's own filter (selector_service.core.filter.judge on the beliefs the upload
    makes): for one count or a spread of counts, under the default or another Beta prior, every rate
    s/n with 0 < s < n is kept, 0/n and n/n dropped, and a prompt without a rate kept."""
    from selector_service.core.beliefs import BeliefArrays
    from selector_service.core.coldstart import apply_metadata
    from selector_service.core.filter import KEEP, Filter, judge
    from selector_service.core.strategies import validate_filter

    rng = np.random.default_rng(seed)
    low = int(rng.integers(1, 20))
    counts = [low] if seed % 2 else sorted({low, low + int(rng.integers(0, low + 1))})
    prior = (1.0, 1.0) if seed % 3 else (float(rng.uniform(0.2, 3)), float(rng.uniform(0.2, 3)))
    params = static_filter_params(counts if len(counts) > 1 else counts[0], prior)
    samples = np.array([n for n in counts for _ in range(n + 1)] + [1], dtype=np.int32)
    successes = np.array([s for n in counts for s in range(n + 1)] + [0])
    rates = successes / samples
    rates[-1] = np.nan  # the last prompt has no rate
    ba = BeliefArrays.new(rates.size, *prior)
    apply_metadata(ba, 0, rates, None, np.where(np.isnan(rates), -1, samples).astype(np.int32), True)
    codes = judge(ba, np.arange(rates.size), Filter.of(validate_filter(params), int(rng.integers(1, 17))))
    mixed = (successes > 0) & (successes < samples)
    mixed[-1] = True
    assert np.array_equal(codes == KEEP, mixed), (counts, prior, params)


def test_static_filter_settings_for_a_single_count_sit_half_a_sample_below_the_extremes():
    assert static_filter_params(8) == pytest.approx(
        {"reprofile": False, "k": 1, "solved": 8.5 / 10, "unsolved": 8.5 / 10}
    )
    assert static_filter_params([8, 8], (2.0, 1.0))["solved"] == pytest.approx(9.5 / 11)
    assert static_filter_params([2, 8])["k"] > 1  # one bound at k = 1 cannot separate 1/2 from 7/8
    with pytest.raises(ValueError, match="profiles of 1 to 100 samples"):
        static_filter_params([1, 100])
    with pytest.raises(ValueError, match="whole numbers >= 1"):
        static_filter_params(0)
