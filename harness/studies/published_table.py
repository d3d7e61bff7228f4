"""The published-table comparison of ``pipebench validate``: the Zero Bubble paper's A100 table
(harness.planning.published) against the simulator's roofline prediction of it, with its verdict
(every figure within 25%, every ratio of two schedules of one configuration within 10%) and its
tables (``published.{csv,json,md}``).
"""

from __future__ import annotations

import datetime
import itertools
import json
import os
from typing import Callable

import pandas as pd

from harness.planning import published

PUBLISHED_TARGET, PUBLISHED_RATIO_TARGET = 0.25, 0.10  # a published table: each figure, each ratio of two schedules


def published_verdict(rows: pd.DataFrame) -> dict:
    """The targets of a published table: every prediction within 25% of its published figure, and
    the ratio between any two schedules of one configuration within 10% of the published ratio."""
    pairs = []
    for _, group in rows.groupby(["model", "micro_batches"], sort=False):
        for (_, a), (_, b) in itertools.combinations(group.iterrows(), 2):
            error = (a["predicted"] / b["predicted"]) / (a["published"] / b["published"]) - 1
            pairs.append(
                {
                    "model": a["model"],
                    "micro_batches": a["micro_batches"],
                    "pair": f"{a['schedule']} / {b['schedule']}",
                    "ratio error": error,
                }
            )
    pairs = pd.DataFrame(pairs)
    within = lambda values, bound: int((values.abs() <= bound).sum())  # noqa: E731
    return {
        "predictions": len(rows),
        "within 25%": within(rows["error"], PUBLISHED_TARGET),
        "mean signed error": float(rows["error"].mean()),
        "ratios": len(pairs),
        "ratios within 10%": within(pairs["ratio error"], PUBLISHED_RATIO_TARGET),
        "largest ratio error": pairs.loc[pairs["ratio error"].abs().idxmax()].to_dict(),
        "targets met": bool(
            (rows["error"].abs() <= PUBLISHED_TARGET).all()
            and (pairs["ratio error"].abs() <= PUBLISHED_RATIO_TARGET).all()
        ),
    }


def write_published(out: str, log: Callable[[str], None] = print) -> str:
    """published.{csv,json,md}: the Zero Bubble paper's A100 table against the simulator's prediction
    of it (harness.planning.published), with its verdict; ``log`` gets a line per prediction it makes."""
    rows, fraction = published.comparison(progress=lambda what: log(f"  predicting {what}"))
    result = published_verdict(rows)
    os.makedirs(out, exist_ok=True)
    rows.to_csv(os.path.join(out, "published.csv"), index=False)
    with open(os.path.join(out, "published.json"), "w") as f:
        json.dump(
            {
                "date": datetime.date.today().isoformat(),
                "source": published.SOURCE,
                "fitted_fraction": fraction,
                "fitted_on": list(published.FIT_ON),
                **result,
            },
            f,
            indent=1,
            default=str,
        )
    worst = result["largest ratio error"]
    head = (
        f"{published.SOURCE}, predicted {datetime.date.today().isoformat()} by the roofline model of an "
        f"{published.GPU_NAME} at {fraction:.1%} of its bf16 datasheet, the fraction fitted on "
        f"{' '.join(map(str, published.FIT_ON))} alone: {result['within 25%']} of {result['predictions']} "
        f"predictions within 25% (mean signed error {result['mean signed error']:+.1%}), "
        f"{result['ratios within 10%']} of {result['ratios']} ratios between two schedules of one configuration "
        f"within 10% (largest: {worst['pair']} at {worst['model']} m={worst['micro_batches']}, "
        f"{worst['ratio error']:+.1%}); targets {'met' if result['targets met'] else 'not met'}."
    )
    shown = rows.assign(
        error=rows["error"].map("{:+.1%}".format),
        ratio_error=rows["ratio_error"].map("{:+.1%}".format),
        fitted=rows["fitted"].map({True: "fitted", False: ""}),
    )
    shown.columns = [
        "model",
        "GPUs",
        "m",
        "schedule",
        "published samples/GPU/s",
        "predicted",
        "error",
        "published / 1F1B",
        "predicted / 1F1B",
        "ratio error",
        "",
    ]
    text = head + "\n\n" + shown.to_markdown(index=False, floatfmt=".3g")
    with open(os.path.join(out, "published.md"), "w") as f:
        f.write(text + "\n")
    return text
