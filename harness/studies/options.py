"""The options the study commands share, each declared in one place with one type: where a study
writes (``--out``), how many times each configuration runs (``--repeats``; soak's ``--rounds``),
training steps per run (``--steps``), a run's deadline (``--deadline``) and the seed of a random
draw (``--seed``); a timestamped folder for a study's default ``--out``; and a refusal, one
``error:`` line on the standard error and exit status 2, before anything runs.

Each command gives its own defaults and help, in the order its help lists them
(``add_options(parser, repeats=(3, None), steps=(16, "steps per run"))``), and adds the options
only it has with argparse itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

TYPES = {"out": str, "repeats": int, "rounds": int, "steps": int, "deadline": float, "seed": int}


def add_options(parser: argparse.ArgumentParser, **options: tuple[object, str | None]) -> None:
    """``--<name>`` for each of ``options`` (``name=(default, help)``, help None for none), in the
    order given, typed as every study command types it (:data:`TYPES`)."""
    for name, (default, text) in options.items():
        parser.add_argument(f"--{name}", type=TYPES[name], default=default, help=text)


def stamped(study: str) -> str:
    """``outputs/<study>/<date>_<time>``: a study's folder when ``--out`` names none, one per invocation."""
    return os.path.join("outputs", study, time.strftime("%Y-%m-%d_%H-%M-%S"))


def refuse(message: str) -> int:
    """``error: <message>`` on the standard error; the exit status of a refused invocation (2)."""
    print(f"error: {message}", file=sys.stderr)
    return 2


def say(line: str) -> None:
    """A study's progress line, printed as it happens (a study's runs take minutes)."""
    print(line, flush=True)
