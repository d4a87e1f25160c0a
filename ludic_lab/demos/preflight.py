"""What ``ludic-lab demo`` checks before it loads anything: presets and groups, lengths, the
device, folders, the model, packages and LoRA targets (each a ``ValueError`` or a
:class:`~ludic_lab.extras.MissingExtraError` naming the flag and the fix, in well under a second).

:meth:`ludic_lab.demo.DemoConfig.preflight` runs them; nothing here imports torch at module level.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ludic_lab.training.algorithm import PRESETS, RLAlgorithm, make_preset

if TYPE_CHECKING:
    from ludic_lab.demo import DemoConfig

GROUP_PRESETS = frozenset({"rloo", "grpo", "dr_grpo", "dapo", "gspo", "cispo", "scalerl"})
"""Presets whose credit compares each sample with the other samples of its question
(``GroupNormalizedReturn``, ``LeaveOneOutReturn``, ``HybridNormalizedReturn``): a group of one
has no baseline, so they need ``group_size >= 2``. Named here so that checking a config
builds no loss (the losses import torch); tests/test_demo_validation.py checks the names
against the presets' credit assigners, and :func:`needs_groups` builds a preset it does not know."""
PER_SAMPLE_PRESETS = frozenset({"reinforce", "reinforce_baseline", "sft"})
"""Presets whose credit reads each sample alone (``MonteCarloReturn``, ``ConstantCredit``)."""
VLLM_MAX_MODEL_LEN = 1024
"""Context length the demo's vLLM server is started with (prompt + completion)."""


def needs_groups(algo: str) -> bool:
    """Whether preset ``algo``'s credit assigner needs groups of two or more samples."""
    if algo in GROUP_PRESETS:
        return True
    if algo in PER_SAMPLE_PRESETS or algo not in PRESETS:
        return False
    from ludic_lab.rollouts.credit import GroupNormalizedReturn, HybridNormalizedReturn, LeaveOneOutReturn

    credit = build_algorithm(algo, max_tokens=1).credit_assigner  # a preset added since: ask it
    return isinstance(credit, (GroupNormalizedReturn, HybridNormalizedReturn, LeaveOneOutReturn))


def build_algorithm(algo: str, *, max_tokens: int) -> RLAlgorithm:
    """Preset ``algo`` as the demo runs it (``dr_grpo`` normalises by ``max_tokens``)."""
    return make_preset(algo, max_tokens=max_tokens)


def check_model(model: str) -> None:
    """A local model folder, or a name :func:`~ludic_lab.inference.models.resolve_model` knows,
    whose files are there (nothing is materialised or loaded here)."""
    from ludic_lab.extras import MissingExtraError
    from ludic_lab.inference.models import (
        DEFAULT_MODEL_NAME,
        GEMMA3_MODEL_NAME,
        MODEL_ALIASES_DEFAULT,
        MODEL_ALIASES_GEMMA3,
        MODEL_ALIASES_TINY,
        ModelNotAvailableError,
        cache_root,
        gemma3_gguf_path,
        is_materialized,
        resolve_model,
        smollm2_gguf_path,
    )

    key = model.strip().lower()
    if key in MODEL_ALIASES_TINY:
        return  # built in about a second on first use
    try:
        if key in MODEL_ALIASES_DEFAULT:
            if not is_materialized(cache_root() / "models" / DEFAULT_MODEL_NAME):
                smollm2_gguf_path()  # the package it is materialised from
            return
        if key in MODEL_ALIASES_GEMMA3:
            if not is_materialized(cache_root() / "models" / GEMMA3_MODEL_NAME):
                gemma3_gguf_path()  # the package it is materialised from (assembles its GGUF)
            return
    except ModelNotAvailableError as e:
        raise MissingExtraError(f"--model {model}: {e}") from e
    from ludic_lab.inference.models.resolve import check_weights

    try:
        check_weights(resolve_model(model))  # a folder: checks the files (weights: their headers) only
    except ModelNotAvailableError as e:
        raise ValueError(f"DemoConfig.model: {e}") from e


def check_packages(cfg: DemoConfig) -> None:
    """The packages the backend and LoRA import, as one line naming the install."""
    import importlib.util

    from ludic_lab.extras import EXTRA_MODULES, MissingExtraError, install_hint

    if cfg.backend == "vllm":
        for mod in EXTRA_MODULES["vllm"]:
            if importlib.util.find_spec(mod) is None:
                raise MissingExtraError(
                    f"ludic-lab demo --backend vllm needs the 'vllm' extra (no module named {mod!r}): "
                    f"{install_hint('vllm')}; or run with --backend local (in-process sampling, no vLLM)"
                )
        from ludic_lab.inference.vllm.server.version import VLLMVersionError, check_vllm_version, installed_vllm_version

        try:
            check_vllm_version(installed_vllm_version())
        except VLLMVersionError as e:
            found = str(e).split(";")[0]  # its own hint names the wheel; the clone's comes from install_hint
            raise MissingExtraError(f"ludic-lab demo --backend vllm: {found}; {install_hint('vllm')}") from e
    if cfg.trainer.lora_r > 0 and importlib.util.find_spec("peft") is None:
        raise MissingExtraError(
            f"ludic-lab demo with --lora-r {cfg.trainer.lora_r} needs the 'lora' extra (no module named 'peft'): "
            f"{install_hint('lora')}; or --lora-r 0 to train every weight"
        )


