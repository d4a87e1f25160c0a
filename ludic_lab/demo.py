"""``ludic-lab demo``: rollouts of the embedded default model on the shipped math word problems.

The whole rollout path on CPU, end to end: SmolLM2-135M-Instruct in-process
(:class:`LocalChatClient`), :class:`DatasetQAEnv` over the shipped dataset, an
``<answer>`` tag parser, GRPO-style groups (same question, different sampling seeds)
through :class:`RolloutEngine`, a table of what happened and the rollouts saved as JSONL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.data import load_math_word_problems
from ludic_lab.envs import DatasetQAEnv
from ludic_lab.inference.local_client import LocalChatClient
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.training import EnvSpec, GRPORequestStrategy, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.types import Rollout, save_rollouts


@dataclass
class DemoConfig:
    """Rollouts of the default model on math word problems, in GRPO groups."""

    model: str = "default"
    """Local model directory, or "default" (SmolLM2-135M-Instruct) / "tiny"."""
    num_questions: int = 4
    """How many distinct questions (groups)."""
    group_size: int = 4
    """Samples per question (same question, different sampling seeds)."""
    max_tokens: int = 96
    """Completion budget per turn."""
    temperature: float = 1.0
    """Sampling temperature."""
    concurrency: int = 16
    """Episodes in flight (their model calls are batched together)."""
    seed: int = 0
    """Picks the questions and the sampling seeds."""
    out: Optional[str] = "runs/demo_rollouts.jsonl"
    """Where to save the rollouts (JSONL); empty to skip."""


async def run_demo(cfg: DemoConfig) -> list[Rollout]:
    """Run the demo and return the rollouts (printing a table on the way)."""
    from rich.console import Console

    console = Console()
    t0 = time.perf_counter()
    with console.status("loading model (the first run materialises SmolLM2 into the cache)..."):
        client = LocalChatClient(cfg.model, max_batch_size=cfg.concurrency)
    console.print(f"model: [bold]{client.model_path}[/bold] ({time.perf_counter() - t0:.1f}s)")
    data = load_math_word_problems("train")

    def make_env() -> DatasetQAEnv:
        return DatasetQAEnv(data)

    def make_protocol() -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(Agent(client, FullDialog(), DatasetQAEnv.recommended_parser(error_reward=-0.5)))

    engine = RolloutEngine({"math": make_env}, {"single_agent": make_protocol}, max_concurrency=cfg.concurrency)
    inference = InferenceSpec(
        sampling=SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens),
        return_=ReturnSpec.for_training(),
    )
    base = [
        RolloutRequest(
            env=EnvSpec("math"),
            protocol=ProtocolSpec("single_agent"),
            env_seed=cfg.seed * 1000 + q,
            inference=inference,
        )
        for q in range(cfg.num_questions)
    ]
    requests = GRPORequestStrategy(cfg.group_size, seed=cfg.seed).expand(base)
    t1 = time.perf_counter()
    rollouts = await engine.generate_rollouts(requests, max_steps=1, progress=True)
    dt = time.perf_counter() - t1
    _print_table(console, rollouts)
    toks = sum(r.num_completion_tokens for r in rollouts)
    ok = [r for r in rollouts if not r.failed]
    mean_r = sum(r.total_reward for r in ok) / max(1, len(ok))
    console.print(
        f"{len(rollouts)} episodes ({len(rollouts) - len(ok)} failed) in {dt:.1f}s: "
        f"{len(rollouts) / dt:.2f} episodes/s, {toks / dt:.0f} completion tokens/s, mean reward {mean_r:+.3f}"
    )
    if cfg.out:
        Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
        save_rollouts(rollouts, cfg.out)
        console.print(f"saved to {cfg.out}")
    return rollouts


def _print_table(console, rollouts: list[Rollout]) -> None:
    from rich.table import Table

    table = Table(title="rollouts", show_lines=False)
    for col in ("group", "question", "completion", "parsed", "target", "reward"):
        table.add_column(col, overflow="fold")
    for r in rollouts:
        s = r.steps[0] if r.steps else None
        table.add_row(
            (r.group_id or "")[:6],
            (s.prev_obs if s else "")[:60],
            (s.action if s else f"[red]{r.error}[/red]")[:80].replace("\n", " "),
            str(s.parsed_action) if s else "",
            str(s.info.get("target", "")) if s else "",
            f"{r.total_reward:+.2f}",
        )
    console.print(table)
