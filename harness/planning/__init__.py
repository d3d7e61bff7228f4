"""Deciding and predicting from measurements: AshPipe's planner, profiles, the simulator.

planner    stage boundaries and replicas per stage from a profile (pure)
profiling  measuring layer profiles, whole steps and the network
simulator  replaying the runtime's action lists with a profile's costs on a cluster
"""
