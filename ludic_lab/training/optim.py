"""The optimizer and learning-rate schedule a :class:`~ludic_lab.training.config.TrainerConfig` names."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ludic_lab.training.config import TrainerConfig


def make_optimizer(params: Sequence[torch.nn.Parameter], cfg: TrainerConfig) -> torch.optim.Optimizer:
    """AdamW (``lr``, ``adam_betas``, ``adam_eps``, ``weight_decay``) or SGD over ``params``."""
    if cfg.optimizer == "adamw":
        betas = (float(cfg.adam_betas[0]), float(cfg.adam_betas[1]))
        return torch.optim.AdamW(params, lr=cfg.lr, betas=betas, eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; use 'adamw' or 'sgd'")


def lr_lambda(cfg: TrainerConfig) -> Callable[[int], float]:
    """Learning-rate factor per step: linear warmup, then constant / linear / cosine decay to 0
    at ``total_steps``."""
    warm, total, kind = cfg.warmup_steps, cfg.total_steps, cfg.lr_schedule

    def f(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if kind == "constant" or not total:
            return 1.0
        frac = min(1.0, (step - warm) / max(1, total - warm))
        if kind == "linear":
            return max(0.0, 1.0 - frac)
        return 0.5 * (1.0 + math.cos(math.pi * frac))

    return f


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainerConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following :func:`lr_lambda`."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's generators (the trainer's at construction)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
