"""`selector-service replay LOG`: a past run's per-prompt outcomes replayed through the service.

- `logs`: reading a run's log (JSONL or parquet rows, verl's rollout dump, a per-epoch accuracy file) into
  one group per (step, prompt), with errors that name the line or row.
- `protocol`: the epochs of a run, the arms (what picks a batch) and the replay loop that gives each arm
  only the outcomes of its picks; the filter arms live here.
- `service`: the arms that are the service's strategies, driven over REST with the typed client against
  a service started on its embedded store in a temporary folder.
- `command`: the command line, the table, the plot and the JSON summary.

The protocol and how to read the result: docs/replay.md.
"""
