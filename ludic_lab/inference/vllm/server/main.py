"""The bundled vLLM server: vLLM's OpenAI API plus live weight updates and policy versions.

    python -m ludic_lab.inference.vllm_server --model <dir> [vLLM flags] [--ludic-... flags]

Contract details beyond the first draft of the HTTP contract: an update's dtypes must equal
the served ``--dtype`` (cast before sending; ``GET /param_spec`` says which); an update may
cover part of the model, but only whole vLLM layers (``q_proj`` needs ``k_proj``/``v_proj``,
``gate_proj`` needs ``up_proj``, a weight needs its bias); a tied ``lm_head.weight`` is
accepted and loaded as the embedding; the shm ``location`` must lie in the server's
shared-memory folder; added routes ``GET /param_spec`` and ``POST /validate_param_batch``;
503 when in-flight requests do not finish within ``--ludic-drain-timeout`` (nothing changed)
or after a load that failed half-way (generation refused until a complete update succeeds);
a configured token is enforced on loopback binds too. NCCL: trainer rank 0, workers after it.

Every vLLM flag works unchanged. Defaults that differ from ``vllm serve``: ``--host
127.0.0.1``, ``--logprobs-mode processed_logprobs`` (returned logprobs are those of the
distribution actually sampled from), ``--worker-extension-cls``
:class:`~ludic_lab.inference.vllm.server.worker.LudicWorkerExtension` (a subclass may be passed), and
the worker's idle busy-wait: 20 ms instead of 1 s (``--ludic-worker-idle-spin``; a trainer on
the same host gets the core back once generation stops).

HTTP routes added to vLLM's (``GET /health`` is vLLM's own):

- ``GET /runtime_version`` -> ``{"version": int, "inflight_requests": int, "update_pending":
  bool}`` (generations admitted and not answered; an update holding admission closed);
  ``GET /get_num_background_tasks`` ->
  ``{"num_background_tasks": int}`` (weight operations in progress); ``GET /param_spec`` ->
  the names/shapes/dtype an update must match.
- ``POST /init_communicator`` ``{"transport": "shm"|"nccl", "host", "port", "world_size",
  "packed"?}`` -> ``{"ok": true, "transport": ..., "shm_dir"?}``; ``POST /close_communicator``.
- ``POST /update_param_batch`` ``{"version": int|null, "transport": "shm"|"nccl",
  "location": "/dev/shm/<file>.safetensors" (shm), "keep"?: bool, "params": [{"name","dtype","shape"}]}``
  -> ``{"version", "num_params", "seconds", "load_seconds", "load_mode", "phases",
  "drained_requests", ...}``. Every name, shape and dtype (the
  served ``--dtype``) is checked before any weight is touched (400 ``{"error": ...}`` naming
  the params; the old weights keep serving). Then admission of generation requests stops,
  in-flight ones finish, the engine pauses, the workers load the weights in place (CPU:
  zero-copy from the file and vLLM's re-packing, verified against ``reload_weights`` the
  first time; otherwise ``reload_weights``; ``--ludic-weight-load reload`` forces the
  latter), the prefix cache is reset, the version becomes ``version`` (or +1), and
  admission resumes. The shm file is deleted by the server, on error too, unless
  ``"keep": true`` (a sender's reused staging buffer, which the sender deletes).
  ``POST /validate_param_batch`` is the same check without loading (NCCL senders call it
  first so a refused update never leaves them broadcasting).
- ``POST /reset_prefix_cache`` -> ``{"ok": true}`` (between requests, like an update).
- Responses of the generation routes carry ``X-Ludic-Policy-Version``: the version at
  admission (in ``drain`` mode no update runs while the request is in flight, so the whole
  response was sampled under it).
- ``--ludic-weight-update in_flight`` (or ``"weight_update": "in_flight"`` in an update's
  body): an update does not drain; it pauses the engine with running requests frozen, loads,
  bumps the version and resumes them under the new weights (``--ludic-in-flight-kv keep``:
  their KV from the old weights is kept; ``recompute``: they are prefilled again). vLLM labels
  each engine step with the version, so each non-streamed ``/v1/completions`` choice carries
  ``policy_version`` (its oldest token's) and, when an update landed mid-completion,
  ``token_versions`` (one per completion token). The answer has ``"weight_update"``,
  ``"inflight_requests"`` (generations that continued across it), ``"in_flight_kv"`` and
  ``"prefix_cache_reset"``.

The control-plane POST routes need ``Authorization: Bearer <token>`` when a token is set
(``--ludic-control-token`` or ``$LUDIC_CONTROL_TOKEN``); a server bound to anything but a
loopback address refuses to start without one.

This module parses the command line and hands over to vLLM's own ``run_server``. The parts:
:mod:`~ludic_lab.inference.vllm.server.options` (the ``--ludic-*`` flags, generated from
:class:`LudicServerOptions`; the bind rule), :mod:`~ludic_lab.inference.vllm.server.version` (the
vLLM version gate), :mod:`~ludic_lab.inference.vllm.server.routes` (an ``APIRouter`` with pydantic
bodies, mounted on vLLM's app as an endpoint plugin), :mod:`~ludic_lab.inference.vllm.server.control`
(the handlers' state and logic), :mod:`~ludic_lab.inference.vllm.server.admission` (admission gate,
version header, token check), :mod:`~ludic_lab.inference.vllm.server.patches` (every reach into vLLM
internals, with the versions and upstream issues each is for) and
:mod:`~ludic_lab.inference.vllm.server.worker` (the worker side).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from ludic_lab.inference.vllm.server.admission import (  # noqa: F401 - re-exported: the server's public names
    CONTROL_PATHS,
    GENERATION_PATHS,
    VERSION_HEADER,
    DrainTimeout,
    LudicMiddleware,
    VersionGate,
)
from ludic_lab.inference.vllm.server.control import WORKER_RECHECK_S, ControlError, LudicControlPlane  # noqa: F401
from ludic_lab.inference.vllm.server.options import (  # noqa: F401
    TOKEN_ENV,
    LudicServerOptions,
    add_option_flags,
    check_bind_security,
    is_loopback,
    options_from_namespace,
)

logger = logging.getLogger("vllm.ludic")  # a child of vLLM's logger: same handlers and format

WORKER_EXTENSION = "ludic_lab.inference.vllm.server.worker.LudicWorkerExtension"


def build_parser() -> argparse.ArgumentParser:
    """vLLM's server parser with our defaults and ``--ludic-...`` flags."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description=__doc__.split("\n", 1)[0]))
    add_option_flags(parser)
    parser.set_defaults(host="127.0.0.1", logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION)
    return parser


