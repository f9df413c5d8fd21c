"""slime's ``--data-source-path trainer_client.integrations.slime.SelectorDataSource`` and
``--rollout-all-samples-process-path trainer_client.integrations.slime.report_all_samples`` of earlier
releases: both are `rlvr_selector_client.integrations.slime`'s (the client package; see verl_main.py here
for why this module exists)."""

from rlvr_selector_client.integrations.slime import SelectorDataSource, report_all_samples

__all__ = ["SelectorDataSource", "report_all_samples"]
