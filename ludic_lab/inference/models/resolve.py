"""Model resolution: a name (``"default"``, ``"gemma3-270m"``, ``"tiny"``) or a local folder -> a folder path."""

from __future__ import annotations

import json
import os
import struct
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


def _safetensors_problem(file: Path) -> str | None:
    """Why the safetensors ``file`` cannot load (missing, cut short, no header), else ``None``;
    reads its header only (the tensors' byte ranges say how long the file must be)."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8)) if size >= 8 else (0,)
            header = json.loads(f.read(n)) if 0 < n <= size - 8 else None
    except FileNotFoundError:
        return f"{file.name} is missing"
    except (OSError, ValueError, struct.error) as e:
        return f"{file.name} cannot be read ({e})"
    if not isinstance(header, dict):
        return f"{file.name} has no readable safetensors header ({size} bytes): it is cut short or not safetensors"
    ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    need = 8 + n + max(ends, default=0)
    if size < need:
        return f"{file.name} is cut short ({size:,} of {need:,} bytes: a copy or save that did not finish)"
    return None


def check_weights(folder: PathLike) -> None:
    """Raise :class:`ModelNotAvailableError` naming ``folder`` and what is wrong when its weights
    cannot load: none there, a ``*.safetensors`` file cut short, a shard its index names missing.
    Reads headers only (well under a second), so a command refuses the folder before loading."""
    path = Path(folder)
    index = path / "model.safetensors.index.json"
    if (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    elif index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelNotAvailableError(f"{path}: {index.name} is not a readable index of the weights ({e})") from e
        files = [path / name for name in shards]
    elif (path / "pytorch_model.bin").is_file() or (path / "pytorch_model.bin.index.json").is_file():
        return  # the older format: transformers reads it (no header to check without loading it)
    else:
        raise ModelNotAvailableError(
            f"{path} holds config.json but no weights (model.safetensors, sharded *.safetensors with "
            "model.safetensors.index.json, or pytorch_model.bin); pass a folder written by save_pretrained or "
            "save_policy"
        )
    problems = [why for why in map(_safetensors_problem, files) if why is not None]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ModelNotAvailableError(f"{path}: {problems[0]}{more}; copy or save the model again")
