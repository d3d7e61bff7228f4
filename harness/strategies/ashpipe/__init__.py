"""AshPipe (Hosoki et al., HPC Asia 2024) on our runtime, one module per concern.

strategy              the strategy: asynchronous 1F1B, weight stashing, non-uniform replicas, the planner
                      in the job, staleness mitigations
switch                Switch Parallelism's policy: when the data-parallel phase hands over
data_parallel_phase   the data-parallel phase (the DP baseline's own training, plus the job's loss)
checkpoints           the switch checkpoint, and the layout a resumed run rebuilds

The planner's inputs in a job are :mod:`harness.planning.in_job`; the planner itself
:mod:`harness.planning.planner`.
"""

from harness.strategies.ashpipe.strategy import AshPipeConfig, AshPipeStrategy

__all__ = ["AshPipeConfig", "AshPipeStrategy"]
