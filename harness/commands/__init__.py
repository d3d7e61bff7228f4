"""``pipebench <verb>``: every command of the harness, one module per verb, listed here once.

The help, the installed script and the commands reference (docs/reference/commands.md)
are generated from :data:`VERBS`; a test holds the three against it. Each verb's module
has a docstring (its help text) and either

- ``OVERRIDES = True``: a config-driven verb, whose words are Hydra overrides (``key=value``,
  ``-m`` for a sweep), checked before anything runs (:mod:`harness.cli.hydra_app`); it has
  ``task(cfg)``, run as a Hydra app (with ``EXTRA_OVERRIDES`` appended, where it has them), or
  ``main(args: list[str]) -> int``; or
- ``add_arguments(parser)`` and ``main(args: argparse.Namespace) -> int``: a verb with its own flags.

``python -m harness`` is ``pipebench``, except that with no verb its words are ``run``'s,
so ``python -m harness`` alone runs the main job.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import signal
import sys
import threading

from harness.core.errors import Interrupted

# verb -> one line (the module harness.commands.<verb> holds it); the order of the help
VERBS: dict[str, str] = {
    "run": "train one configuration, or a sweep with -m (no overrides: the main job)",
    "preview": "list every job a sweep would launch, validated and predicted, without starting one",
    "results": "comparison tables and figures from run records",
    "plan": "AshPipe's plan (stages, replicas) for a model and world size, without training",
    "profile": "measure a model's layers, passes and network on this machine into a profile",
    "simulate": "predict a configuration on a cluster from a profile or a GPU's roofline",
    "bench": "our runtime against its peers on the same schedule, repeats interleaved",
    "validate": "the simulator's predictions against measured runs on this machine",
    "sensitivity": "which assumption decides the papers'-regime speedups (predictions only)",
    "stability": "where a learning rate trains or diverges, from AshPipe's single-process reference",
    "soak": "many short runs of every strategy in a row: hangs, failures, processes left over",
    "gpucheck": "every path one GPU can run, one line per check (exits 0 without a GPU)",
    "digits": "write scikit-learn's digits in CIFAR-100's format (data=digits)",
    "docs": "regenerate the generated pages of docs/reference from the code",
}
HYDRA_FLAGS_HELP = """Hydra's flags pass through: -m (a sweep), --cfg job (the composed config, unresolved),
--info. Overrides are key=value (docs/reference/configuration.md lists every key); a sweep
is key=a,b with -m."""


def version() -> str:
    """pipebench's version, the commit it runs from (a checkout), and torch's version."""
    import subprocess
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        ours = installed("pipebench")
    except PackageNotFoundError:
        ours = "unknown (not installed)"
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        git = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
        commit = git.stdout.strip() if git.returncode == 0 and os.path.isdir(os.path.join(here, "harness")) else ""
    except (OSError, subprocess.SubprocessError):
        commit = ""
    try:
        torch = installed("torch")
    except PackageNotFoundError:
        torch = "not installed"
    return f"pipebench {ours} (commit {commit or 'unknown: not a checkout'}), torch {torch}"


def top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipebench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Benchmarking harness for hybrid pipeline-parallel training: AshPipe and Hippie against "
        "DDP, GPipe, DeepSpeed and torch.distributed.pipelining.",
        epilog="commands:\n"
        + "\n".join(f"  {verb:<12} {line}" for verb, line in VERBS.items())
        + "\n\n`pipebench <command> --help` for one command; `python -m harness` alone runs the main job.",
    )
    parser.add_argument("--version", action="version", version=version())
    parser.add_argument("command", nargs="?", metavar="<command>", help="one of the commands below")
    return parser


def module(verb: str):
    return importlib.import_module(f"harness.commands.{verb}")


def verb_parser(verb: str) -> argparse.ArgumentParser:
    """The parser of one verb: its own flags, or (a config-driven verb) its overrides."""
    mod = module(verb)
    doc = (mod.__doc__ or VERBS[verb]).strip().replace("``", "")  # docstring markup, not for a terminal
    if getattr(mod, "OVERRIDES", False):
        parser = argparse.ArgumentParser(
            prog=f"pipebench {verb}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
            description=doc,
            epilog=HYDRA_FLAGS_HELP,
        )
        parser.add_argument("overrides", nargs="*", metavar="key=value", help="Hydra overrides of conf/")
        parser.add_argument("-m", "--multirun", action="store_true", help="run a sweep over the swept keys")
        parser.add_argument(
            "--show", action="store_true", help="print each job's validated values (defaults filled in) and exit"
        )
        return parser
    parser = argparse.ArgumentParser(
        prog=f"pipebench {verb}", formatter_class=argparse.RawDescriptionHelpFormatter, description=doc
    )
    mod.add_arguments(parser)
    return parser


def run_verb(verb: str, args: list[str]) -> int:
    mod = module(verb)
    if not getattr(mod, "OVERRIDES", False):
        return mod.main(verb_parser(verb).parse_args(args)) or 0
    if {"-h", "--help"} & set(args):
        verb_parser(verb).print_help()
        return 0
    if "--show" in args:
        from harness.cli.hydra_app import show  # Hydra and the config only for the verbs that read them

        return show([a for a in args if a != "--show"])
    if hasattr(mod, "main"):  # a verb that imports Hydra itself (run starts its workers' server first)
        return mod.main(args)
    from harness.cli.hydra_app import hydra_command

    hydra_command(mod.task, args, getattr(mod, "EXTRA_OVERRIDES", []))
    return 0


def run_stoppable(verb: str, args: list[str]) -> int:
    """:func:`run_verb`, where SIGTERM stops the command as Ctrl-C does (a run ends its workers and
    records the interruption, harness.run.launch) and either ends it with one line and 128 + the
    signal's number, not a traceback."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        return run_verb(verb, args)
    except KeyboardInterrupt:  # a Ctrl-C outside a run (a run raises Interrupted itself)
        print("\nstopped: interrupted by SIGINT", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    except Interrupted as e:  # (on a line of its own: a worker's progress bar may end without one)
        print(f"\nstopped: {e}", file=sys.stderr, flush=True)
        return e.exit_status
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None, default: str | None = None) -> int:
    """``pipebench [--version] <verb> [args]``; ``default``: the verb when the first word is none
    (``python -m harness`` runs ``run``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = argv[0] if argv and argv[0] in VERBS else None
    if verb is None and default and not (argv and argv[0] in ("-h", "--help", "--version")):
        verb, argv = default, [default, *argv]
    if verb is not None:
        return run_stoppable(verb, argv[1:])
    parser = top_parser()
    if argv and not argv[0].startswith("-"):
        near = difflib.get_close_matches(argv[0], list(VERBS), n=1)
        print(
            f"error: unknown command '{argv[0]}'{f'; did you mean {near[0]}?' if near else ''} "
            f"(the commands: {', '.join(VERBS)})",
            file=sys.stderr,
        )
        return 2
    parser.parse_args(argv)  # --help and --version print and exit here
    parser.print_help()
    return 0


def entry() -> None:
    """The installed ``pipebench`` script."""
    sys.exit(main())
