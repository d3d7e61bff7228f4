"""The documentation's extending examples (docs/extending/), taken from the pages and run: a
schedule, a metric and a figure each registered as the page says, and what each one changes."""

import os
import shutil
import sys

import pytest

from harness.commands.docs import columns_page, schedules_page
from harness.config.registry import CONFIG_DIR, strategy_classes
from harness.report import columns, figures
from harness.report.record import write
from harness.report.tables import load_records, render
from harness.runtime import actions as sch
from harness.runtime import schedules
from tests.helpers.docs import code_blocks, run_block
from tests.unit.test_results import _rec


@pytest.fixture
def restored(monkeypatch):
    """The registries as they were, whatever an example added."""
    monkeypatch.setattr(columns, "COLUMNS", list(columns.COLUMNS))
    monkeypatch.setattr(figures, "FIGURES", list(figures.FIGURES))
    monkeypatch.setattr(schedules, "SCHEDULES", dict(schedules.SCHEDULES))


def test_the_strategy_example_is_one_file_and_one_yaml_the_registry_finds(tmp_path, monkeypatch):
    (source,) = code_blocks("extending/strategy.md", "python")
    (yaml,) = code_blocks("extending/strategy.md", "yaml")
    conf = tmp_path / "conf"
    shutil.copytree(CONFIG_DIR, conf)
    (conf / "strategy" / "allreduce_dp.yaml").write_text(yaml)
    package = tmp_path / "pkg" / "harness" / "strategies"
    package.mkdir(parents=True)
    (package / "allreduce_dp.py").write_text(source)
    # the example's module where its yaml says, beside the installed harness (a namespace extension)
    import harness.strategies

    monkeypatch.setattr(harness.strategies, "__path__", [*harness.strategies.__path__, str(package)])
    monkeypatch.delitem(sys.modules, "harness.strategies.allreduce_dp", raising=False)
    found = strategy_classes.__wrapped__(str(conf))
    assert found["allreduce_dp"].__name__ == "AllReduceDPStrategy"
    assert set(found) == set(strategy_classes()) | {"allreduce_dp"}


def test_the_schedule_example_registers_a_schedule_hippie_accepts(restored):
    run_block(code_blocks("extending/schedule.md", "python")[0], "fill_drain_in_order")
    kind = schedules.get("fill_drain_in_order")
    assert "fill_drain_in_order" in schedules.names(ours=True)
    lists = kind.check(3, 1, 4)  # finishes when replayed, or raises
    for acts in lists:  # backwards in the forwards' order
        assert [a.micro for a in acts if a.op == sch.BWD] == [0, 1, 2, 3]
    assert kind.analytic_bubble(3, 1, 4) == pytest.approx(2 / 6)
    from tests.helpers.cli import make_spec

    spec = make_spec(
        "strategy=hippie", "world_size=2", "strategy.schedule=fill_drain_in_order", "train.micro_batches=4"
    )
    assert spec.strategy_cls.replayed_schedule(spec, 2)[0] == kind.lists(2, 1, 4)
    assert "| `fill_drain_in_order` | fill-drain with the backwards" in schedules_page()  # `pipebench docs`


def test_the_metric_example_adds_a_column_to_every_table(tmp_path, restored):
    run_block(code_blocks("extending/metric.md", "python")[0], "throughput_per_worker")
    for name, (strategy, w, tp) in {"dp": ("dp", 2, 100.0), "hippie": ("hippie", 2, 150.0)}.items():
        write(str(tmp_path / name), _rec(strategy, w, tp, 200))
    md = render(load_records([str(tmp_path)]), "md", "speed")
    header_line = next(line for line in md.splitlines() if line.startswith("| strategy"))
    header = [c.strip() for c in header_line.split("|")]
    assert header.index("samples/s/worker") == header.index("samples/s") + 1
    row = next(line for line in md.splitlines() if line.startswith("| hippie"))
    assert [c.strip() for c in row.split("|")][header.index("samples/s/worker")] == "**75.0**"
    assert "samples/s/worker" not in render(load_records([str(tmp_path)]), "md")  # the paper set is as it was
    tex = render(load_records([str(tmp_path)]), "latex", "speed")
    assert "\\textbf{75.0}" in tex  # the best of its group, higher being better
    page = columns_page()  # what `pipebench docs` writes to docs/reference/columns.md
    assert "| `throughput_per_worker` | samples/s/worker |" in page
    assert "`throughput`, `throughput_per_worker`, `speedup`" in page  # in its sets, where it was inserted


def test_the_figure_example_is_drawn_with_the_others(tmp_path, restored):
    run_block(code_blocks("extending/figure.md", "python")[0], "speedup_vs_memory")
    records = [_rec("dp", 2, 100.0, 200 * 2**20), _rec("hippie", 2, 150.0, 100 * 2**20)]
    paths = figures.all_figures(records, str(tmp_path))
    assert {os.path.basename(p) for p in paths} >= {"speedup_vs_memory.png", "speedup_vs_memory.pdf"}
    assert os.path.getsize(tmp_path / "speedup_vs_memory.png") > 1000
    assert "| `speedup_vs_memory` | each run's speedup over DP" in columns_page()  # `pipebench docs`
