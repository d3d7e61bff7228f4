"""Errors the harness reports to the user as one line, without a traceback."""


class ConfigError(ValueError):
    """A run that cannot start: the message says what is wrong and how to fix it."""
