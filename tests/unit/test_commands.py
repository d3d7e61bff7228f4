"""The command line itself, in process: one `pipebench` with verbs listed in one place, every
verb's help, the version, the generated references, and refusals in one line (exit 2) for the
errors Hydra would report over many lines or not at all."""

import os

import pytest
import tomllib

from harness import commands
from tests.helpers.cli import ROOT


def test_the_installed_script_is_the_one_command():
    scripts = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]["scripts"]
    assert scripts == {"pipebench": "harness.commands:entry"}


def test_the_help_lists_every_verb_and_each_verb_has_help(capsys):
    assert commands.main([]) == 0  # bare pipebench prints the help
    listed = capsys.readouterr().out
    for verb, line in commands.VERBS.items():
        assert f"  {verb:<12} {line}" in listed
        assert os.path.isfile(os.path.join(ROOT, "harness", "commands", f"{verb}.py")), verb
        try:
            code = commands.main([verb, "--help"])
        except SystemExit as e:  # argparse's --help exits
            code = e.code
        assert code in (0, None), verb
        assert f"usage: pipebench {verb}" in capsys.readouterr().out
    # every module of harness/commands is a verb: nothing runs that the help does not list
    modules = {f[:-3] for f in os.listdir(os.path.join(ROOT, "harness", "commands")) if f.endswith(".py")}
    assert modules - {"__init__"} == set(commands.VERBS)


def test_the_version_names_pipebench_its_commit_and_torch(capsys):
    with pytest.raises(SystemExit) as done:
        commands.main(["--version"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("pipebench 0.") and "commit" in out and "torch 2.14" in out and "hydra" not in out.lower()


def test_the_study_commands_type_their_shared_options_in_one_place():
    """--out, --repeats, --steps, ... come from harness.studies.options: one type for each, whichever
    study command has it."""
    from harness.studies.options import TYPES

    shared = {}
    for verb in ("bench", "validate", "soak", "gpucheck", "sensitivity"):
        for action in commands.verb_parser(verb)._actions:
            if action.dest in TYPES:
                assert action.type is TYPES[action.dest], (verb, action.dest)
                shared.setdefault(action.dest, set()).add(verb)
    assert shared["out"] == {"bench", "validate", "soak", "gpucheck", "sensitivity"}
    assert shared["steps"] == {"bench", "validate", "gpucheck"} and shared["repeats"] == {"bench", "validate"}


def test_an_unknown_verb_is_refused_with_the_nearest(capsys):
    assert commands.main(["reslts"]) == 2
    assert "unknown command 'reslts'; did you mean results?" in capsys.readouterr().err


def test_the_generated_reference_pages_equal_what_the_code_generates(capsys):
    """Run `pipebench docs` and commit its pages when this fails."""
    assert commands.main(["docs", "--check"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    "args,message",
    [
        (["trian.steps=10"], "unknown key trian.steps; did you mean train.steps?"),
        (["+trian.steps=10"], "unknown key trian.steps; did you mean train.steps?"),
        (["train.lr=fast"], "train.lr=fast: Value 'fast' of type 'str' could not be converted to Float"),
        (["-m", "train.lr=1e-3,fast"], "train.lr=fast: Value 'fast'"),  # any job of a sweep
        (["train.steps=["], "cannot read the override 'train.steps=['"),
        (["+train.steps=3"], "+train.steps: train.steps exists already; drop the '+'"),
        (["strategy.bogus=1"], "unknown key strategy.bogus"),
        (["model=vit_nope"], "unknown model 'vit_nope'"),
    ],
)
def test_what_hydra_would_refuse_or_ignore_is_refused_in_one_line(args, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as done:
        commands.main(["simulate", *args, f"hydra.run.dir={tmp_path}/run"])  # a verb that starts no worker
    assert done.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not os.path.exists(tmp_path / "run")


def test_show_prints_the_values_a_run_uses_with_defaults_filled_in(capsys):
    assert commands.main(["run", "--show", "strategy=hippie", "world_size=4"]) == 0
    out = capsys.readouterr().out
    assert "micro_batches: 4" in out and "stages: 2" in out and "recompute: auto" in out and "bucket_mb: 4.0" in out
    assert "micro_batches: null" not in out
