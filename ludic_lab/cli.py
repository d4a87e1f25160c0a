"""``ludic-lab``: the command-line entry point (each subcommand is derived from a config dataclass).

Each subcommand needs only its own dependencies: building the parser imports config classes
alone (``ludic-lab --help`` and every ``ludic-lab <command> --help`` work on the core
install), and a command whose optional extra is missing (``actor``/``trainer`` need
``pipeline``, ``demo --backend vllm`` needs ``vllm``) exits with one line naming the
``pip install`` to run.

Errors are one line. A value that cannot work is a usage error naming the flag (exit status
2): ``ludic-lab demo`` checks every option, and the model folder, packages and output folders
the run needs (:meth:`~ludic_lab.demo.DemoConfig.preflight`), before any model loads. A missing
package or model is one line naming the install (exit status 1). ``--traceback`` (or the
environment variable ``LUDIC_TRACEBACK=1``) raises these with their Python traceback instead;
errors that are not the user's (bugs) always show it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ludic_lab.config import add_dataclass_args, config_or_usage_error
from ludic_lab.extras import missing_extra_message

TRACEBACK_ENV = "LUDIC_TRACEBACK"
"""Environment variable: ``1`` shows the traceback of an error (as ``--traceback``)."""
_TRACEBACK_HELP = f"on an error, show the Python traceback, not just its one line (or set {TRACEBACK_ENV}=1)"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (the full usage is ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def traceback_wanted(argv: Sequence[str] = ()) -> bool:
    """Whether errors should show their traceback: ``--traceback`` in ``argv`` or ``LUDIC_TRACEBACK=1``."""
    env = os.environ.get(TRACEBACK_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return env or "--traceback" in argv


def _cmd_demo(ns: argparse.Namespace) -> int:
    from ludic_lab.aio import run_sync
    from ludic_lab.demo import DemoConfig, run_demo

    cfg = config_or_usage_error(
        ns.parser, DemoConfig, ns, check=DemoConfig.preflight, reraise=getattr(ns, "traceback", False)
    )
    run_sync(run_demo(cfg))
    return 0


def _cmd_model_path(ns: argparse.Namespace) -> int:
    from ludic_lab.inference.models import resolve_model

    print(resolve_model(ns.name))
    return 0


def _cmd_actor(ns: argparse.Namespace) -> int:
    from ludic_lab.pipeline.actor_main import PipelineActorConfig, main as actor_main

    return int(actor_main(config_or_usage_error(ns.parser, PipelineActorConfig, ns)) or 0)


def _cmd_trainer(ns: argparse.Namespace) -> int:
    from ludic_lab.pipeline.trainer_main import PipelineTrainerConfig, main as trainer_main

    return int(trainer_main(config_or_usage_error(ns.parser, PipelineTrainerConfig, ns)) or 0)


def _cmd_runs(ns: argparse.Namespace) -> int:
    from ludic_lab.runs.compare import RunsConfig, compare

    cfg = config_or_usage_error(ns.parser, RunsConfig, ns, reraise=getattr(ns, "traceback", False))
    try:
        compare(ns.paths, cfg)
    except (ValueError, FileNotFoundError) as e:  # no run folder there, a key no run has, a bad file name
        if getattr(ns, "traceback", False):
            raise
        ns.parser.error(str(e))
    return 0


def _cmd_eval(ns: argparse.Namespace) -> int:
    from ludic_lab.aio import run_sync
    from ludic_lab.demos.eval_cmd import EvalConfig, run_eval

    cfg = config_or_usage_error(
        ns.parser, EvalConfig, ns, check=EvalConfig.preflight, reraise=getattr(ns, "traceback", False)
    )
    run_sync(run_eval(cfg))
    return 0


def _cmd_export(ns: argparse.Namespace) -> int:
    from ludic_lab.lab.export import main as export_main

    return int(export_main(ns.export_args) or 0)


def build_parser() -> argparse.ArgumentParser:
    from ludic_lab.demo import DemoConfig
    from ludic_lab.demos.cli_help import add_demo_args, demo_parser_kwargs

    p = _Parser(prog="ludic-lab", description="ludic_lab: RL for LLM agents, notebook-first.")
    p.add_argument("--traceback", action="store_true", help=_TRACEBACK_HELP)
    sub = p.add_subparsers(dest="command", required=True)  # subparsers are _Parser too
    d = sub.add_parser("demo", help=(DemoConfig.__doc__ or "").strip().splitlines()[0], **demo_parser_kwargs())
    add_demo_args(d)  # the flags of DemoConfig in groups, a newcomer's first (ludic_lab/demos/cli_help.py)
    d.set_defaults(func=_cmd_demo, parser=d)
    m = sub.add_parser("model-path", help="materialise a model (default: SmolLM2) and print its local path")
    m.add_argument("name", nargs="?", default="default", help='"default", "tiny" or a local directory')
    m.set_defaults(func=_cmd_model_path, parser=m)
    from ludic_lab.pipeline.actor_main import PipelineActorConfig
    from ludic_lab.pipeline.trainer_main import PipelineTrainerConfig

    a = sub.add_parser("actor", help="pipeline RL actor: generate rollouts, push SAW items to Redis")
    add_dataclass_args(a, PipelineActorConfig)
    a.set_defaults(func=_cmd_actor, parser=a)
    t = sub.add_parser("trainer", help="pipeline RL trainer: train from the Redis queue, publish weights")
    add_dataclass_args(t, PipelineTrainerConfig)
    t.set_defaults(func=_cmd_trainer, parser=t)
    from ludic_lab.runs.compare import RunsConfig

    r = sub.add_parser("runs", help="compare run folders: a summary table, optionally a plot and a CSV (docs/runs.md)",
                       description=RunsConfig.__doc__)  # fmt: skip
    r.add_argument("paths", nargs="+", metavar="DIR", help="run folders, or quoted globs such as 'runs/*'")
    add_dataclass_args(r, RunsConfig)
    r.set_defaults(func=_cmd_runs, parser=r)
    from ludic_lab.demos.eval_cmd import EVAL_DESCRIPTION, EvalConfig

    v = sub.add_parser("eval", help=(EvalConfig.__doc__ or "").strip().splitlines()[0], description=EVAL_DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    add_dataclass_args(v, EvalConfig)
    v.set_defaults(func=_cmd_eval, parser=v)
    e = sub.add_parser(
        "export",
        help="export a notebook's training cell (+ its #| export cells) to a standalone script",
        add_help=False,
    )
    e.add_argument("export_args", nargs=argparse.REMAINDER, help="NOTEBOOK [-o PATH] [--cell N] [--force]")
    e.set_defaults(func=_cmd_export)
    for command in (d, m, a, t, r, v):  # --traceback after the command too (the top-level value is kept)
        command.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS, help=_TRACEBACK_HELP)
    return p


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, with an unknown flag reported by the subcommand's parser
    (its usage, its ``--help``) and the closest flag it has suggested."""
    ns, extra = parser.parse_known_args(argv)
    if extra:
        import difflib

        sub = getattr(ns, "parser", parser)
        flags = [o for action in sub._actions for o in action.option_strings]
        unknown = next((a.split("=")[0] for a in extra if a.startswith("--")), None)
        close = difflib.get_close_matches(unknown, flags, n=1) if unknown else []
        sub.error(f"unrecognized arguments: {' '.join(extra)}" + (f"; did you mean {close[0]}?" if close else ""))
    return ns


