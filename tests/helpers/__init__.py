"""Helpers shared by the tests: composing configs and running commands (cli), small gloo
worlds and single-process references (distributed). AshPipe's sequential model, which
``pipebench stability`` runs too, is harness.strategies.ashpipe.reference."""
