"""``ModelParamSpec``: which parameters a served model accepts, and the check of an update.

Names and shapes come from the served checkpoint's safetensors headers (the Hugging Face
state-dict names ``reload_weights`` accepts); the dtype is the one the server computes in.
An update is refused, before any weight is touched, when a name is unknown, a shape or dtype
differs, a name repeats, or it covers only part of a fused vLLM layer (e.g. ``q_proj``
without ``k_proj``/``v_proj``, which vLLM packs into one ``qkv_proj``): loading part of a
fused layer would leave the rest of it undefined.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.inference.vllm.weight_transfer.base import ParamMeta, dtype_name
from ludic_lab.inference.vllm.weight_transfer.shm import read_safetensors_header

_EMBED_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")


class UpdateRejected(ValueError):
    """An update that does not match the served model; its message names the offending params."""


@dataclass(frozen=True)
class ModelParamSpec:
    """Parameters a served model accepts in an update (checkpoint names)."""

    shapes: Mapping[str, tuple[int, ...]]
    """Checkpoint name -> full shape."""
    dtype: str
    """Wire dtype every tensor must have: the dtype the server computes in (``--dtype``)."""
    aliases: Mapping[str, str] = field(default_factory=dict)
    """Accepted extra name -> the checkpoint name it stands for (tied ``lm_head.weight``)."""
    packed_modules: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """vLLM's ``packed_modules_mapping``: fused module -> the checkpoint modules packed in it."""

    @classmethod
    def from_checkpoint(
        cls,
        model_dir: str,
        *,
        dtype: Any,
        packed_modules: Mapping[str, Sequence[str]] | None = None,
        tie_word_embeddings: bool | None = None,
    ) -> ModelParamSpec:
        """Read the spec from the ``*.safetensors`` headers in ``model_dir`` (no tensor is loaded).

        ``tie_word_embeddings`` defaults to the folder's ``config.json``; when true and the
        checkpoint has no ``lm_head.weight``, that name is accepted as an alias of the embedding.
        """
        files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
        if not files:
            raise FileNotFoundError(
                f"no *.safetensors in {model_dir}; weight updates need the served checkpoint in "
                "safetensors format (save_pretrained(..., safe_serialization=True))"
            )
        shapes: dict[str, tuple[int, ...]] = {}
        for f in files:
            for name, (_dt, shape) in read_safetensors_header(f).items():
                shapes[name] = shape
        if tie_word_embeddings is None:
            tie_word_embeddings = _config_ties(model_dir)
        aliases: dict[str, str] = {}
        if tie_word_embeddings and "lm_head.weight" not in shapes:
            embeds = [n for n in shapes if n.endswith(_EMBED_SUFFIXES)]
            if len(embeds) == 1:
                aliases["lm_head.weight"] = embeds[0]
        return cls(shapes, dtype_name(dtype), aliases, {k: tuple(v) for k, v in (packed_modules or {}).items()})

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ModelParamSpec:
        """Inverse of :meth:`to_json` (what ``GET /param_spec`` returns)."""
        return cls(
            {k: tuple(int(d) for d in v) for k, v in obj["params"].items()},
            dtype_name(obj["dtype"]),
            dict(obj.get("aliases") or {}),
            {k: tuple(v) for k, v in (obj.get("packed_modules") or {}).items()},
        )

    # -- lookups -----------------------------------------------------------------------
    def shape_of(self, name: str) -> tuple[int, ...] | None:
        canon = self.aliases.get(name, name)
        return self.shapes.get(canon)

    def group_of(self, name: str) -> str:
        """The vLLM module a checkpoint name loads into (fused modules share one group)."""
        module, _, _param = self.aliases.get(name, name).rpartition(".")
        head, _, last = module.rpartition(".")
        for fused, parts in self.packed_modules.items():
            if last in parts:
                return f"{head}.{fused}" if head else fused
        return module

    def to_json(self) -> dict[str, Any]:
        return {
            "dtype": self.dtype,
            "params": {n: list(s) for n, s in self.shapes.items()},
            "aliases": dict(self.aliases),
            "packed_modules": {k: list(v) for k, v in self.packed_modules.items()},
        }

    # -- validation ----------------------------------------------------------------------
    def check(self, metas: Sequence[ParamMeta]) -> None:
        """Raise :class:`UpdateRejected` naming every offending param; return if ``metas`` is loadable."""
        if not metas:
            raise UpdateRejected("the update lists no params")
        problems: list[str] = []
        seen: dict[str, int] = {}
        for m in metas:
            seen[m.name] = seen.get(m.name, 0) + 1
        dup = [n for n, c in seen.items() if c > 1]
        if dup:
            problems.append(f"repeated names: {_few(dup)}")
        unknown = [m.name for m in metas if self.shape_of(m.name) is None]
        if unknown:
            close = _suggest(unknown[0], self.shapes)
            problems.append(
                f"{len(unknown)} unknown name(s) not in the served model: {_few(unknown)}"
                + (f" (did you mean {close!r}?)" if close else f" (names look like {next(iter(self.shapes))!r})")
            )
        bad_shape = [
            f"{m.name} {list(m.shape)} (expected {list(s)})"
            for m in metas
            if (s := self.shape_of(m.name)) is not None and tuple(m.shape) != tuple(s)
        ]
        if bad_shape:
            problems.append(f"{len(bad_shape)} wrong shape(s): {_few(bad_shape)}")
        bad_dtype = [f"{m.name} {m.dtype}" for m in metas if m.dtype != self.dtype]
        if bad_dtype:
            problems.append(
                f"{len(bad_dtype)} wrong dtype(s): {_few(bad_dtype)}; the server computes in "
                f"{self.dtype}, cast the tensors to {self.dtype} before sending"
            )
        if not problems:
            problems += self._partial_groups(metas)
        if problems:
            raise UpdateRejected("update refused, nothing was loaded: " + "; ".join(problems))

    def _partial_groups(self, metas: Sequence[ParamMeta]) -> list[str]:
        sent = {self.aliases.get(m.name, m.name) for m in metas}
        members: dict[str, set[str]] = {}
        for n in self.shapes:
            members.setdefault(self.group_of(n), set()).add(n)
        out = []
        for g in sorted({self.group_of(n) for n in sent}):
            missing = sorted(members.get(g, set()) - sent)
            if missing:
                out.append(
                    f"vLLM layer {g!r} is loaded as one piece; the update has part of it but lacks {_few(missing)}"
                )
        return out

    def load_plan(self, metas: Sequence[ParamMeta]) -> tuple[list[str], dict[str, str]]:
        """Names to read from the update (in order) and their renames for loading.

        A tied alias is loaded as the embedding when the embedding itself is absent, and
        skipped when both are present (they are one tensor in a tied model).
        """
        names = [m.name for m in metas]
        present = set(names)
        order, rename = [], {}
        for n in names:
            canon = self.aliases.get(n)
            if canon is None:
                order.append(n)
            elif canon not in present:
                order.append(n)
                rename[n] = canon
        return order, rename

    def covers_all(self, metas: Sequence[ParamMeta]) -> bool:
        """Whether the update replaces every parameter of the checkpoint."""
        sent = {self.aliases.get(m.name, m.name) for m in metas}
        return set(self.shapes) <= sent


def _config_ties(model_dir: str) -> bool:
    try:
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return False
    tie = cfg.get("tie_word_embeddings")
    if tie is None and isinstance(cfg.get("text_config"), dict):
        tie = cfg["text_config"].get("tie_word_embeddings")
    return bool(tie)


def _few(items: Sequence[str], n: int = 5) -> str:
    shown = ", ".join(repr(x) if " " not in x else x for x in list(items)[:n])
    return shown + (f" ... (+{len(items) - n} more)" if len(items) > n else "")


def _suggest(name: str, known: Mapping[str, Any]) -> str | None:
    import difflib

    hits = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return hits[0] if hits else None
