"""Composing configs into validated specs, without starting anything: the schema, every shipped
experiment and case, the per-strategy keys, the strategy registry."""

import dataclasses
import functools
import itertools
import os
import re

import pytest
import torch
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from harness import commands
from harness.config import schema
from harness.config.registry import CONFIG_DIR, strategy_classes
from harness.config.spec import build_spec
from harness.core.errors import ConfigError
from tests.helpers.cli import compose_config, hydra_compose, make_spec


def test_default_composition():
    cfg = compose_config([])
    assert cfg.strategy.name == "dp" and cfg.model.name == "vit_micro" and cfg.data.name == "synthetic"
    assert cfg.logger.mode is None and cfg.world_size == 1  # unset: WANDB_MODE, else offline


def test_wandb_settings_come_from_the_config_then_the_environment_then_the_defaults(monkeypatch):
    from harness.report.wandb_run import settings

    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    assert settings(None, None, None) == ("offline", "pipebench", None)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_PROJECT", "theirs")
    monkeypatch.setenv("WANDB_ENTITY", "lab")
    assert settings(None, None, None) == ("disabled", "theirs", "lab")
    assert settings("online", "mine", None) == ("online", "mine", "lab")  # an explicit value wins
    with pytest.raises(ConfigError, match="logger.mode=sometimes"):
        make_spec("logger.mode=sometimes")


@pytest.mark.parametrize(
    "override,error",
    [
        ("train.stepz=3", ConfigKeyError),
        ("train.steps=many", ValidationError),
        ("world_size=two", ValidationError),
        ("strategy.stages=two", ValidationError),
        ("strategy.no_such_key=1", ConfigKeyError),
    ],
)
def test_schema_refuses_misspelt_keys_and_wrong_types(override, error):
    with pytest.raises((ConfigCompositionException, error)):
        compose_config([override])


def test_more_workers_than_gpus_is_refused(monkeypatch):
    # this machine has no GPU: only the count torch reports is replaced, the check itself is real
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match=r"world_size=4 needs 4 GPU\(s\) on this host \(one per worker\) but 2 are"):
        make_spec("launch.device=cuda", "world_size=4")


def test_torchgpipe_can_put_its_partitions_on_one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="world_size=2 needs 2 GPU"):
        make_spec("launch.device=cuda", "world_size=2", "strategy=gpipe")
    assert make_spec("launch.device=cuda", "world_size=2", "strategy=gpipe", "strategy.devices=1").strategy.devices == 1


def _names(group: str) -> list[str]:
    return sorted(f[: -len(".yaml")] for f in os.listdir(os.path.join(CONFIG_DIR, group)) if f.endswith(".yaml"))


@functools.cache
def _sweep_jobs(experiment: str) -> list[list[str]]:
    """The overrides of every job the experiment's sweep launches (its sweeper's params, expanded)."""
    params = compose_config([f"experiment={experiment}"], return_hydra_config=True).hydra.sweeper.params or {}
    axes = [[f"{key}={value.strip()}" for value in str(values).split(",")] for key, values in params.items()]
    return [list(job) for job in itertools.product(*axes)]


# jobs a shipped sweep launches knowing they are refused (each stays in its table as failed)
EXPECTED_REFUSALS = {
    # torchgpipe needs one partition per device: 16 stages for ViT-B's 14 layers
    ("speedup", "model=vit_base", "world_size=16", "strategy=gpipe"): "exceeds the 14 layers",
    # ZB-V over every GPU at two stages per rank: 16 or 32 stages for ViT-B's 14 layers
    **{
        (
            "papers_regime",
            "model=vit_base",
            f"world_size={w}",
            f"cluster={c}",
            "+case=regime/pipelining_zbv",
        ): "exceeds the 14 layers"
        for w in (8, 16)
        for c in ("dgx_nvlink", "pcie_10gbe")
    },
}


@pytest.fixture(scope="module")
def digits_root(tmp_path_factory) -> str:
    """scikit-learn's digits written as data=digits expects them (pipebench digits)."""
    root = str(tmp_path_factory.mktemp("digits"))
    assert commands.main(["digits", "--root", root]) == 0
    return root


