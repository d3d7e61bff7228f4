"""Switch Parallelism's policy: when AshPipe's data-parallel phase hands over to the hybrid pipeline.

After ``strategy.switch_step`` steps, ``strategy.switch_epoch`` epochs or
``strategy.switch_fraction`` of the run, or by a rule: with ``strategy.switch_plateau``
the switch comes at the first step where DP's mean loss over the last
``strategy.switch_window`` steps (default: an epoch) improved by less than that
fraction on the window before it. The record says when and why.
"""

from __future__ import annotations

SWITCH_KEYS = ("switch_step", "switch_epoch", "switch_fraction", "switch_plateau")


def switch_step(spec) -> int | None:
    """Steps of plain data parallelism before the hybrid plan (0: hybrid from the start; None:
    decided during the run by the plateau rule)."""
    st = spec.strategy
    if st.switch_plateau is not None:
        return None
    if st.switch_epoch is not None:
        return st.switch_epoch * spec.steps_per_epoch
    if st.switch_fraction is not None:
        return round(st.switch_fraction * spec.steps)
    return st.switch_step or 0


def switch_window(spec) -> int:
    return spec.strategy.switch_window or spec.steps_per_epoch


def plateau(losses: list[float], window: int, threshold: float) -> str | None:
    """Why to switch now, or None: DP's mean loss over the last ``window`` steps has improved by
    less than ``threshold`` (a fraction) on the ``window`` steps before them. Every rank sees the
    same all-reduced losses, so every rank decides alike."""
    if len(losses) < 2 * window:
        return None
    before = sum(losses[-2 * window : -window]) / window
    last = sum(losses[-window:]) / window
    gain = (before - last) / abs(before) if before else 0.0
    if gain >= threshold:
        return None
    return (
        f"plateau: DP's mean loss over steps {len(losses) - window}-{len(losses) - 1} improved by {100 * gain:.2f}% "
        f"on the {window} steps before ({before:.4f} -> {last:.4f}), under strategy.switch_plateau={threshold}"
    )


def fixed_reason(spec, step: int) -> str:
    st = spec.strategy
    if st.switch_epoch is not None:
        return f"strategy.switch_epoch={st.switch_epoch} ({spec.steps_per_epoch} steps per epoch)"
    if st.switch_fraction is not None:
        return f"strategy.switch_fraction={st.switch_fraction} of {spec.steps} steps"
    return f"strategy.switch_step={step}"
