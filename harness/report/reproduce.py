"""Whether a committed study is what today's code makes from its records.

:func:`differences` writes a study's tables and figures from its records into a scratch folder,
as ``pipebench results DIR --out DIR`` writes them, and compares them with the committed ones:
tables as text, figures through the data each draws (the ``.figure.json`` beside each PNG,
:mod:`harness.report.figure_data`), never pixels. It also names records holding an impossible
figure and a study run from an uncommitted tree or from several commits
(:mod:`harness.report.checks`). ``pipebench results DIR --check`` prints what it finds.
"""

from __future__ import annotations

import filecmp
import json
import os
import tempfile

from harness.report.checks import impossible, provenance
from harness.report.figure_data import SUFFIX
from harness.report.figures import data_only
from harness.report.tables import load_raw, write_outputs

# what `results --out` writes beside the figures, compared as text where the study has it
_TABLES = ("results.md", "results.csv", "results.tex", "paired.md", "paired.csv")


def _figure_data(folder: str) -> dict[str, str]:
    """Each figure's name and the path of what it draws."""
    return {n[: -len(SUFFIX)]: os.path.join(folder, n) for n in sorted(os.listdir(folder)) if n.endswith(SUFFIX)}


def _figure_differences(committed: str, made: str) -> list[str]:
    if not os.path.isdir(made) and not os.path.isdir(committed):
        return []
    old = _figure_data(committed) if os.path.isdir(committed) else {}
    new = _figure_data(made) if os.path.isdir(made) else {}
    out = [f"figure {n} is committed but today's code does not draw it" for n in old if n not in new]
    out += [f"figure {n} is drawn by today's code but not committed" for n in new if n not in old]
    for name in sorted(set(old) & set(new)):
        with open(old[name]) as a, open(new[name]) as b:
            before, after = json.load(a), json.load(b)
        if before != after:
            keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            out.append(f"figure {name} draws other data than committed ({', '.join(keys)} differ)")
    pngs = {n[:-4] for n in os.listdir(committed) if n.endswith(".png")} if os.path.isdir(committed) else set()
    out += [f"figure {n} has no data file beside it (regenerate the study)" for n in sorted(pngs - set(old))]
    return out


def differences(study: str) -> list[str]:
    """One line per way the committed study ``study`` (a folder with ``results.md``) is not what
    today's code makes from its records; an empty list: it is."""
    records = load_raw([study])
    out = [f"{r.get('path', 'a record')}: {e}" for r in records for e in impossible(r)]
    out += provenance(records)
    name = os.path.basename(os.path.normpath(study))
    with tempfile.TemporaryDirectory() as scratch:
        made = os.path.join(scratch, name)  # the LaTeX label is the folder's name
        with data_only():  # the figures' data, not their pixels
            out += write_outputs(records, made)[2]  # the figures that break the contract
        for table in _TABLES:
            here, there = os.path.join(study, table), os.path.join(made, table)
            if os.path.exists(here) != os.path.exists(there):
                out.append(
                    f"{table} is committed but today's code does not write it"
                    if os.path.exists(here)
                    else f"today's code writes {table}, which is not committed"
                )
            elif os.path.exists(here) and not filecmp.cmp(here, there, shallow=False):
                out.append(f"{table} differs from what today's code writes from the records")
        out += _figure_differences(os.path.join(study, "figures"), os.path.join(made, "figures"))
    return out
