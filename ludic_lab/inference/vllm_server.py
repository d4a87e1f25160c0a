"""The bundled vLLM server's reference module path (Ludic's ``inference/vllm_server.py``):

    python -m ludic_lab.inference.vllm_server --model <dir> [vLLM flags] [--ludic-... flags]

The server lives in :mod:`ludic_lab.inference.vllm.server` (see
:mod:`ludic_lab.inference.vllm.server.main` for the routes and flags); this module re-exports
its public names and runs it.
"""

from ludic_lab.inference.vllm.server.main import (
    CONTROL_PATHS as CONTROL_PATHS,
    GENERATION_PATHS as GENERATION_PATHS,
    TOKEN_ENV as TOKEN_ENV,
    VERSION_HEADER as VERSION_HEADER,
    WORKER_EXTENSION as WORKER_EXTENSION,
    ControlError as ControlError,
    DrainTimeout as DrainTimeout,
    LudicControlPlane as LudicControlPlane,
    LudicMiddleware as LudicMiddleware,
    LudicServerOptions as LudicServerOptions,
    VersionGate as VersionGate,
    build_parser as build_parser,
    main,
    options_from_args as options_from_args,
)

if __name__ == "__main__":
    main()
