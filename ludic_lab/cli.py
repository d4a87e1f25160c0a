"""``ludic-lab``: the command-line entry point (each subcommand is derived from a config dataclass)."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from ludic_lab.config import add_dataclass_args, dataclass_from_args


def _cmd_demo(ns: argparse.Namespace) -> int:
    from ludic_lab.aio import run_sync
    from ludic_lab.demo import DemoConfig, run_demo

    run_sync(run_demo(dataclass_from_args(DemoConfig, ns)))
    return 0


def _cmd_model_path(ns: argparse.Namespace) -> int:
    from ludic_lab.inference.models import resolve_model

    print(resolve_model(ns.name))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from ludic_lab.demo import DemoConfig

    p = argparse.ArgumentParser(prog="ludic-lab", description="ludic_lab: RL for LLM agents, notebook-first.")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help=DemoConfig.__doc__.strip().splitlines()[0])
    add_dataclass_args(d, DemoConfig)
    d.set_defaults(func=_cmd_demo)
    m = sub.add_parser("model-path", help="materialise a model (default: SmolLM2) and print its local path")
    m.add_argument("name", nargs="?", default="default", help='"default", "tiny" or a local directory')
    m.set_defaults(func=_cmd_model_path)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    ns = build_parser().parse_args(argv)
    return int(ns.func(ns) or 0)


if __name__ == "__main__":
    sys.exit(main())
