"""How repeated runs are summarised, shared by the tables and the figures."""

from __future__ import annotations

import math

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


def mlperf_times(values: pd.Series) -> pd.Series:
    """Times to target as MLPerf training scores them: of five runs, the fastest and the slowest are dropped."""
    values = values.astype(float).dropna().sort_values()
    return values.iloc[1:-1] if len(values) == 5 else values


def steps_to_target(record: dict) -> int | None:
    """The first evaluated step at which the run's test accuracy reached its ``target_accuracy``
    (None: it never did), a count that does not depend on the machine's speed."""
    target = record.get("target_accuracy")
    if target is None:
        return None
    for point in record.get("accuracy_curve") or []:
        if point.get("accuracy") is not None and point["accuracy"] >= target:
            return point["step"]
    return None
