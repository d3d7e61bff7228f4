"""How repeated runs are summarised, shared by the tables and the figures."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
from scipy import stats


def interval(values: pd.Series, confidence: float = 0.95) -> tuple[float, float, int]:
    """(mean, half-width of its ``confidence`` interval from Student's t, count); no interval for one value."""
    values = values.astype(float).dropna()
    n = len(values)
    if n == 0:
        return float("nan"), float("nan"), 0
    if n == 1:
        return float(values.iloc[0]), float("nan"), 1
    half = stats.t.ppf((1 + confidence) / 2, n - 1) * values.std(ddof=1) / math.sqrt(n)
    return float(values.mean()), float(half), n


def intervals(values: np.ndarray, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """:func:`interval` of each row of ``values`` (NaN: missing) at once, for curves of thousands
    of points: the means, and the half-widths (0 where a row has one value)."""
    n = np.sum(~np.isnan(values), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a row of one value has no spread
        means = np.nanmean(values, axis=1)
        spread = np.nanstd(values, axis=1, ddof=1)
        half = stats.t.ppf((1 + confidence) / 2, np.maximum(n - 1, 1)) * spread / np.sqrt(n)
    return means, np.where(n > 1, half, 0.0)


def mlperf_times(values: pd.Series) -> pd.Series:
    """Times to target as MLPerf training scores them: of five runs, the fastest and the slowest are dropped."""
    values = values.astype(float).dropna().sort_values()
    return values.iloc[1:-1] if len(values) == 5 else values


def first_at_target(record: dict) -> dict | None:
    """The first evaluation at which the run's test accuracy reached its ``target_accuracy``
    (None: it never did)."""
    target = record.get("target_accuracy")
    if target is None:
        return None
    return next(
        (p for p in record.get("accuracy_curve") or [] if p.get("accuracy") is not None and p["accuracy"] >= target),
        None,
    )


def steps_to_target(record: dict) -> int | None:
    """The step of :func:`first_at_target`, a count that does not depend on the machine's speed."""
    point = first_at_target(record)
    return point["step"] if point else None


def retargeted(records: list[dict], target: float) -> list[dict]:
    """The records with time to target read from their curves for another target accuracy (the
    training time at the first evaluation at or above it, as the run itself measures it)."""
    out = []
    for r in records:
        r = {**r, "target_accuracy": target}
        if r.get("accuracy_curve"):
            point = first_at_target(r)
            r["time_to_target_s"] = point.get("elapsed_s") if point else None
        out.append(r)
    return out
