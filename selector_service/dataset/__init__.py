"""One dataset in memory: its spec and beliefs, and the log records that move them (state.py), and the
history of its closed steps (history.py). Pure: no store, no network, so every replica that applies the
same records holds the same bits."""
