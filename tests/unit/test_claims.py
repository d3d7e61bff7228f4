"""Every number a study page quotes is recomputed from the study's records (docs/claims.yaml)."""

from __future__ import annotations

import functools
import math
import os
import re

import pytest
import yaml

from harness.report import columns
from harness.report.tables import _shown, build, load_records
from tests.helpers.cli import ROOT

CLAIMS = os.path.join(ROOT, "docs", "claims.yaml")
# a number of the prose: a decimal, or a whole number before a percent sign or an x
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:%|x\b)|(?<![\w.])\d+\.\d+")


def _pages() -> dict:
    with open(CLAIMS) as f:
        return yaml.safe_load(f)


@functools.cache
def _cells(study: str) -> list[dict]:
    """Each row of the study's table (every column, today's code, its records) as label -> text."""
    table = build(load_records([os.path.join(ROOT, "results", study)]), "all")
    return [
        {"section": table.rows.at[i, "_section"], **{c.label: _shown(table, i, c) for c in table.shown}}
        for i in table.rows.index
    ]


def _cell(study: str, spec: dict) -> str:
    where = {k: str(v) for k, v in spec.items() if k != "column"}
    found = [row for row in _cells(study) if all(row.get(k) == v for k, v in where.items())]
    assert len(found) == 1, f"{study}: {len(found)} rows match {where}"
    return found[0][spec["column"]]


def _prose(page: str) -> str:
    """The page without code blocks and tables, its lines joined."""
    with open(os.path.join(ROOT, "docs", page)) as f:
        text = re.sub(r"```.*?```", " ", f.read(), flags=re.S)
    return " ".join(" ".join(line.split()) for line in text.splitlines() if not line.lstrip().startswith("|"))


def _claims():
    return [
        pytest.param(page, i, id=f"{page}:{i}") for page, spec in _pages().items() for i in range(len(spec["claims"]))
    ]


@pytest.mark.parametrize("page,index", _claims())
def test_each_quoted_number_is_what_its_study_s_records_give(page, index):
    spec = _pages()[page]
    claim = spec["claims"][index]
    assert claim["quote"] in _prose(page), f"{page} no longer says {claim['quote']!r}"
    study = claim.get("study", spec["study"])
    texts = {name: _cell(study, cell) for name, cell in claim["cells"].items()}
    if "show" not in claim:
        missing = [f"{n}={t}" for n, t in texts.items() if t not in claim["quote"]]
        assert not missing, f"{page}: {claim['quote']!r} does not show {', '.join(missing)}"
        return
    values = {name: float(text.split(" ± ")[0]) for name, text in texts.items()}
    # the values as globals: a generator in the f-string sees them there
    scope = {"min": min, "max": max, "abs": abs, "ceil": math.ceil, **values}
    shown = eval("f" + repr(" ".join(claim["show"].split())), scope)
    assert shown == claim["quote"], f"{page}: the records give {shown!r}, the page says {claim['quote']!r}"


@pytest.mark.parametrize("page", list(_pages()))
def test_a_claimed_page_quotes_no_number_the_claims_do_not_cover(page):
    spec = _pages()[page]
    prose = _prose(page)
    covered = [
        m.span()
        for q in [c["quote"] for c in spec["claims"]] + spec.get("plain", [])
        for m in re.finditer(re.escape(q), prose)
    ]
    loose = [m.group() for m in NUMBER.finditer(prose) if not any(a <= m.start() and m.end() <= b for a, b in covered)]
    assert not loose, f"{page} quotes numbers no claim recomputes: {loose}"


def test_every_column_a_claim_names_exists():
    labels = {c.label for c in columns.COLUMNS} | {"section"}
    for page, spec in _pages().items():
        for claim in spec["claims"]:
            for cell in claim["cells"].values():
                assert set(cell) - {"column"} <= labels and cell["column"] in labels, (page, cell)