@pytest.mark.parametrize("experiment", _names("experiment"))
def test_every_job_of_every_experiment_composes_into_a_validated_spec(experiment, digits_root):
    jobs = _sweep_jobs(experiment)
    assert jobs
    # a study on digits reads the set its command writes
    on_digits = compose_config([f"experiment={experiment}"]).data.label == "digits"
    data = [f"data.root={digits_root}"] if on_digits else []
    # on this machine: the device is the only thing a GPU sweep needs that is not here
    for job in jobs:
        cfg = compose_config([f"experiment={experiment}", *job, "launch.device=cpu", *data])
        refusal = EXPECTED_REFUSALS.get((experiment, *(o for o in job if o != "repeat=0")))
        if refusal:
            with pytest.raises(ConfigError, match=refusal):
                build_spec(cfg)
            continue
        spec = build_spec(cfg)
        assert spec.strategy.name == spec.strategy_cls.name and spec.timed_steps >= 1


def test_the_tests_compose_what_hydra_composes():
    """The tests' compose_config applies value overrides to one composition per set of group
    choices, from files parsed once; on jobs that vary values, groups, an added case and a nested
    key it equals Hydra's compose, and it refuses a wrong type and a misspelt key as Hydra does."""
    base = ["experiment=speedup"]
    jobs = [
        ["strategy=hippie", "world_size=4", "train.micro_batches=8"],
        ["strategy=hippie", "world_size=2", "strategy.recompute=all"],
        ["strategy=dp", "model=vit_tiny", "repeat=1"],
        ["+case=regime/pipelining_zbv", "train.global_batch=32"],
    ]
    for job in jobs:
        fast = compose_config([*base, *job])
        hydra = hydra_compose([*base, *job], parse_once=False)
        assert OmegaConf.to_container(fast) == OmegaConf.to_container(hydra)
    for bad in ("train.steps=many", "world_size=two", "train.stepz=3"):
        with pytest.raises(Exception) as by_hydra:
            hydra_compose([*base, "strategy=hippie", bad], parse_once=False)
        with pytest.raises(type(by_hydra.value)):
            compose_config([*base, "strategy=hippie", bad])


@pytest.mark.parametrize("case", _names("case"))
def test_every_case_composes_into_a_validated_spec(case):
    """A case is one point of a sweep: validated within each experiment that runs it (above
    every job is), or on its own where none does."""
    users = [e for e in _names("experiment") if any(f"+case={case}" in job for job in _sweep_jobs(e))]
    for overrides in ([f"experiment={e}", f"+case={case}"] for e in users) if users else [[f"+case={case}"]]:
        spec = make_spec(*overrides)
        assert spec.strategy.name in case and f"w{spec.world_size}" in case


def test_a_key_of_another_strategy_is_refused_naming_the_strategy_and_its_keys():
    with pytest.raises(ConfigError) as e:
        make_spec("strategy=hippie", "world_size=2", "strategy.switch_step=3")
    message = str(e.value)
    assert "\n" not in message and "strategy.switch_step=3 does not apply to strategy=hippie" in message
    assert "a key of ashpipe" in message and "strategy.bucket_mb" in message and "strategy.recompute" in message
    with pytest.raises(ConfigError, match="does not apply to strategy=dp .* takes no strategy keys"):
        make_spec("strategy=dp", "strategy.partition_method=uniform")


def test_pipeline_keys_a_strategy_lacks_are_ignored_and_recorded():
    spec = make_spec("strategy=dp", "world_size=2", "strategy.recompute=none", "strategy.stages=2")
    assert spec.ignored == {"recompute": "none", "stages": 2}
    assert spec.summary()["ignored_strategy_keys"] == spec.ignored
    hippie = make_spec("strategy=hippie", "world_size=2", "strategy.recompute=none")
    assert hippie.ignored == {} and hippie.strategy.recompute == "none" and hippie.strategy.bucket_mb == 4.0


def test_each_strategy_reads_only_its_own_keys_with_its_own_defaults():
    assert make_spec("strategy=hippie", "world_size=2").strategy.recompute == "auto"
    assert make_spec("strategy=pipelining", "world_size=2", "train.micro_batches=2").strategy.recompute == "none"
    assert make_spec("strategy=gpipe", "world_size=2").strategy.stages == 2  # one partition per device
    assert not hasattr(make_spec("strategy=hippie", "world_size=2").strategy, "replicas")
    with pytest.raises(ConfigError, match="runs async_1f1b only"):
        make_spec("strategy=ashpipe", "world_size=2", "strategy.schedule=1f1b")


