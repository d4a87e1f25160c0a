"""The bundled vLLM server's reference module path (Ludic's ``inference/vllm_server.py``):

    python -m ludic_lab.inference.vllm_server --model <dir> [vLLM flags] [--ludic-... flags]

The server lives in :mod:`ludic_lab.inference.vllm.server` (see
:mod:`ludic_lab.inference.vllm.server.main` for the routes and flags); this module re-exports
its public names and runs it.
"""

from ludic_lab.inference.vllm.server.main import (
    CONTROL_PATHS,
    GENERATION_PATHS,
    TOKEN_ENV,
    VERSION_HEADER,
    WORKER_EXTENSION,
    ControlError,
    DrainTimeout,
    LudicControlPlane,
    LudicMiddleware,
    LudicServerOptions,
    VersionGate,
    build_parser,
    main,
    options_from_args,
)

__all__ = [
    "CONTROL_PATHS",
    "GENERATION_PATHS",
    "TOKEN_ENV",
    "VERSION_HEADER",
    "WORKER_EXTENSION",
    "ControlError",
    "DrainTimeout",
    "LudicControlPlane",
    "LudicMiddleware",
    "LudicServerOptions",
    "VersionGate",
    "build_parser",
    "main",
    "options_from_args",
]

if __name__ == "__main__":
    main()
