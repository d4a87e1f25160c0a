"""The training set-up the example scripts share: a LoRA ``TrainerConfig`` as a script
config's ``trainer`` sub-config (:func:`lora_trainer_field`, :func:`pass_down_trainer`), a
``Trainer`` wired to a :class:`~ludic_lab.recipes.Sampler` (weights pushed into it after every
step, a console table and ``<out>`` as a run folder: ``run.json``, ``metrics.jsonl``,
``rollouts.jsonl``; docs/runs.md), a timed run, and how every example ends
(:func:`finish_example`: the trained policy saved into ``<out>/policy``, the held-out evaluations
before and after in the run folder's ``evals.jsonl``, ``summary.json``).

    trainer: TrainerConfig = lora_trainer_field(lr=1e-3)   # a field of the script's Config
    ...
    async with Sampler(cfg.backend, cfg.model, log_dir=cfg.out) as sampler:
        trainer = sampler_trainer(sampler, algo, source, cfg.trainer, out=cfg.out, run_config=asdict(cfg))
        history, seconds = await train_timed(trainer, cfg.steps)
        summary = {"config": asdict(cfg), "before": before, "after": after, ...}
        finish_example(trainer, cfg.out, summary, evals={"held-out": (before, after)}, show=("before", "after"))
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def output_dir(out: str | os.PathLike) -> Path:
    """``out`` as a ``Path``, created if missing."""
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    return path


def lora_trainer_field(*, lr: float, lora_r: int = 16, micro_token_budget: int = 1024, max_seq_len: int = 1024,
                       **defaults: Any) -> Any:  # fmt: skip
    """A script config's ``trainer: TrainerConfig`` field (:func:`~ludic_lab.config.sub_config`):
    each ``TrainerConfig`` field is a flag of the script (``--lr``, ``--lora-r``, ...) with these
    defaults — LoRA alpha ``2 * lora_r``, ``max_seq_len`` 1024 (a game's last turn holds the
    whole dialog so far), ``defaults`` for any other field. ``model_device`` and
    ``scoring_temperature`` are no flags: :func:`pass_down_trainer` sets them."""
    from ludic_lab.config import sub_config
    from ludic_lab.training.config import TrainerConfig

    return sub_config(TrainerConfig, derived=("scoring_temperature", "model_device"), lr=lr, lora_r=lora_r,
                      lora_alpha=None, max_seq_len=max_seq_len, micro_token_budget=micro_token_budget,
                      **defaults)  # fmt: skip


def pass_down_trainer(cfg: Any, *, on_policy: bool = True) -> None:
    """In a script config's ``__post_init__``: its ``trainer`` takes the script's ``seed``,
    ``model_device=cfg.device`` and, for on-policy RL, ``scoring_temperature=cfg.temperature``
    (the trainer scores at the sampling temperature; SFT keeps the trainer's own)."""
    from ludic_lab.config import pass_down

    derived: dict[str, Any] = {"model_device": cfg.device}
    if on_policy:
        derived["scoring_temperature"] = cfg.temperature
    pass_down(cfg, "trainer", **derived)


def sampler_threads(trainer: Any) -> int | None:
    """The in-process sampler's threads for a trainer config: with sampling overlapped
    (``async_mode`` not ``"sync"``) and ``num_threads`` the cores the step leaves (at least
    one), else None (torch's default)."""
    if trainer.effective_async_mode == "sync" or not trainer.num_threads:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - trainer.num_threads)


def trainer_config(cfg: Any, *, scoring_temperature: float | None = None, max_seq_len: int = 1024,
                   **overrides: Any) -> Any:  # fmt: skip
    """The examples' :class:`~ludic_lab.training.TrainerConfig`, read from a script config with
    ``device``, ``lr``, ``lora_r`` (0 = every weight), ``seed`` and ``micro_token_budget``:
    LoRA alpha ``2 * lora_r``; ``max_seq_len`` 1024 (a game's last turn holds the whole dialog
    so far); ``scoring_temperature`` the sampling temperature of on-policy RL (left at the
    trainer's default for SFT). ``overrides`` go to ``TrainerConfig`` as they are."""
    from ludic_lab.training import TrainerConfig

    kw: dict[str, Any] = dict(
        model_device=cfg.device, lr=cfg.lr, lora_r=cfg.lora_r, lora_alpha=None,
        seed=cfg.seed, max_seq_len=max_seq_len, micro_token_budget=cfg.micro_token_budget,
    )  # fmt: skip
    if scoring_temperature is not None:
        kw["scoring_temperature"] = scoring_temperature
    return TrainerConfig(**{**kw, **overrides})