def test_strategy_classes_come_from_the_yaml_files_target(tmp_path):
    assert sorted(strategy_classes()) == _names("strategy")
    good, bad = tmp_path / "good", tmp_path / "bad"
    for conf in (good, bad):
        (conf / "strategy").mkdir(parents=True)
        (conf / "strategy" / "dp.yaml").write_text("_target_: baselines.ddp.DDPStrategy\nname: dp\n")
    assert [c.__name__ for c in strategy_classes(str(good)).values()] == ["DDPStrategy"]
    (bad / "strategy" / "mine.yaml").write_text("_target_: baselines.ddp.DDPStrategy\nname: mine\n")
    with pytest.raises(RuntimeError, match="whose name is 'mine'"):
        strategy_classes(str(bad))


def test_a_key_another_strategy_declares_with_another_type_is_refused_naming_both():
    """docs/extending/strategy.md: the strategies' keys are one schema, so a shared name has one type."""

    def strategy(bucket_type):
        config = dataclasses.make_dataclass("MineConfig", [("bucket_mb", bucket_type, dataclasses.field(default=4))])
        return type("MineStrategy", (), {"Config": config, "__module__": "harness.strategies.mine"})

    builtin = list(strategy_classes().values())
    assert "bucket_mb" in {f.name for f in dataclasses.fields(schema.strategy_schema([*builtin, strategy(float)]))}
    with pytest.raises(TypeError) as e:
        schema.strategy_schema([*builtin, strategy(int)])
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("strategy.bucket_mb is int in harness.strategies.mine.MineStrategy but float in ")
    assert "but float in harness.strategies.ashpipe.strategy.AshPipeStrategy, harness.strategies.hippie" in message
    assert message.endswith("rename MineStrategy's key or declare it float")


def test_slurm_preset_composes_with_one_task_per_gpu():
    cfg = compose_config(
        [
            "hydra/launcher=slurm",
            "hydra.launcher.gpus_per_node=4",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.account=proj1",
        ],
        return_hydra_config=True,
    )
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.pipebench.WorldSizeSlurmLauncher"
    assert OmegaConf.select(cfg, "hydra.launcher.tasks_per_node") == 4
    assert launcher.partition == "gpu" and launcher.account == "proj1"


