"""``save_policy``: keep a trained policy as folders every backend loads as they are.

``save_policy(trainer, "out/policy")`` writes

- ``out/policy/``: the merged model (``config.json``, ``*.safetensors``, the generation
  config, the tokenizer files and its chat template), loaded by
  ``AutoModelForCausalLM.from_pretrained``, ``LocalChatClient(path)``, the bundled vLLM server
  and so ``OpenAIEndpoint(LocalChatClient(path))``;
- ``out/policy/adapter/`` (LoRA only): the adapter in PEFT's format (``adapter_config.json``,
  ``adapter_model.safetensors``, plus the tokenizer), for ``PeftModel.from_pretrained(base, ...)``
  or vLLM's ``--enable-lora``;
- ``out/policy/saved_policy.json``: the step, the policy version, what was written and any
  ``extra`` (e.g. the metric :class:`~ludic_lab.saving.callbacks.KeepBest` kept it for).

The merged weights are the very tensors a publish sends the sampler (``training.lora``'s
``policy_state_dict``: ``W + scaling * B @ A`` per adapted linear, the rest as trained), so the
saved model samples exactly what the sampler did after the last step. Folders are written
aside (``.<name>.tmp-<host>-<pid>-<n>``) and renamed into place: a crash never leaves a
half-written policy under ``path``, and the next save into that parent folder removes the
copies such a crash left (those of processes of this host that are gone; a policy moved aside
for the swap is put back when nothing replaced it). ``overwrite=True`` replaces a saved
policy's own files only: a folder that also holds anything else (the user's files, another
saved policy) is refused, naming what is there.
"""

from __future__ import annotations

import fnmatch
import json
import os
import random
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# torch, transformers and peft are imported where a save needs them: the callbacks and
# check_destination (a preflight check) load in well under a second

MARKER = "saved_policy.json"
"""Written last into a saved policy folder: what is there, and from which step."""

ADAPTER_DIR = "adapter"
"""The LoRA adapter's sub-folder of a saved policy."""


@dataclass(frozen=True)
class SavedPolicy:
    """Where :func:`save_policy` wrote: ``merged`` / ``adapter`` are ``None`` when not written."""

    path: Path
    """The policy folder (the merged model when ``merged`` is set)."""
    merged: Path | None
    """The merged model folder (``path`` itself)."""
    adapter: Path | None
    """The PEFT adapter folder (``path / "adapter"``)."""
    step: int | None
    """The trainer's optimizer step (``None`` for a bare model)."""
    policy_version: int | None
    """The policy version the sampler had after the last publish (``None`` for a bare model)."""


