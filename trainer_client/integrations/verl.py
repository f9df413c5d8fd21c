"""``data.sampler.class_path=pkg://trainer_client.integrations.verl``, the verl 0.5-0.7 config of earlier
releases: the sampler is `rlvr_selector_client.integrations.verl`'s (the client package; see verl_main.py
here for why this module exists)."""

from rlvr_selector_client.integrations.verl import SelectorCurriculumSampler

__all__ = ["SelectorCurriculumSampler"]
