"""Training strategies: the contract every strategy implements, and our two methods.

base    the Strategy class (the one plug-in point) and its config keys
layout  the pipeline layout rules every pipeline strategy shares (partition, recomputation)
hippie  Hippie on our runtime
ashpipe AshPipe on our runtime (planner in the job, Switch Parallelism)

The baselines (``baselines/``) implement the same contract with other libraries.
"""
