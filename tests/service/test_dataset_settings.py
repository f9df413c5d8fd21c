"""The dataset settings' one declaration (selector_service/contract/dataset_settings.py) and what follows from it:
the bodies' fields, the stored spec and its fingerprint, and the kernels' rule defaults."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import ValidationError

from selector_service.contract import dataset_settings
from selector_service.contract.schemas import DatasetCreate, DatasetInfo, decode_observe
from selector_service.core.shared import DatasetRules
from selector_service.dataset.state import DatasetSpec
from selector_service.storage.store import Keys

NAMES = [s.name for s in dataset_settings.SETTINGS]


def test_the_bodies_and_the_spec_have_every_setting_in_order() -> None:
    assert list(DatasetCreate.model_fields) == NAMES
    assert list(DatasetInfo.model_fields)[: len(NAMES)] == NAMES
    assert [f.name for f in dataclasses.fields(DatasetSpec)] == [*NAMES, "uid"]
    spec = DatasetSpec(name="d", size=3)
    assert {name: getattr(spec, name) for name in dataset_settings.DEFAULTS} == dataset_settings.DEFAULTS
    request = DatasetCreate(name="d", size=3)
    assert DatasetSpec.from_request(request) == spec


def test_a_stored_document_holds_every_setting_and_the_fingerprint_all_of_them() -> None:
    spec = DatasetSpec(name="d", size=3, beta_prior=(1.0, 2.0), hmm_decay=0.5)
    doc = dict(spec.public(), uid="u")
    assert DatasetSpec.from_doc(doc) == dataclasses.replace(spec, uid="u")
    lacking = {k: v for k, v in doc.items() if k not in ("max_lag", "group_decay")}
    with pytest.raises(ValueError, match="lacks the settings max_lag, group_decay"):
        DatasetSpec.from_doc(lacking)
    assert set(json.loads(spec.fingerprint())) == set(NAMES)
    assert spec.fingerprint() != dataclasses.replace(spec, group_decay=0.5).fingerprint()


def test_the_rule_settings_default_to_the_kernels_own_defaults() -> None:
    """The settings the kernels read reach them under their own names, as the spec's rules; the rules
    the core builds without a spec have the declaration's defaults, but for the decays, which a call
    names when no dataset fixes them."""
    rules = DatasetRules()
    assert dataset_settings.RULES == ("beta_decay", "hmm_decay", "prior_strength", "group_decay")
    fixed = [name for name in dataset_settings.RULES if name not in ("beta_decay", "hmm_decay")]
    assert {name: getattr(rules, name) for name in fixed} == {
        name: dataset_settings.DEFAULTS[name] for name in fixed
    }
    assert (rules.beta_decay, rules.hmm_decay) == (None, None)
    spec = DatasetSpec(
        name="d", size=3, beta_prior=(2.0, 3.0), beta_decay=0.9, hmm_decay=0.6, group_decay=0.5
    )
    assert {name: getattr(spec.rules(), name) for name in dataset_settings.RULES} == {
        name: getattr(spec, name) for name in dataset_settings.RULES
    }
    assert (spec.rules().alpha0, spec.rules().beta0) == spec.beta_prior
    with pytest.raises(ValueError, match=r"prior_strength 2000000\.0 not in \[0, 1e\+06\]"):
        DatasetRules(prior_strength=2e6)  # the spec's domain, from the same declaration


def test_a_stored_spec_out_of_range_is_named_setting_by_setting() -> None:
    spec = DatasetSpec(name="d", size=0, rollouts_per_prompt=2000, beta_decay=0.0, prior_strength=2e6)
    problem = spec.problems()
    assert problem == (
        "size 0 must be >= 1; rollouts_per_prompt 2000 not in 1..1024; beta_decay 0.0 not in (0, 1]; "
        "prior_strength 2000000.0 not in [0, 1e+06]"
    )
    assert DatasetSpec(name="d", size=1, reward_mode="x", defaults=[]).problems() == (
        "reward_mode 'x' is unknown; defaults must be an object"
    )


@pytest.mark.parametrize(
    "name", ["d", "D.set_1-2", "a" * 128, "a" * 129, "", "-a", ".a", "a b", "a\n", "a\r", "\na", "a\x00", "é"]
)
def test_every_check_of_a_dataset_name_agrees_with_the_contract(name) -> None:
    """The contract's pattern (pydantic's), the store's key builder and the observe body's fast parser
    accept the same names (Python's `$` alone would let a final newline through)."""
    try:
        DatasetCreate(name=name, size=1)
        contract = True
    except ValidationError:
        contract = False
    try:
        Keys("p").spec(name)
        store = True
    except ValueError:
        store = False
    body = json.dumps({"dataset": name, "step": 0, "request_id": "r", "results": [{"prompt_id": 0}]}).encode()
    fast = decode_observe(body)[0] is not None
    assert store == contract and fast == contract, (name, contract, store, fast)
