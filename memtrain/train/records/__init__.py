"""The run directory's records, which outlive the run: the job and its history (record.py: job.json,
history.jsonl), the directory itself (run_dir.py), lineage.jsonl (lineage.py), the logbook that writes lineage
and metric lines up to the ledger (logbook.py), checkpoints and the position they resume from (checkpoint.py,
state.py), metrics and task statistics (metrics.py), the counters people see (counters.py). Written by the
server; a worker writes only its tasks' statistics (metrics.py)."""