def _one_line(exc: BaseException, command: str | None) -> str | None:
    """The one-line message of an error the user can fix (a missing package or model), else None."""
    from ludic_lab.inference.models.cache import ModelNotAvailableError
    from ludic_lab.inference.vllm.server.version import VLLMVersionError

    msg = missing_extra_message(exc, what=f"ludic-lab {command}" if command else "ludic-lab")
    if msg is None and isinstance(exc, (ModelNotAvailableError, VLLMVersionError)):
        msg = str(exc)
    return " ".join(msg.split()) if msg else None


def subcommands() -> list[str]:
    """The names of every ``ludic-lab`` subcommand (CI runs ``--help`` of each)."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ludic-lab ARGV``. A bad option is a one-line usage error (exit status 2); a missing
    optional extra, package or model one line on stderr naming the fix (exit status 1), with
    its traceback under ``--traceback`` / ``LUDIC_TRACEBACK=1``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    tb = traceback_wanted(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        if command == "export":  # its own parser (ludic_lab.lab.export.main) handles every flag
            rest = argv[argv.index("export") + 1 :]
            return _cmd_export(argparse.Namespace(export_args=[a for a in rest if a != "--traceback"]))
        ns = _parse(build_parser(), argv)
        ns.traceback = tb
        return int(ns.func(ns) or 0)
    except Exception as exc:
        msg = None if tb else _one_line(exc, command)
        if msg is None:
            raise
        print(f"error: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
