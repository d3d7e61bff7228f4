"""Benchmarking harness for hybrid pipeline-parallel training (AshPipe, Hippie and their peers).

``pipebench`` (``python -m harness``) is its one command, with verbs (harness.commands). The
sub-packages follow the data flow, each importing only those below it: commands -> cli,
studies -> run -> config -> strategies -> planning -> metrics -> runtime -> report -> core.
docs/index.md draws it; pyproject.toml's import-linter contracts enforce it.
"""
