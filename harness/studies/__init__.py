"""Studies: a matrix of configurations, each run as a user runs it, repeats interleaved.

driver  runs one command with a deadline and reads its record through the record module;
        runs a matrix round after round; writes a study's Markdown and JSON

The studies themselves are commands (``pipebench bench``, ``soak``, ``validate``,
``sensitivity``); each declares its configurations and what it summarises.
"""
