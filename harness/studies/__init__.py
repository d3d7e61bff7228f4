"""Studies: a matrix of configurations, each run as a user runs it, repeats interleaved; what each
declares (its configurations), judges (its verdict) and summarises (its tables). A command of
harness.commands parses a study's options and prints what it returns; the study is here.

driver           runs one command with a deadline and reads its record through the record module;
                 runs a matrix round after round; writes a study's Markdown and JSON
options          the options the study commands share (--out, --repeats, --steps, ...), one
                 definition each, and their one-line refusals
bench            ``pipebench bench``: our runtime against its peers, ratios and where the time goes
soak             ``pipebench soak``: every strategy family round after round, and interrupted
validation       ``pipebench validate``: its budgets and repeats, and the matrix of configurations
                 each profiled with its own settings
changed_config   the simulator on configurations it did not profile (``pipebench validate``)
published_table  a published GPU table against the simulator's prediction (``pipebench validate``)
sensitivity      ``pipebench sensitivity``: which assumption decides the papers'-regime speedups
stability        ``pipebench stability``: a job through AshPipe's single-process reference
gpucheck         ``pipebench gpucheck``: every path one GPU can run, one verdict per check
"""
