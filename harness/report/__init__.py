"""What a run leaves behind and what is made of it: records, tables, figures, the wandb mirror.

record        one metrics.json per run, written atomically (the source of truth)
tables        comparison tables with speedup and ME against DP
figures       throughput, memory, curves and per-rank timelines (matplotlib)
wandb_mirror  a record as a wandb run (a mirror; its failures never touch the record)
"""
