"""Benchmarking harness for hybrid pipeline-parallel training (AshPipe, Hippie and baselines)."""