def options_from_args(args: argparse.Namespace) -> LudicServerOptions:
    """Our options from parsed args; checks the bind/token rule and the worker extension."""
    opts = options_from_namespace(args)
    if not getattr(args, "uds", None):
        check_bind_security(args.host, opts.control_token)
    check_worker_extension(args.worker_extension_cls)
    return opts


def check_worker_extension(qualname: str) -> None:
    """``--worker-extension-cls`` must name :class:`LudicWorkerExtension` or a subclass."""
    if qualname == WORKER_EXTENSION:
        return
    import importlib

    from ludic_lab.inference.vllm.server.worker import LudicWorkerExtension

    module, _, name = qualname.rpartition(".")
    cls = getattr(importlib.import_module(module), name, None) if module else None
    if not (isinstance(cls, type) and issubclass(cls, LudicWorkerExtension)):
        raise ValueError(f"--worker-extension-cls {qualname} must subclass {WORKER_EXTENSION}")


async def run_server(args: argparse.Namespace, opts: LudicServerOptions) -> None:
    """Serve until SIGINT/SIGTERM: vLLM's own ``run_server``, the ludic routes handed to it
    as an endpoint plugin."""
    from vllm.entrypoints.launchers.api_server.entry import run_server as vllm_run_server

    from ludic_lab.inference.vllm.server.patches import serve_with_endpoints
    from ludic_lab.inference.vllm.server.routes import LudicEndpoints

    with serve_with_endpoints(LudicEndpoints(LudicControlPlane(None, opts))):
        await vllm_run_server(args)


def main(argv: list[str] | None = None) -> None:
    """Parse vLLM's flags plus ours and serve (``python -m ludic_lab.inference.vllm_server``)."""
    from ludic_lab.inference.vllm.server.version import VLLMVersionError, check_vllm_version, installed_vllm_version

    # the bind rule first, before the (slow) vLLM import
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--host", default="127.0.0.1")
    pre.add_argument("--uds", default=None)
    pre.add_argument("--ludic-control-token", "--ludic_control_token", default=None)
    known, _ = pre.parse_known_args(argv)
    if not known.uds:
        try:
            check_bind_security(known.host, known.ludic_control_token or os.environ.get(TOKEN_ENV))
        except ValueError as e:
            sys.exit(f"error: {e}")
    from ludic_lab.inference.launch.server import _cuda_available

    if not _cuda_available():  # as start_vllm_server: else vLLM's CPU backend wants 92% of RAM free
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        warning = check_vllm_version(installed_vllm_version())
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    except (VLLMVersionError, ImportError) as e:
        sys.exit(f"error: {e}")
    import uvloop
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    args = build_parser().parse_args(argv)
    if getattr(args, "model_tag", None):
        args.model = args.model_tag
    configure_logging_from_args(args)
    if warning:
        logger.warning("ludic: %s", warning)
    validate_parsed_serve_args(args)
    try:
        opts = options_from_args(args)
    except ValueError as e:
        sys.exit(f"error: {e}")
    uvloop.run(run_server(args, opts))


if __name__ == "__main__":
    main()