CONSOLE_KEYS = ("reward_mean", "loss", "grad_norm", "time/step_s")


def sampler_trainer(sampler: Any, algo: Any, source: Any, config: Any, *, out: str | os.PathLike,
                    console_keys: Sequence[str] = CONSOLE_KEYS, run_config: Any = None) -> Any:  # fmt: skip
    """A ``Trainer`` of the model at ``sampler.model_path`` (loaded fresh) that pushes its
    weights into ``sampler`` after every step and logs ``console_keys`` to the terminal and
    every metric to the run folder ``out`` (:class:`~ludic_lab.runs.folder.RunFolder`: its
    ``run.json`` holds ``run_config``, the script's config, or else the trainer's ``config``;
    ``metrics.jsonl`` and ``rollouts.jsonl`` start empty)."""
    from transformers import AutoModelForCausalLM

    from ludic_lab.runs.folder import RunFolder
    from ludic_lab.training import Trainer
    from ludic_lab.training.loggers import ConsoleLogger

    policy = AutoModelForCausalLM.from_pretrained(sampler.model_path)
    folder = RunFolder(out, config=run_config if run_config is not None else {"trainer": config},
                       algo=getattr(algo, "name", None), model=str(sampler.model_path), kind="example",
                       source=source)  # fmt: skip
    loggers = [ConsoleLogger(keys=tuple(console_keys)), folder]
    publisher = sampler.publisher(policy)
    return Trainer(policy, algo, source, config=config, publisher=publisher, pad_token_id=sampler.client.pad_token_id,
                   loggers=loggers)  # fmt: skip


async def train_timed(trainer: Any, steps: int) -> tuple[list[dict[str, Any]], float]:
    """Run ``steps`` optimizer steps (no progress bar: the console logger prints a row per step);
    returns the per-step metrics and the wall time in seconds."""
    t0 = time.perf_counter()
    history = await trainer.train(steps, progress=False)
    return history, time.perf_counter() - t0


def first_last(history: Sequence[dict[str, Any]], key: str) -> tuple[Any, Any]:
    """``history[0][key]`` and ``history[-1][key]`` (``None`` for an empty history)."""
    return (history[0].get(key), history[-1].get(key)) if history else (None, None)


def finish_example(
    trainer: Any,
    out: str | os.PathLike,
    summary: dict[str, Any],
    *,
    evals: dict[str, tuple[Any, Any]] | None = None,
    show: Sequence[str] = (),
    save: bool = True,
) -> dict[str, Any]:
    """End an example's run: save ``trainer``'s policy into ``<out>/policy`` (merged, and the
    LoRA adapter; replacing an earlier run's; ``summary["policy"]`` is its folder), log each
    ``evals`` entry ``name: (before, after)`` to the run folder (step 0 and the trainer's last
    step; ``None`` is skipped), then :func:`write_summary` (before or after ``trainer.close()``)."""
    from ludic_lab.runs.folder import RunFolder
    from ludic_lab.saving import save_policy

    folder = next((lg for lg in getattr(trainer, "loggers", ()) if isinstance(lg, RunFolder)), None)
    for name, (before, after) in (evals or {}).items():
        for step, result in ((0, before), (int(trainer.step), after)):
            if folder is not None and result is not None:
                folder.log_eval(name, step, result)
    if save:
        summary = {**summary, "policy": str(save_policy(trainer, Path(out) / "policy", overwrite=True).path)}
    return write_summary(out, summary, show=show)


def write_summary(out: str | os.PathLike, summary: dict[str, Any], show: Sequence[str] = ()) -> dict[str, Any]:
    """Write ``<out>/summary.json`` and print the ``show`` keys of ``summary`` as one JSON line."""
    (Path(out) / "summary.json").write_text(json.dumps(summary, indent=2))
    if show:
        print(json.dumps({k: summary[k] for k in show}), flush=True)
    return summary
