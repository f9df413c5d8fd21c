"""Many processes serving the same datasets from one store: the engine each request calls (engine.py),
each process's copy of a dataset kept up with the log (replica.py), requests checked and packed into log
records (payloads.py), export and import (backup.py), and what a held dataset costs in memory
(memory.py)."""