def _model_folder(model: str) -> Path | None:
    """The folder ``model`` resolves to when its files exist already (nothing is built)."""
    from ludic_lab.inference.models import (
        DEFAULT_MODEL_NAME,
        GEMMA3_MODEL_NAME,
        MODEL_ALIASES_DEFAULT,
        MODEL_ALIASES_GEMMA3,
        MODEL_ALIASES_TINY,
        TINY_MODEL_NAME,
        cache_root,
        is_materialized,
    )

    key = model.strip().lower()
    if key not in MODEL_ALIASES_DEFAULT | MODEL_ALIASES_TINY | MODEL_ALIASES_GEMMA3:
        return Path(model).expanduser()
    name = (
        DEFAULT_MODEL_NAME
        if key in MODEL_ALIASES_DEFAULT
        else GEMMA3_MODEL_NAME
        if key in MODEL_ALIASES_GEMMA3
        else TINY_MODEL_NAME
    )
    folder = cache_root() / "models" / name
    return folder if is_materialized(folder) else None


def _weight_shapes(folder: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from the headers of ``folder``'s safetensors files (no tensor is read)."""
    shapes: dict[str, list[int]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        try:
            with open(file, "rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(size)) if 0 < size < 2**27 else {}
        except (OSError, ValueError):
            continue
        shapes.update({k: list(v.get("shape", [])) for k, v in header.items() if isinstance(v, dict)})
    return shapes


def check_lora_targets(cfg: DemoConfig) -> None:
    """LoRA's target modules against the model's weight names, as ``apply_lora`` will see them."""
    t = cfg.trainer
    folder = _model_folder(cfg.model) if t.lora_r > 0 else None
    shapes = _weight_shapes(folder) if folder is not None else {}
    if folder is None or not shapes:
        return  # nothing to read yet (not materialised, or not safetensors): apply_lora checks
    matrices = [k.removesuffix(".weight") for k, v in shapes.items() if k.endswith(".weight") and len(v) == 2]
    present = {m.rsplit(".", 1)[-1] for m in matrices}
    try:
        tied = bool(json.loads((folder / "config.json").read_text()).get("tie_word_embeddings", True))
    except (OSError, ValueError, AttributeError):
        tied = False
    if tied and "lm_head.weight" not in shapes and "lm_head" in t.lora_target_modules:
        raise ValueError(
            "TrainerConfig.lora_target_modules names 'lm_head', the output embedding, tied to the input embedding "
            "in this model: its merged weight cannot be published to the sampler; leave it out"
        )
    default = type(t)().lora_target_modules
    missing = [m for m in t.lora_target_modules if m not in present]
    if len(missing) == len(t.lora_target_modules) or (missing and t.lora_target_modules != default):
        raise ValueError(
            f"TrainerConfig.lora_target_modules: {', '.join(map(repr, missing))} "
            f"{'is not a module' if len(missing) == 1 else 'are not modules'} of {cfg.model!r}; "
            f"its weight matrices are named {', '.join(sorted(present))} "
            "(or TrainerConfig.lora_r 0 trains every weight)"
        )


def check_folder(name: str, folder: str) -> None:
    """``folder`` is a folder or can be made one (its nearest existing parent is a writable folder)."""
    import os

    path = Path(folder).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{name} {folder!r} is a file; pass a folder (it is created if missing)")
    parent = path
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{name} {folder!r} cannot be created: {str(parent)!r} is a file; pass another folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {folder!r} cannot be written: no write permission in {str(parent)!r}")


def check_lengths(cfg: DemoConfig) -> None:
    """A completion of ``max_tokens`` and its prompt fit what trains and what samples."""
    if cfg.max_tokens >= cfg.trainer.max_seq_len:
        whose = " with DemoConfig.task 'tools'" if cfg.task == "tools" else ""
        raise ValueError(
            f"DemoConfig.max_tokens ({cfg.max_tokens}) must be less than TrainerConfig.max_seq_len "
            f"({cfg.trainer.max_seq_len}{whose}): each sample trains as one sequence of prompt and completion; "
            "lower the one or raise the other (an explicit micro_token_budget must stay >= max_seq_len)"
        )
    if cfg.backend == "vllm" and cfg.max_tokens >= VLLM_MAX_MODEL_LEN:
        raise ValueError(
            f"DemoConfig.max_tokens ({cfg.max_tokens}) must be less than {VLLM_MAX_MODEL_LEN}, the context "
            "(prompt + completion) the demo's vLLM server is started with"
        )


def check_device(device: str) -> None:
    """``device`` names a torch device this machine has ("cpu" never imports torch)."""
    import re

    m = re.fullmatch(r"(cpu|cuda|mps|xpu)(?::(\d+))?", device.strip())
    if m is None:
        raise ValueError(f"TrainerConfig.model_device must be 'cpu', 'cuda', 'cuda:N', 'mps' or 'xpu', got {device!r}")
    kind, index = m.group(1), int(m.group(2) or 0)
    if kind == "cpu":
        return
    count = _device_count(kind)
    if index >= count:
        raise ValueError(
            f"TrainerConfig.model_device {device!r}: this machine has {count} {kind} device(s); use 'cpu'"
            + (f" or '{kind}:0'" if count else "")
        )


def _device_count(kind: str) -> int:
    """How many ``kind`` devices torch sees; without importing torch where the answer is 0
    (CUDA on Linux without an NVIDIA or ROCm driver, or on macOS; MPS off macOS)."""
    import sys

    no_driver = not any(Path(p).exists() for p in ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd"))
    if (kind == "cuda" and (sys.platform == "darwin" or (sys.platform == "linux" and no_driver))) or (
        kind == "mps" and sys.platform != "darwin"
    ):
        return 0
    import torch

    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "mps":
        return 1 if torch.backends.mps.is_available() else 0
    xpu = getattr(torch, "xpu", None)
    return xpu.device_count() if xpu is not None and xpu.is_available() else 0
