"""The documentation's examples, taken from the pages themselves, to run in tests."""

from __future__ import annotations

import os
import re
import types

from tests.helpers.cli import ROOT


def code_blocks(page: str, language: str) -> list[str]:
    """The fenced ``language`` blocks of ``docs/<page>``, in order."""
    text = open(os.path.join(ROOT, "docs", page)).read()
    return re.findall(rf"```{language}\n(.*?)```", text, re.S)


def run_block(source: str, name: str) -> types.ModuleType:
    """Execute a block as the body of a module called ``name``; returns the module."""
    module = types.ModuleType(name)
    exec(compile(source, f"docs:{name}", "exec"), module.__dict__)
    return module