def test_each_slurm_job_gets_the_nodes_its_world_size_needs(capsys):
    from harness.cli.launcher import placement

    assert placement(4, 8) == (1, 4) and placement(8, 8) == (1, 8) and placement(16, 8) == (2, 8)
    with pytest.raises(ConfigError, match="world_size=12 does not fill whole nodes of 8 tasks"):
        placement(12, 8)
    # the launcher's nodes would be ignored: refused, in one line, before anything runs
    with pytest.raises(SystemExit) as refused:
        commands.main(["run", "-m", "hydra/launcher=slurm", "hydra.launcher.nodes=2", "world_size=16"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith("error: hydra.launcher.nodes is not read with hydra/launcher=slurm")
    with pytest.raises(SystemExit) as refused:  # and a world size the nodes cannot hold, before anything runs
        commands.main(["run", "-m", "hydra/launcher=slurm", "world_size=8,12"])
    assert refused.value.code == 2
    assert capsys.readouterr().err.startswith("error: world_size=12 does not fill whole nodes of 8 tasks")


def _declared_rules():
    """(override prefix, strategy or None, field) of every key that declares a closed set or range."""

    def walk(cls, prefix):
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(f.type) or f.name in (
                "model",
                "data",
                "strategy",
                "logger",
                "train",
                "launch",
                "cluster",
                "sim",
            ):
                continue
            if f.metadata:
                yield prefix, None, f

    nested = {
        "model": schema.ModelConfig,
        "data": schema.DataConfig,
        "train": schema.TrainConfig,
        "launch": schema.LaunchConfig,
        "logger": schema.LoggerConfig,
        "cluster": schema.ClusterConfig,
    }
    yield from walk(schema.RunConfig, "")
    for name, cls in nested.items():
        yield from walk(cls, f"{name}.")
    for name, cls in strategy_classes().items():
        for prefix, _, f in walk(cls.Config, "strategy."):
            yield prefix, name, f


def _bad_value(f):
    if "choices" in f.metadata:
        return "nope"
    low, high, above = f.metadata["range"]
    return low if above else low - 1


@pytest.mark.parametrize(
    "prefix,strategy,f", list(_declared_rules()), ids=lambda v: v if isinstance(v, str) else getattr(v, "name", str(v))
)
def test_every_closed_set_and_range_is_refused_in_one_place_naming_the_key(prefix, strategy, f):
    overrides = [f"{prefix}{f.name}={_bad_value(f)}"] + ([f"strategy={strategy}"] if strategy else [])
    with pytest.raises(ConfigError, match=rf"^{re.escape(prefix + f.name)}=\S+ (is not one of|must be)"):
        make_spec(*overrides)


@pytest.mark.parametrize(
    "overrides,refusal",
    [
        (["strategy.schedule=dualpipev", "train.micro_batches=2"], "at least as many microbatches as stages"),
        (["strategy.schedule=zbv", "strategy.stages_per_rank=3"], "exactly 2 stages per rank"),
        (["strategy.schedule=1f1b", "strategy.stages_per_rank=2"], "runs one stage per rank"),
        (["strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=4"], "= 8 stages exceeds the 6 layers"),
        (["strategy.schedule=zero_bubble", "world_size=4"], "pytorch/pytorch#144530"),
        (["strategy.schedule=interleaved_1f1b", "train.micro_batches=3"], "divisible by 1 pipeline replica"),
        (["strategy.schedule=interleaved", "train.micro_batches=4"], "is not one of gpipe, 1f1b, interleaved_1f1b"),
    ],
)
def test_each_pipelining_schedule_refuses_what_it_cannot_run_in_one_line(overrides, refusal):
    with pytest.raises(ConfigError, match=refusal) as e:
        make_spec("strategy=pipelining", "world_size=2", "train.micro_batches=4", *overrides)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides,refusal",
    [
        (["strategy.schedule=dualpipev", "train.micro_batches=2"], "at least as many microbatches as stages"),
        (["strategy.schedule=zbv", "strategy.stages_per_rank=3"], "exactly 2 stages per rank"),
        (
            ["strategy.schedule=zb_h1", "strategy.stages_per_rank=2"],
            "runs one stage per rank; set strategy.stages_per_rank=1 "
            "or use a schedule with several: interleaved_1f1b, looped_bfs, zero_bubble, zbv, dualpipev",
        ),
        (["strategy.schedule=interleaved_1f1b", "strategy.stages_per_rank=4"], "= 8 stages exceeds the 6 layers"),
        (["strategy.schedule=async_1f1b"], "is not one of gpipe, 1f1b, zb_h1, interleaved_1f1b"),
    ],
)
def test_each_schedule_of_our_runtime_refuses_what_it_cannot_run_in_one_line(overrides, refusal):
    with pytest.raises(ConfigError, match=refusal) as e:
        make_spec("strategy=hippie", "world_size=2", "train.micro_batches=4", *overrides)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("strategy", ["pipelining", "hippie"])
def test_a_multi_stage_schedule_takes_two_stages_per_rank_unless_told(strategy):
    spec = make_spec(f"strategy={strategy}", "world_size=2", "strategy.schedule=zbv", "train.micro_batches=4")
    assert spec.strategy.stages_per_rank == 2
    assert make_spec(f"strategy={strategy}", "world_size=2", "train.micro_batches=2").strategy.stages_per_rank == 1


def test_an_option_in_a_groups_sub_folder_is_known_and_a_missing_one_is_refused_naming_it():
    """The main job's jobs are cases in conf/case/ci/: rerunning one by its recorded override works."""
    from harness.config.choices import unknown_choice

    assert unknown_choice(["+case=ci/replicated_ashpipe_w4", "model=vit_micro"], CONFIG_DIR) is None
    message = unknown_choice(["+case=ci/nope"], CONFIG_DIR)
    assert message.startswith("unknown case 'ci/nope'") and "ci/speed_dp_w1" in message and "hippie_w2" in message
