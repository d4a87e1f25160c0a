"""``ludic-lab``: the command-line entry point (each subcommand is derived from a config dataclass).

Each subcommand needs only its own dependencies: building the parser imports config classes
alone (``ludic-lab --help`` and every ``ludic-lab <command> --help`` work on the core
install), and a command whose optional extra is missing (``actor``/``trainer`` need
``pipeline``, ``demo --backend vllm`` needs ``vllm``) exits with one line naming the
``pip install`` to run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ludic_lab.config import add_dataclass_args, config_or_usage_error
from ludic_lab.extras import missing_extra_message


def _cmd_demo(ns: argparse.Namespace) -> int:
    from ludic_lab.aio import run_sync
    from ludic_lab.demo import DemoConfig, run_demo

    run_sync(run_demo(config_or_usage_error(ns.parser, DemoConfig, ns)))
    return 0


def _cmd_model_path(ns: argparse.Namespace) -> int:
    from ludic_lab.inference.models import resolve_model

    print(resolve_model(ns.name))
    return 0


def _cmd_actor(ns: argparse.Namespace) -> int:
    from ludic_lab.pipeline.actor_main import PipelineActorConfig
    from ludic_lab.pipeline.actor_main import main as actor_main

    return int(actor_main(config_or_usage_error(ns.parser, PipelineActorConfig, ns)) or 0)


def _cmd_trainer(ns: argparse.Namespace) -> int:
    from ludic_lab.pipeline.trainer_main import PipelineTrainerConfig
    from ludic_lab.pipeline.trainer_main import main as trainer_main

    return int(trainer_main(config_or_usage_error(ns.parser, PipelineTrainerConfig, ns)) or 0)


def _cmd_export(ns: argparse.Namespace) -> int:
    from ludic_lab.lab.export import main as export_main

    return int(export_main(ns.export_args) or 0)


def build_parser() -> argparse.ArgumentParser:
    from ludic_lab.demo import DemoConfig

    p = argparse.ArgumentParser(prog="ludic-lab", description="ludic_lab: RL for LLM agents, notebook-first.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help=(DemoConfig.__doc__ or "").strip().splitlines()[0])
    add_dataclass_args(d, DemoConfig)
    d.set_defaults(func=_cmd_demo, parser=d)
    m = sub.add_parser("model-path", help="materialise a model (default: SmolLM2) and print its local path")
    m.add_argument("name", nargs="?", default="default", help='"default", "tiny" or a local directory')
    m.set_defaults(func=_cmd_model_path)
    from ludic_lab.pipeline.actor_main import PipelineActorConfig
    from ludic_lab.pipeline.trainer_main import PipelineTrainerConfig

    a = sub.add_parser("actor", help="pipeline RL actor: generate rollouts, push SAW items to Redis")
    add_dataclass_args(a, PipelineActorConfig)
    a.set_defaults(func=_cmd_actor, parser=a)
    t = sub.add_parser("trainer", help="pipeline RL trainer: train from the Redis queue, publish weights")
    add_dataclass_args(t, PipelineTrainerConfig)
    t.set_defaults(func=_cmd_trainer, parser=t)
    e = sub.add_parser(
        "export",
        help="export a notebook's training cell (+ its #| export cells) to a standalone script",
        add_help=False,
    )
    e.add_argument("export_args", nargs=argparse.REMAINDER, help="NOTEBOOK [-o PATH] [--cell N] [--force]")
    e.set_defaults(func=_cmd_export)
    return p


def subcommands() -> list[str]:
    """The names of every ``ludic-lab`` subcommand (CI runs ``--help`` of each)."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return list(sub.choices)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ludic-lab ARGV``; a missing optional extra is one line on stderr and exit status 1."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    try:
        if command == "export":  # its own parser (ludic_lab.lab.export.main) handles every flag
            return _cmd_export(argparse.Namespace(export_args=argv[1:]))
        ns = build_parser().parse_args(argv)
        return int(ns.func(ns) or 0)
    except ImportError as exc:
        msg = missing_extra_message(exc, what=f"ludic-lab {command}" if command else "ludic-lab")
        if msg is None:
            raise
        print(f"error: {msg}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
