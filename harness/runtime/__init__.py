"""The in-repo pipeline runtime shared by Hippie and AshPipe.

topology  stages, replicas, ranks and the samples each rank owns
partition where to cut the layer list (balanced on measured costs)
actions   per-stage action lists as data, and their replay
schedules the registry of named schedules
executor  runs action lists on one rank over harness.core.comm
stage     a stage's place, layers and gradients; from a pipeline layout (plain data) to this rank's stages
gradients a stage's gradient buckets, their replica all-reduce under backward, and clipping

The runtime never reads a config: strategies hand it a PipelineLayout.
"""
