"""``python -m trainer_client.integrations.verl_main``, the launch line of earlier releases: runs
`rlvr_selector_client.integrations.verl_main` (the client package, which a trainer's environment installs
alone: ``pip install rlvr-selector-client``).

This folder has no ``__init__.py`` on purpose (a namespace package): it keeps, for launch lines and
config strings written against earlier releases, only the module paths that a framework or ``python -m``
loads by name; the adapters themselves are the client package's.
"""

from rlvr_selector_client.integrations.verl_main import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
