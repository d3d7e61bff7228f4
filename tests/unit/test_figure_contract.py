"""The contract every figure meets where it is saved (harness.report.figure_data), read through
the data each figure writes beside itself, on the action lists our runtime really runs."""

from __future__ import annotations

import json
import os

import matplotlib.pyplot as plt
import pytest

from harness.report import figure_data, figures
from harness.runtime import schedules

# every schedule our runtime runs, each on 2 ranks at 4 micro-batches
FAMILIES = schedules.names(ours=True)


def _record(schedule: str) -> dict:
    """A Hippie record whose ranks' events are the schedule's own action lists, a millisecond each."""
    kind = schedules.get(schedule)
    v = kind.default_stages_per_rank
    per_rank = []
    for rank, actions in enumerate(kind.lists(2, v, 4)):
        events = [[str(a), 1.0 + i * 1e-3, 1.0 + (i + 0.9) * 1e-3] for i, a in enumerate(actions)]
        layout = {"stage": rank, "stages": kind.stages_of(2, v, rank)}
        per_rank.append({"rank": rank, "layout": layout, "events": events})
    return {
        "status": "ok",
        "strategy": "hippie",
        "model": "vit_micro",
        "data": "synthetic",
        "world_size": 2,
        "variant": schedule,
        "config": {"strategy": {"name": "hippie", "schedule": schedule, "stages_per_rank": v}},
        "per_rank": per_rank,
    }


@pytest.fixture(autouse=True)
def data_only():
    """What each figure draws is what these tests read: no PNG or PDF is written (test_results
    checks that they are)."""
    with figures.data_only():
        yield


def _drawn(path_stem: str) -> dict:
    return json.load(open(path_stem + ".figure.json"))


@pytest.mark.parametrize("schedule", FAMILIES)
def test_a_timeline_gives_every_action_kind_of_the_schedule_its_own_colour_and_legend_entry(schedule, tmp_path):
    record = _record(schedule)
    paths = figures.timeline(record, str(tmp_path), name="t")
    assert {os.path.basename(p) for p in paths} == {"t.figure.json"}
    drawn = _drawn(str(tmp_path / "t"))
    kind = schedules.get(schedule)
    kinds = {a.op.split("_")[0] for acts in kind.lists(2, kind.default_stages_per_rank, 4) for a in acts}
    legend = {e["label"]: e["colour"] for e in drawn["legend"]}
    assert len(legend) == len(kinds) >= 4, (legend, kinds)  # forward, backward, send, receive at least
    assert len(set(legend.values())) == len(legend)  # one colour per kind
    (panel,) = drawn["panels"]
    assert set(panel["bar_colours"]) == set(legend.values())  # every colour drawn is explained
    assert sum(panel["bar_colours"].values()) == sum(len(r["events"]) for r in record["per_rank"])


def test_a_label_that_names_no_action_is_refused_not_drawn_as_another_kind(tmp_path):
    record = _record("1f1b")
    record["per_rank"][0]["events"][0][0] = "OPTIMIZE"
    with pytest.raises(ValueError, match="'OPTIMIZE', which names no schedule action"):
        figures.timeline(record, str(tmp_path))


def test_a_broken_colour_map_is_refused_naming_the_figure(tmp_path, monkeypatch):
    # the send drawn in the forward's colour: two legend entries a reader cannot tell apart
    monkeypatch.setitem(figures._KINDS, "SEND", (figures._KINDS["F"][0], "send"))
    with pytest.raises(figure_data.FigureContractError, match="figure timeline_hippie.*look the same"):
        figures.timeline(_record("zbv"), str(tmp_path))
    assert not list(tmp_path.iterdir())  # nothing written


def _figure(title: str = "vit_micro on synthetic", legend_columns: int = 1, unexplained: bool = False, xs=(1, 2)):
    fig, ax = plt.subplots(figsize=(3.5, 2))
    for i in range(8):
        ax.barh(i, 1, color=f"C{i}", label=f"a configuration with a long name {i}")
    if unexplained:
        ax.barh(8, 1, color="#123456")
    ax.plot(xs, [1] * len(xs), color="k", label="a line")
    ax.set_title(title)
    fig.legend(ncol=legend_columns)
    return fig


@pytest.mark.parametrize(
    "make,refusal",
    [
        (lambda: _figure(legend_columns=8), "wide, over a page's 7.16 in"),  # the legend cannot narrow
        (lambda: _figure(unexplained=True), "bars coloured #123456 have no legend entry"),
        (lambda: _figure("run of /tmp/pytest-7/x"), "a machine's path is in"),
        (lambda: _figure(""), "it has no title"),
    ],
)
def test_the_contract_refuses_what_a_reader_would_take_for_a_defect(make, refusal, tmp_path):
    assert figures.save(_figure(), str(tmp_path), "fine")  # the same figure, sound, is saved
    with pytest.raises(figure_data.FigureContractError, match=refusal):
        figures.save(make(), str(tmp_path), "f")
    assert not (tmp_path / "f.figure.json").exists()


def test_a_figure_wider_than_a_page_is_narrowed_to_fit_as_saved(tmp_path):
    fig, ax = plt.subplots(figsize=(9.0, 2))
    ax.plot([0, 1], [0, 1], label="a line")
    ax.set_yticks([0, 1], ["a long tick label on the left of the axes", "another"])
    ax.set_title("vit_micro on synthetic", loc="left")
    figures.save(fig, str(tmp_path), "wide")
    assert _drawn(str(tmp_path / "wide"))["size_in"][0] <= figure_data.MAX_WIDTH_IN


def test_a_figure_whose_points_sit_at_one_x_value_is_not_drawn(tmp_path):
    assert figures.save(_figure(xs=(1, 2)), str(tmp_path), "spread")
    assert figures.save(_figure(xs=(2, 2)), str(tmp_path), "one") == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("one")] == []
