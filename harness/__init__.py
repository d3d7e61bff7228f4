"""Benchmarking harness for hybrid pipeline-parallel training (AshPipe, Hippie and baselines).

The top of the package holds the commands, one module each (``python -m harness``,
``harness.plan``, ``harness.preview``, ``harness.profile``, ``harness.simulate``, ``harness.validate``,
``harness.results``); the sub-packages follow the data flow, each importing only
those below it: cli -> run -> config -> strategies -> planning -> runtime -> report
-> the shared base (comm, data, models, metrics, training, host, errors). The
README's Layout section draws it; pyproject.toml's import-linter contracts enforce it.
"""
