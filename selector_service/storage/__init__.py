"""The belief store (Redis or Valkey): the key layout, the log and its Lua scripts (store.py), and the
snapshots that let the log be trimmed (snapshot.py)."""
