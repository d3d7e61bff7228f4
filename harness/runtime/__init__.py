"""The in-repo pipeline runtime shared by Hippie and AshPipe.

topology  stages, replicas, ranks and the samples each rank owns
partition where to cut the layer list (measured costs or explicit boundaries)
schedule  per-stage action lists as data, and a simulator for them
executor  runs action lists on one rank over harness.comm
"""
