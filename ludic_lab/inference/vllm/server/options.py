"""Options of the bundled vLLM server: :class:`LudicServerOptions`, the ``--ludic-*`` flags
generated from it, and the bind rule.

Each field of the dataclass is one flag: ``--ludic-`` plus the field name in dashes, or the
``flag`` its metadata names (``drain_timeout_s`` -> ``--ludic-drain-timeout``); the help text
is the docstring under the field. Imports neither vLLM nor FastAPI, so all of this is
testable on the core install.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, get_args, get_origin

FLAG_PREFIX = "--ludic-"
WEIGHT_LOADS = ("auto", "reload")
WEIGHT_UPDATES = ("drain", "in_flight")
IN_FLIGHT_KV = ("keep", "recompute")
TOKEN_ENV = "LUDIC_CONTROL_TOKEN"
"""Environment variable read when ``--ludic-control-token`` is not given."""


@dataclass(frozen=True)
class LudicServerOptions:
    """Our own flags (``--ludic-...``); everything else is vLLM's."""

    control_token: str | None = None
    """Bearer token for the weight-update routes (default $LUDIC_CONTROL_TOKEN); required when
    bound to a non-loopback address."""
    shm_dir: str = field(default="", metadata={"metavar": "DIR"})
    """Folder shm update files must be in (default /dev/shm); others are refused."""
    drain_timeout_s: float = field(default=600.0, metadata={"flag": "drain-timeout", "metavar": "SECONDS"})
    """Seconds an update waits for in-flight generations before giving up (HTTP 503)."""
    initial_version: int = 0
    """Policy version of the starting weights."""
    weight_load: str = field(default="auto", metadata={"choices": WEIGHT_LOADS})
    """auto: CPU updates load in place (verified against reload_weights once); reload: always
    vLLM's reload_weights."""
    weight_update: str = field(default="drain", metadata={"choices": WEIGHT_UPDATES})
    """drain: an update waits for in-flight generations, then loads (every response has one
    version); in_flight: it pauses the engine with running requests frozen, loads and resumes
    them under the new weights (responses carry per-token ``token_versions``). An update's
    ``weight_update`` field overrides it."""
    in_flight_kv: str = field(default="keep", metadata={"flag": "in-flight-kv", "choices": IN_FLIGHT_KV})
    """in_flight only: keep the KV cache the old weights computed for the frozen requests
    (and cached prefixes), or recompute it under the new weights (prefills them again)."""
    worker_idle_spin_s: float | None = field(
        default=0.02, metadata={"flag": "worker-idle-spin", "metavar": "SECONDS", "negative_is_none": True}
    )
    """How long vLLM's worker busy-waits for its next step before sleeping (vLLM's own: 1.0; a
    negative value leaves vLLM's); short frees its core for a trainer on the same host. Steps of
    a running generation follow each other within a millisecond or two, so 20 ms keeps
    generation at full speed."""

    def __post_init__(self) -> None:
        from ludic_lab.validation import check_config

        check_config(self, {"drain_timeout_s": "> 0", "initial_version": ">= 0", "worker_idle_spin_s": ">= 0"})
        if self.weight_load not in WEIGHT_LOADS:
            raise ValueError(f"LudicServerOptions.weight_load must be 'auto' or 'reload', got {self.weight_load!r}")
        if self.weight_update not in WEIGHT_UPDATES:
            raise ValueError(
                f"LudicServerOptions.weight_update must be 'drain' or 'in_flight', got {self.weight_update!r}"
            )
        if self.in_flight_kv not in IN_FLIGHT_KV:
            raise ValueError(
                f"LudicServerOptions.in_flight_kv must be 'keep' or 'recompute', got {self.in_flight_kv!r}"
            )


def flag_name(f: dataclasses.Field) -> str:
    """The command-line flag of one :class:`LudicServerOptions` field."""
    return FLAG_PREFIX + f.metadata.get("flag", f.name.replace("_", "-"))


def _dest(f: dataclasses.Field) -> str:
    return flag_name(f)[2:].replace("-", "_")


def add_option_flags(parser: argparse.ArgumentParser, cls: type = LudicServerOptions) -> None:
    """Add one ``--ludic-...`` flag per field of ``cls`` (a ``ludic_lab`` argument group).

    Defaults are the dataclass's, help the docstring under each field, choices the metadata's or a ``Literal``'s.
    """
    from ludic_lab.config import field_docs

    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    group = parser.add_argument_group("ludic_lab")
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if get_origin(tp) in (typing.Union, types.UnionType):  # Optional[X], X | None
            tp = next(a for a in get_args(tp) if a is not type(None))
        kw: dict[str, Any] = {"default": f.default, "help": docs.get(f.name, "")}
        if "metavar" in f.metadata:
            kw["metavar"] = f.metadata["metavar"]
        if "choices" in f.metadata:
            kw["choices"] = list(f.metadata["choices"])
        elif get_origin(tp) is Literal:
            kw["choices"] = list(get_args(tp))
        else:
            kw["type"] = tp
        group.add_argument(flag_name(f), **kw)


def options_from_namespace(args: argparse.Namespace, cls: type = LudicServerOptions) -> Any:
    """Build ``cls`` from flags added by :func:`add_option_flags`.

    An absent token falls back to ``$LUDIC_CONTROL_TOKEN``, an empty ``shm_dir`` to the
    default shared-memory folder, and a negative idle spin means "leave vLLM's" (None).
    """
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        v = getattr(args, _dest(f))
        if f.metadata.get("negative_is_none") and v is not None and v < 0:
            v = None
        kw[f.name] = v
    if "control_token" in kw:
        kw["control_token"] = kw["control_token"] or os.environ.get(TOKEN_ENV) or None
    if "shm_dir" in kw and not kw["shm_dir"]:
        from ludic_lab.inference.vllm.weight_transfer.shm import default_shm_dir

        kw["shm_dir"] = default_shm_dir()
    return cls(**kw)


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``; False for ``0.0.0.0``, ``""`` and other hosts."""
    if host is None or host == "":
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind_security(host: str | None, token: str | None) -> None:
    """Refuse a non-loopback bind without a control token (``ValueError`` saying how to fix it)."""
    if not is_loopback(host) and not token:
        raise ValueError(
            f"--host {host or '0.0.0.0'} exposes the weight-update endpoints beyond this machine; "
            "set a control token with --ludic-control-token or $LUDIC_CONTROL_TOKEN "
            "(clients send it as 'Authorization: Bearer <token>'), or bind --host 127.0.0.1"
        )
