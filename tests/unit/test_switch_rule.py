"""Switch Parallelism's switch point: a fixed step or epoch, a fraction of the run, or the plateau rule."""

import pytest

from harness.core.errors import ConfigError
from harness.strategies.ashpipe.switch import plateau, switch_step
from tests.helpers.cli import make_spec

ASH = [
    "strategy=ashpipe",
    "world_size=2",
    "strategy.replicas=[1,1]",
    "strategy.boundaries=[3]",
    "train.global_batch=16",
    "data.train_size=64",
    "train.steps=20",
]


def test_the_plateau_rule_fires_when_the_last_windows_mean_improved_by_less_than_the_threshold():
    falling = [4.0, 3.0, 2.0, 1.5]
    assert plateau(falling[:3], 2, 0.1) is None  # two windows of 2 steps are not there yet
    assert plateau(falling, 2, 0.1) is None  # (3.5 -> 1.75): improved by 50%
    flat = [4.0, 3.9, 3.88, 3.86]
    why = plateau(flat, 2, 0.05)  # (3.95 -> 3.87): 2.03%
    assert why is not None and "2.03%" in why and "3.9500 -> 3.8700" in why and "switch_plateau=0.05" in why
    assert plateau([3.0, 3.1], 1, 0.0) is not None  # a loss that rises has not improved


@pytest.mark.parametrize(
    "extra,expected",
    [
        (["strategy.switch_step=7"], 7),
        (["strategy.switch_epoch=1"], 4),
        (["strategy.switch_fraction=0.25"], 5),
        ([], 0),
        (["strategy.switch_plateau=0.01"], None),
    ],
)
def test_each_way_of_naming_the_switch_gives_its_step(extra, expected):
    assert switch_step(make_spec(*ASH, *extra)) == expected  # 64 samples of 16: 4 steps an epoch


@pytest.mark.parametrize(
    "extra,refusal",
    [
        (["strategy.switch_step=3", "strategy.switch_fraction=0.5"], "both say when to switch; give one"),
        (["strategy.switch_epoch=1", "strategy.switch_plateau=0.1"], "both say when to switch; give one"),
        (["strategy.switch_window=3"], "strategy.switch_window=3 applies with strategy.switch_plateau only"),
        (["strategy.switch_fraction=1.5"], "strategy.switch_fraction=1.5 must be"),
        (["strategy.weight_prediction=true", "train.optimizer=sgd", "train.momentum=0"], "train.momentum=0 has none"),
        (["strategy.lr_correction_steps=5"], "applies with strategy.lr_correction=true only"),
    ],
)
def test_contradictory_or_stray_switch_keys_are_refused_in_one_line(extra, refusal):
    with pytest.raises(ConfigError) as e:
        make_spec(*ASH, *extra)
    assert refusal in str(e.value) and "\n" not in str(e.value)
