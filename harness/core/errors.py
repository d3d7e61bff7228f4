"""Errors the harness reports to the user as one line, without a traceback."""

from __future__ import annotations

import signal


class ConfigError(ValueError):
    """A run that cannot start: the message says what is wrong and how to fix it."""


class Interrupted(BaseException):
    """The command was asked to stop (SIGINT, as Ctrl-C sends it, or SIGTERM). A BaseException, as
    KeyboardInterrupt is, so that no ``except Exception`` on the way (Hydra's own included) takes
    it for a failure: it ends the run (recorded as failed, with the signal's name), a sweep, and the
    command, which exits with 128 + the signal's number."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message or f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum
