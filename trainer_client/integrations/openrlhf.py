"""``python -m trainer_client.integrations.openrlhf``, the launch line of earlier releases: runs
`rlvr_selector_client.integrations.openrlhf` (the client package; see verl_main.py here for why this
module exists)."""

from rlvr_selector_client.integrations.openrlhf import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
