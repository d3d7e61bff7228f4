"""Each configuration against the reference (DP) run of the same seed: an accuracy study in the
AshPipe paper's terms (`pipebench results` writes it as ``paired.md`` and ``paired.csv`` where a
sweep has it).

Per seed the target is the reference run's final top-1 minus ``margin`` (one point). For every
configuration, over its seeds: the final top-1; how many runs reached that seed's target, the
first evaluated step at or above it and the training time there (the run's own clock: the
curve's ``elapsed_s``); and, paired by seed with the reference, the difference in final top-1
and the time saved to the target (1 - time / reference's time; the reference reaches its own
target at the latest at its last evaluation). Means with the half-width of their 95% interval
over seeds (Student's t); paired statistics only over the seeds where both sides have a value.

Runs pair with the reference where model, data, global batch, steps, precision, starting
weights (``model.pretrained``) and the optimizer's recipe (``RECIPE``: a sweep over the rate pairs
each rate with DP at that rate) agree (the workers may differ: a 3-stage pipeline pairs with
2-worker DP); where several reference configurations qualify, the one with the fewest workers is
the reference.
"""

from __future__ import annotations

import pandas as pd

from harness.core.vocabulary import REFERENCE_STRATEGY
from harness.report.columns import SUPERSCRIPT, figure_text, shorten
from harness.report.record import config_name, shown
from harness.report.statistics import first_at_target, interval

PAIR_KEYS = ("model", "data", "global_batch", "steps", "precision")
RECIPE = (
    "optimizer",
    "lr",
    "momentum",
    "nesterov",
    "weight_decay",
    "lr_schedule",
    "lr_warmup_steps",
    "lr_min_ratio",
    "lr_decay_steps",
    "lr_decay_factor",
    "label_smoothing",
    "grad_clip_norm",
)  # of train.
MARGIN = 0.01


def _at_target(record: dict, target: float) -> tuple[int | None, float | None]:
    """(step, training seconds) of the first evaluation at or above ``target``, or (None, None)."""
    point = first_at_target({**record, "target_accuracy": target})
    return (point["step"], point.get("elapsed_s")) if point else (None, None)


def _key(record: dict) -> tuple:
    """What a run and its reference share, as (name, value) pairs: PAIR_KEYS, the weights both
    start from where they are not the seed's own (``model.pretrained``), and the recipe."""
    config = record.get("config") or {}
    start = (config.get("model") or {}).get("pretrained")
    train = config.get("train") or {}
    return (
        *((k, record.get(k)) for k in PAIR_KEYS),
        ("pretrained", shown(start) if start else None),
        *((k, train.get(k)) for k in RECIPE),
    )


def _differing(key: tuple, keys: set[tuple]) -> str:
    """What sets ``key`` apart from the other ``keys``: the model, data, ..., ``pretrained=pretrain`` or
    ``lr=0.3``."""
    varying = {name for name, _ in key if len({dict(k).get(name) for k in keys}) > 1}
    return ", ".join(
        str(value) if name in PAIR_KEYS else f"{name}={value}"
        for name, value in key
        if name in varying and value is not None
    )


def against_reference(
    records: list[dict], reference: str = REFERENCE_STRATEGY, margin: float = MARGIN
) -> pd.DataFrame | None:
    """One row per configuration paired with the reference by seed (see the module docstring), or
    None where no configuration has a reference run of the same seed for two seeds or more."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("accuracy_curve") and r.get("accuracy") is not None]
    by_key: dict[tuple, dict[int, dict]] = {}
    for r in sorted((r for r in ok if r["strategy"] == reference), key=lambda r: r["world_size"]):
        by_key.setdefault(_key(r), {}).setdefault(r["seed"], r)  # fewest workers first
    rows: dict[tuple, list[dict]] = {}  # (pairing key, label) -> its runs, in the records' order
    for r in ok:
        key = _key(r)
        ref = by_key.get(key, {}).get(r["seed"])
        if ref is None:
            continue
        label = (key, config_name(r), r["world_size"])
        rows.setdefault(label, [])
        target = ref["accuracy"] - margin
        step, seconds = _at_target(r, target)
        _, ref_seconds = _at_target(ref, target)
        paired = r is not ref  # the reference's own row has nothing to pair
        rows[label].append(
            {
                "seed": r["seed"],
                "top1": r["accuracy"],
                "steps": step,
                "seconds": seconds,
                "delta": r["accuracy"] - ref["accuracy"] if paired else None,
                "saving": 1 - seconds / ref_seconds if paired and seconds is not None and ref_seconds else None,
            }
        )
    if not any(len({p["seed"] for p in pairs}) >= 2 for pairs in rows.values()):
        return None
    keys = {key for key, *_ in rows}  # where several, each row names what sets its pairing apart
    out = []
    for (key, label, workers), pairs in rows.items():
        runs = pd.DataFrame(pairs)
        differs = _differing(key, keys)
        shown = f"{label} [{differs}]" if differs and differs not in label else label
        row = {
            "configuration": shown,
            "workers": workers,
            "seeds": len(runs),
            "reached": f"{runs['steps'].notna().sum()}/{len(runs)}",
        }
        for figure, scale in (("top1", 100), ("delta", 100), ("steps", 1), ("seconds", 1), ("saving", 100)):
            mean, half, _ = interval(runs[figure].astype(float) * scale)
            row[figure], row[f"{figure} ci95"] = mean, half
        out.append(row)
    return pd.DataFrame(out)


_SHOWN = {  # column: (heading, digits)
    "top1": ("top-1 %", 2),
    "delta": ("Δ top-1 vs DP (points, paired)", 2),
    "steps": ("steps to target", 0),
    "seconds": ("s to target", 1),
    "saving": ("time saved vs DP % (paired)", 1),
}


def to_markdown(table: pd.DataFrame, margin: float = MARGIN) -> str:
    """The table with its caption: what the target is and how the figures are paired; a configuration
    too long for a cell abbreviated, in full in a footnote."""
    lines = [
        f"*Against DP by seed: the target is each seed's DP final top-1 minus {margin * 100:g} point(s); "
        "steps and seconds to target over the runs that reached it (the run's own training clock); paired "
        "figures over the seeds where both reached it; mean ± half-width of the 95% interval over seeds.*",
        "",
        "| configuration | workers | seeds | reached | " + " | ".join(h for h, _ in _SHOWN.values()) + " |",
        "|:--|--:|--:|--:|" + "--:|" * len(_SHOWN),
    ]
    notes: list[str] = []
    for _, row in table.iterrows():
        label = shorten(row["configuration"])
        if label != row["configuration"]:
            notes.append(row["configuration"])
            label += str(len(notes)).translate(SUPERSCRIPT)
        cells = [figure_text(row[k], row[f"{k} ci95"], d) for k, (_, d) in _SHOWN.items()]
        lines.append(f"| {label} | {row['workers']} | {row['seeds']} | {row['reached']} | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", *(f"{str(n).translate(SUPERSCRIPT)} {text}  " for n, text in enumerate(notes, 1))]
    return "\n".join(lines).rstrip()
