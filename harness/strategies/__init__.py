"""Training strategies: the contract every strategy implements, and our two methods.

base           the Strategy class (the one plug-in point) and its config keys
layout         the pipeline layout rules every pipeline strategy shares (partition, recomputation)
pipeline       our runtime's stage on a rank, assembled one way for Hippie and AshPipe
data_parallel  data parallelism with torch's DDP (the DP baseline and AshPipe's first phase)
hippie         Hippie on our runtime
ashpipe/       AshPipe on our runtime (planner in the job, Switch Parallelism), one module per concern

The baselines (``baselines/``) implement the same contract with other libraries.
"""
