"""What a run leaves behind and what is made of it: records, tables, figures, traces, wandb.

record     one metrics.json per run, written atomically (the source of truth)
columns    every table column, declared once, and the named column sets
tables     comparison tables (Markdown, CSV, LaTeX) with speedup and ME against DP
against    two sweeps compared: each figure's ratio per matching configuration
figures    the paper's figures (matplotlib, PDF and PNG), one style per configuration
traces     a run's step as a Chrome trace for Perfetto
wandb_run  a job's live wandb run (never the source of truth: its failures never touch the record)
"""
