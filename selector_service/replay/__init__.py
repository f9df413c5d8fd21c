"""`selector-service replay LOG`: a past run's per-prompt outcomes replayed through the service.

- `logs`: reading a run's log (JSONL or parquet rows, verl's rollout dump, a per-epoch accuracy file) into
  one group per (step, prompt), with errors that name the line or row.
- `protocol`: the epochs of a run, the arms (what picks a batch) and the replay loop that gives each arm
  only the outcomes of its picks; the latest-outcome filter, the one arm the replay runs itself.
- `service`: an arm that is a configuration of the service (a strategy, its parameters, a select's
  filter, the profile uploaded or not), driven over REST with the typed client against a service
  started on its embedded store in a temporary folder.
- `arms`: every arm the replay reports, by name, each defined once (the baselines, the filters, each
  strategy with and without the profile and the filter).
- `command`: the command line, the table, the plot and the JSON summary.

The protocol and how to read the result: docs/replay.md.
"""