def save_policy(
    trainer_or_model: Any,
    path: str | os.PathLike[str],
    *,
    merged: bool = True,
    adapter: bool | None = None,
    tokenizer: Any = None,
    overwrite: bool = False,
    extra: dict[str, Any] | None = None,
) -> SavedPolicy:
    """Save a trained policy (a ``Trainer``, or a Hugging Face / peft model) under ``path``.

    ``merged``: the dense model; ``adapter``: the LoRA adapter (default: when the model has
    LoRA). ``tokenizer``: a tokenizer or its folder (default: the model's ``name_or_path``).
    ``overwrite=True`` replaces an earlier saved policy (never another folder). Under FSDP every
    rank calls it (the weights are gathered); rank 0 writes, the others wait for it.
    """
    from ludic_lab.training.lora import is_peft_model

    model, step, version, rank, root = _source(trainer_or_model)
    lora = is_peft_model(model)
    adapter = lora if adapter is None else adapter
    if adapter and not lora:
        raise ValueError("adapter=True needs a LoRA model (a full fine-tune has no adapter): pass adapter=False")
    if not (merged or adapter):
        raise ValueError("nothing to save: merged=False and adapter=False; ask for at least one")
    dest = Path(path).expanduser()
    if rank == 0:
        remove_stale_copies(dest.parent)
    check_destination(dest, overwrite=overwrite)
    tok = _tokenizer(model, tokenizer)
    full = _gather(root)  # collective under FSDP; None in one process
    if rank == 0:
        tmp = dest.parent / _aside_name(dest.name, "tmp")
        try:
            tmp.mkdir(parents=True)
            if merged:
                _write_merged(model, full, tok, tmp)
            if adapter:
                _write_adapter(model, full, tok, tmp / ADAPTER_DIR)
            info: dict[str, Any] = {"step": step, "policy_version": version, "merged": merged, "adapter": bool(adapter)}
            info["base_model"] = _name_or_path(model)
            info["files"] = sorted(f.relative_to(tmp).as_posix() for f in tmp.rglob("*") if not f.is_dir())
            (tmp / MARKER).write_text(json.dumps({**info, **(extra or {})}, indent=2, default=str) + "\n")
            _swap_into_place(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # gone already when the rename succeeded
    if root is not None:
        import torch.distributed as dist

        dist.barrier()  # the other ranks return once the folder is there
    return SavedPolicy(dest, dest if merged else None, dest / ADAPTER_DIR if adapter else None, step, version)


def _source(obj: Any) -> tuple[Any, int | None, int | None, int, Any]:
    """``(model, step, policy_version, rank, FSDP root or None)`` of a trainer or a model."""
    if hasattr(obj, "data_parallel") and hasattr(obj, "policy_state_dict"):  # a Trainer
        return obj.model, int(obj.step), int(obj.policy_version), int(obj.rank), obj.data_parallel.root
    if not callable(getattr(obj, "save_pretrained", None)):
        raise TypeError(
            f"save_policy needs a Trainer or a Hugging Face model (with save_pretrained), got {type(obj).__name__}"
        )
    return obj, None, None, 0, None


def check_destination(path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
    """Raise ``FileExistsError`` where :func:`save_policy` would: ``path`` is a file, a non-empty
    folder (without ``overwrite``), or a non-empty folder it did not write (``overwrite`` replaces
    saved policies only). Loads nothing: a run checks its destination before it trains."""
    dest = Path(path).expanduser()
    if dest.exists() and not dest.is_dir():
        raise FileExistsError(f"{dest} is a file; save_policy writes a folder: pass another path")
    if not dest.is_dir() or not any(dest.iterdir()):
        return
    if not overwrite:
        raise FileExistsError(
            f"{dest} exists and is not empty: pass overwrite=True to replace an earlier saved policy, or another path"
        )
    if not (dest / MARKER).is_file():
        raise FileExistsError(
            f"{dest} is not empty and holds no {MARKER}: overwrite=True replaces only folders save_policy "
            "wrote; empty it yourself or pass another path"
        )
    others = _not_written_by_save(dest)
    if others:
        shown = ", ".join(others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8 else "")
        raise FileExistsError(
            f"{dest} holds a saved policy and also {shown}, which save_policy did not write there: overwrite=True "
            "replaces only a saved policy's own files and would delete these; move them out, or pass another path"
        )


_POLICY_FILES = (
    "config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
    "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "chat_template.jinja", "chat_template.json", f"{ADAPTER_DIR}/adapter_config.json",
    f"{ADAPTER_DIR}/README.md", f"{ADAPTER_DIR}/*.safetensors", f"{ADAPTER_DIR}/tokenizer.json",
    f"{ADAPTER_DIR}/tokenizer_config.json", f"{ADAPTER_DIR}/tokenizer.model", f"{ADAPTER_DIR}/special_tokens_map.json",
    f"{ADAPTER_DIR}/added_tokens.json", f"{ADAPTER_DIR}/vocab.json", f"{ADAPTER_DIR}/merges.txt",
    f"{ADAPTER_DIR}/chat_template.jinja", f"{ADAPTER_DIR}/chat_template.json",
)  # fmt: skip
"""What a saved policy's folder holds, for a ``saved_policy.json`` written before it listed its ``files``."""


def _not_written_by_save(dest: Path) -> list[str]:
    """The entries of the saved policy folder ``dest`` that its save did not write (the
    ``files`` its marker lists; older markers: :data:`_POLICY_FILES`), as top-level names
    (``name/`` for a folder, ``(a saved policy)`` where one is inside)."""
    try:
        listed = json.loads((dest / MARKER).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    written = {str(f) for f in listed} if isinstance(listed, list) else None
    found: dict[str, str] = {}
    for f in sorted(dest.rglob("*")):
        rel = f.relative_to(dest).as_posix()
        if rel == MARKER or (f.is_dir() and not f.is_symlink()):
            continue
        ours = rel in written if written is not None else any(fnmatch.fnmatchcase(rel, p) for p in _POLICY_FILES)
        if not ours:
            top = rel.split("/")[0]
            nested = (dest / top).is_dir() and not (dest / top).is_symlink()
            found[top] = f"{top}/" if nested else top
            if nested and any((dest / top).rglob(MARKER)):
                found[top] = f"{top}/ (a saved policy)"
    return list(found.values())


_HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"
_ASIDE = re.compile(r"\.(?P<name>.+)\.(?P<kind>tmp|old)-(?:(?P<host>[A-Za-z0-9._]+)-)?(?P<pid>\d+)-\d+")


def _aside_name(name: str, kind: str) -> str:
    """The hidden name of a folder this process writes (``tmp``) or moves aside (``old``) beside ``name``."""
    return f".{name}.{kind}-{_HOST}-{os.getpid()}-{random.randrange(1 << 30)}"


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


def remove_stale_copies(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove the hidden copies that saves into ``folder`` killed mid-way left (``.<name>.tmp-*``:
    a new policy being written; ``.<name>.old-*``: the policy it replaced), where the process that
    made them is gone and ran on this host. A moved-aside policy whose folder is missing (killed
    between the two renames) is renamed back instead. Returns what was removed or put back."""
    root = Path(folder)
    done: list[Path] = []
    if not root.is_dir():
        return done
    for entry in sorted(root.iterdir()):
        m = _ASIDE.fullmatch(entry.name)
        if m is None or m["host"] not in (None, _HOST) or not _process_gone(int(m["pid"])):
            continue
        try:
            if not entry.is_dir() or entry.is_symlink() or entry.stat().st_uid != os.geteuid():
                continue
            home = root / m["name"]
            if m["kind"] == "old" and not home.exists() and (entry / MARKER).is_file():
                os.rename(entry, home)  # the save died between its two renames: the old policy goes back
            else:
                shutil.rmtree(entry)
        except OSError:
            continue
        done.append(entry)
    return done


def _tokenizer(model: Any, tokenizer: Any) -> Any:
    """The tokenizer to save next to the weights: given, loaded from a given folder, or from
    the folder the model was loaded from; a clear error when there is none."""
    if tokenizer is not None and callable(getattr(tokenizer, "save_pretrained", None)):
        return tokenizer
    from transformers import AutoTokenizer

    where = os.fspath(tokenizer) if tokenizer is not None else _name_or_path(model)
    hint = "pass tokenizer= (a tokenizer, or the folder of the model it was trained from)"
    if tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike)):
        raise TypeError(f"tokenizer must be a tokenizer or a folder, got {type(tokenizer).__name__}")
    if not where:
        raise ValueError(f"cannot find the tokenizer: the model has no name_or_path; {hint}")
    if not Path(where).is_dir():
        raise ValueError(f"cannot find the tokenizer: {where} is not a local folder; {hint}")
    try:
        return AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot load a tokenizer from {where} ({e}); {hint}") from e


def _name_or_path(model: Any) -> str:
    from ludic_lab.training.lora import is_peft_model

    base = model.get_base_model() if is_peft_model(model) else model
    return str(getattr(getattr(base, "config", None), "_name_or_path", "") or "")


def _gather(root: Any) -> dict[str, Any] | None:
    """The full state dict gathered on rank 0 under FSDP (``{}`` elsewhere); ``None`` in one process."""
    if root is None:
        return None
    from ludic_lab.distributed.fsdp import gather_full_state_dict

    return gather_full_state_dict(root)


def merged_state_dict(model: Any, full: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every weight of the merged policy, named as the plain model names them: the published
    weights (merged LoRA linears, or the whole model) over the base model's own. ``full``:
    the peft model's gathered state dict (FSDP), else the model's own tensors are read."""
    from ludic_lab.training.lora import is_peft_model, policy_state_dict, policy_state_dict_from_full

    published = policy_state_dict(model) if full is None else policy_state_dict_from_full(model, full)
    if not is_peft_model(model):
        return _untie(model, dict(published))
    own = model.get_base_model().state_dict() if full is None else _strip_prefix(model, full)
    out: dict[str, Any] = {}
    for name, tensor in own.items():
        parts = name.split(".")
        if any(p.startswith("lora_") for p in parts):
            continue  # adapter tensors: merged into the published weights
        out[".".join(p for p in parts if p != "base_layer")] = tensor
    missing = [k for k in published if k not in out]
    if missing:
        raise KeyError(f"merged weights with no base weight of that name: {missing[:5]}")
    out.update(published)
    return _untie(model.get_base_model(), out)


def _untie(base: Any, weights: dict[str, Any]) -> dict[str, Any]:
    """``weights`` without the output embedding when the config ties it to the input embedding:
    loaders take it from there (and a gathered copy under FSDP no longer shares its storage)."""
    get_out = getattr(base, "get_output_embeddings", None)
    if not getattr(getattr(base, "config", None), "tie_word_embeddings", False) or not callable(get_out):
        return weights
    out = get_out()
    for name, module in base.named_modules():
        if out is not None and module is out:
            weights.pop(f"{name}.weight", None)
    return weights


def _strip_prefix(model: Any, full: dict[str, Any]) -> dict[str, Any]:
    """``full`` (named as in the peft model) named as in its base model."""
    base = model.get_base_model()
    prefix = next((f"{n}." for n, m in model.named_modules() if m is base and n), "")
    return {k[len(prefix) :]: v for k, v in full.items() if k.startswith(prefix)}


def _write_merged(model: Any, full: dict[str, Any] | None, tokenizer: Any, folder: Path) -> None:
    from ludic_lab.training.lora import is_peft_model

    base = model.get_base_model() if is_peft_model(model) else model
    base.save_pretrained(folder, state_dict=merged_state_dict(model, full))
    tokenizer.save_pretrained(folder)


def _write_adapter(model: Any, full: dict[str, Any] | None, tokenizer: Any, folder: Path) -> None:
    model.save_pretrained(folder, **({} if full is None else {"state_dict": full}))
    tokenizer.save_pretrained(folder)


def _swap_into_place(tmp: Path, dest: Path) -> None:
    """Rename ``tmp`` to ``dest``; an existing ``dest`` is renamed aside first, then deleted."""
    old = None
    if dest.exists():
        old = dest.parent / _aside_name(dest.name, "old")
        os.rename(dest, old)
    os.rename(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
