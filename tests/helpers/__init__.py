"""Helpers shared by the tests: composing configs and running commands (cli), small gloo
worlds and single-process references (distributed), AshPipe's sequential model (ashpipe_reference)."""
