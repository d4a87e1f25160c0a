"""Model resolution: a name (``"default"``, ``"gemma3-270m"``, ``"tiny"``) or a local folder -> a folder path."""

from __future__ import annotations

import os
from pathlib import Path

from ludic_lab.inference.models.cache import ModelNotAvailableError, PathLike
from ludic_lab.inference.models.gemma import gemma3_model_path
from ludic_lab.inference.models.gguf import default_model_path
from ludic_lab.inference.models.tiny import tiny_model_path

MODEL_ALIASES_DEFAULT = frozenset({"default", "smollm2", "smollm2-135m-instruct"})
MODEL_ALIASES_TINY = frozenset({"tiny"})
MODEL_ALIASES_GEMMA3 = frozenset({"gemma3-270m", "gemma-3-270m", "gemma3"})


def resolve_model(name_or_path: PathLike | None = None, *, cache_dir: PathLike | None = None) -> str:
    """Map a model name or folder to a local folder path that ``from_pretrained`` loads.

    ``None`` / ``"default"`` / ``"smollm2"`` -> :func:`default_model_path`; ``"gemma3-270m"`` /
    ``"gemma3"`` -> :func:`gemma3_model_path`; ``"tiny"`` -> :func:`tiny_model_path`; an
    existing model folder -> itself. Anything else raises.
    """
    if name_or_path is None:
        return default_model_path(cache_dir)
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"model must be a name or a folder path, got {type(name_or_path).__name__}")
    raw = os.fspath(name_or_path)
    key = raw.strip().lower()
    if key in MODEL_ALIASES_DEFAULT:
        return default_model_path(cache_dir)
    if key in MODEL_ALIASES_TINY:
        return tiny_model_path(cache_dir)
    if key in MODEL_ALIASES_GEMMA3:
        return gemma3_model_path(cache_dir)
    path = Path(raw).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotAvailableError(
                f"{path} is a folder but has no config.json; pass a folder written by "
                "save_pretrained (config.json, *.safetensors, tokenizer files)"
            )
        return str(path)
    if path.exists():
        raise ModelNotAvailableError(
            f"{path} is a file; pass the folder that holds config.json and the weights "
            "(for a GGUF file, convert it once as ludic_lab.inference.models does for SmolLM2)"
        )
    raise ModelNotAvailableError(
        f"cannot resolve model {raw!r}: no such local folder, and there is no model hub here "
        "(weights are never downloaded). Pass a local folder written by save_pretrained, or "
        "'default' (SmolLM2-135M-Instruct), 'gemma3-270m' (Gemma 3 270M) or 'tiny' (a random test model)."
    )
