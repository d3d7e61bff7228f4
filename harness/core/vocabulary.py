"""The names the measurement and the report share, declared once: the parts of a step's idle time,
the parts of a rank's peak memory, the strategy every comparison is against, the strategies that
take no micro-batches, and how a schedule's action is labelled.

The meter and the idle breakdown (:mod:`harness.metrics`) write these keys into a record; the
schema, the table columns, the figures and the traces (:mod:`harness.report`) read them from here,
so a part added or renamed here is one change everywhere. ``tests/unit/test_vocabulary.py`` fails
where another module lists them again.
"""

from __future__ import annotations

import re
from typing import NamedTuple


class Part(NamedTuple):
    key: str  # the record's key
    name: str  # what people read in figures and traces
    short: str  # a table's header, before its unit


# where a device's step goes (harness.metrics.idle), in the order of the record, the columns and the
# figures; they add up to the step
IDLE = (
    Part("compute", "compute", "compute"),
    Part("peer_wait", "peer wait", "peer wait"),
    Part("collective", "collective", "collective"),
    Part("exposed_comm", "exposed communication", "exposed comm"),
    Part("host", "host", "host"),
)

# what holds a rank's peak memory (harness.metrics.meter), bottom to top in a figure's bars; "other"
# is what no part claims: activations kept for the backward, and the rest of the step's temporaries
MEMORY = (
    Part("parameters", "parameters", "params"),
    Part("gradients", "gradients", "grads"),
    Part("optimizer_state", "optimizer state", "optim"),
    Part("stashed_weights", "stashed weights", "stashed"),
    Part("other", "activations and other", "activations+"),
)
OTHER_MEMORY = "other"  # the remainder: the peak less every measured part

IDLE_PARTS = tuple(p.key for p in IDLE)
IDLE_NAMES = {p.key: p.name for p in IDLE}
MEMORY_PARTS = tuple(p.key for p in MEMORY)
MEMORY_NAMES = {p.key: p.name for p in MEMORY}
MEASURED_MEMORY_PARTS = tuple(k for k in MEMORY_PARTS if k != OTHER_MEMORY)  # what the meter sizes itself

# speedup, ME and the paired accuracy comparison are against this strategy's runs (data parallelism)
REFERENCE_STRATEGY = "dp"

# the strategies that move whole minibatches: train.micro_batches does not apply to them (the run
# records 1 and a table leaves their micro-batches blank); every other strategy takes micro-batches
WHOLE_MINIBATCH_STRATEGIES = frozenset({REFERENCE_STRATEGY, "ashpipe"})


def memory_field(part: str) -> str:
    """A memory part's field in the comparison frame, and its table column's key: ``memory_other``."""
    return f"memory_{part}"


def idle_field(part: str) -> str:
    """An idle part's field in the comparison frame, and its table column's key: ``idle_host``."""
    return f"idle_{part}"


# a schedule action's label as the runtime records it (harness.runtime.actions.Action) and a
# profiled step's spans: [stage]OP[micro-batch][*], e.g. F3, 1B0*, 2SEND_F1, STEP; the stage only
# on a rank that drives several, * on a backward that launches the gradient all-reduce, GPU a
# device's kernels. The timelines and the traces read every label through it.
ACTION_OPS = ("RECV_F", "RECV_B", "SEND_F", "SEND_B", "STEP", "GPU", "F", "B", "I", "W")
ACTION_LABEL = re.compile(rf"^(\d*)({'|'.join(ACTION_OPS)})(\d*)(\*?)$")
