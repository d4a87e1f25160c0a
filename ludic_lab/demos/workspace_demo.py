"""``ludic-lab demo --task workspace``: SmolLM2 learns to apply a located fix in a sandboxed workspace.

The task (:mod:`ludic_lab.demos.workspace_task`): the shipped bug-fix tasks, each issue saying
where the bug is and what the line should read. The agent is a
:class:`~ludic_lab.agents.ToolAgent` with one workspace tool, ``edit_file``, run by the env in
the episode's bubblewrap workspace; the reward is the task's hidden tests, run after the
episode in a fresh sandbox (1.0 when all pass). Untrained, SmolLM2 calls functions named after
the code in the issue or leaves its call unclosed, so no edit runs and GRPO (LoRA) gets no signal
from this reward alone. So the run first takes a few SFT steps on demonstrated episodes of the
train tasks (:mod:`ludic_lab.demos.workspace_warmup`; ``--sft-warmup-steps``, 0 to skip), then
GRPO (docs/demo.md has the measured runs).

The run evaluates the 20 held-out tasks (two repositories no train task touches) before, after
the warm-up and after training: greedy, and one sample each at the training temperature, each with its Wilson
95% interval, the share of episodes whose edit ran and the tool calls per episode. The
output folder is the run folder (``docs/runs.md``) with ``summary.json`` (the figures, wall
time, the process's peak resident memory), ``reward_curve.png`` and ``rollouts.html``.
"""

from __future__ import annotations

import json
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ludic_lab.demos.workspace_task import workspace_edit_task
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.rollouts import EnvSpec, GRPORequestStrategy, ProtocolSpec
from ludic_lab.runs.folder import RunFolder
from ludic_lab.task.repo_task import repo_stats

WORKSPACE_DEFAULTS: dict[str, Any] = {
    "steps": 4,
    "questions_per_step": 4,
    "group_size": 4,
    "max_tokens": 96,
    "temperature": 0.7,
    "eval_k": 1,
    "out": "runs/demo_workspace",
}
WARMUP_STEPS = 6
"""SFT steps on demonstrations before RL when ``DemoConfig.sft_warmup_steps`` is None (8 demonstrated
train tasks a step: ``bench/workspace_warmup.py`` measured held-out greedy 0/20 -> 13/20)."""
WARMUP_PER_STEP = 8
"""Demonstrated train tasks per warm-up step."""
WARMUP_LR = 1e-3
"""The warm-up's learning rate (the RL steps then use ``--lr``)."""
"""``--task workspace`` defaults for the DemoConfig fields left at their capitals-demo default."""
WORKSPACE_TRAINER_DEFAULTS: dict[str, Any] = {"lr": 2e-4, "max_seq_len": 1024, "micro_token_budget": 2048}
"""The same for ``DemoConfig.trainer`` (a prompt holds the tool's schema and a worked example)."""
HELD_OUT_TASKS = 20
"""Held-out tasks evaluated before and after (all 20 of the two held-out repositories)."""
EPISODE_TIMEOUT_S = 3600.0
"""An episode's limit: generous, since a busy 2-core machine runs a batch of them slowly."""


def workspace_demo_config(cfg: Any) -> Any:
    """``cfg`` with :data:`WORKSPACE_DEFAULTS` and :data:`WORKSPACE_TRAINER_DEFAULTS` for every
    field still at the capitals default."""
    base = type(cfg)()

    def unset(defaults: dict[str, Any], now: Any, default: Any) -> dict[str, Any]:
        return {k: v for k, v in defaults.items() if getattr(now, k) == getattr(default, k)}

    trainer = replace(cfg.trainer, **unset(WORKSPACE_TRAINER_DEFAULTS, cfg.trainer, base.trainer))
    warmup = WARMUP_STEPS if cfg.sft_warmup_steps is None else cfg.sft_warmup_steps
    return replace(cfg, trainer=trainer, sft_warmup_steps=warmup, **unset(WORKSPACE_DEFAULTS, cfg, base))


def check_bwrap() -> None:
    """The workspace runs every model-written edit in bubblewrap: refuse up front without it."""
    if shutil.which("bwrap") is None:
        raise ValueError(
            "DemoConfig.task 'workspace' runs the model's edits in a bubblewrap sandbox and bwrap is not installed: "
            "`sudo apt-get install bubblewrap` (docs/code_exec.md); nothing runs unsandboxed"
        )


async def evaluate_workspace(client: Any, cfg: Any, *, tag: str, limit: int | None = None) -> dict[str, Any]:
    """Held-out figures: ``greedy`` and, with ``eval_k > 0``, ``sampled`` (``eval_k`` samples a
    task at the training temperature): accuracy with its 95% interval, the rate of episodes whose
    edit ran, tool calls and fail-to-pass tests passing."""
    from ludic_lab.eval import evaluate

    held = workspace_edit_task("heldout", limit=limit or HELD_OUT_TASKS, tokenizer=tokenizer_of(client))
    engine = held.engine(client, episode_timeout_s=EPISODE_TIMEOUT_S)
    out: dict[str, Any] = {}
    kinds = [("greedy", 1, 0.0)] + ([("sampled", cfg.eval_k, cfg.temperature)] if cfg.eval_k > 0 else [])
    for kind, k, temp in kinds:
        r = await evaluate(
            engine, EnvSpec(held.name), ProtocolSpec(held.protocol_kind),
            range(held.size or 0), k=k, temperature=temp, max_tokens=cfg.max_tokens, max_steps=1,
            sampling_seed=cfg.seed + 7, name=f"{tag} {kind}",
        )  # fmt: skip
        s, stats = r.summary(), repo_stats(r.rollouts)
        out[kind] = {
            "accuracy": s["accuracy"], "ci_low": s["accuracy_ci_low"], "ci_high": s["accuracy_ci_high"],
            "episodes": s["num_samples"], "failed": s["num_failed"], "edit_ran_rate": edit_ran_rate(r.rollouts),
            "fail_to_pass_rate": stats["fail_to_pass_rate"], "tool_calls_per_episode": stats["tool_calls_per_episode"],
        }  # fmt: skip
    return out


def tokenizer_of(client: Any) -> Any:
    """The client's ``chat_template`` (its tokenizer: the tool output budget counts tokens), or
    ``None`` for a client without one (the budget then counts characters)."""
    from ludic_lab.inference.chat_template import ChatTemplate

    template = getattr(client, "chat_template", None)
    return template if isinstance(template, ChatTemplate) else None


def edit_ran_rate(rollouts: Any) -> float:
    """The share of episodes with an ``edit_file`` call that ran (its text was found once)."""
    ran = 0
    for r in rollouts:
        info = r.steps[-1].info if r.steps and not r.failed else {}
        calls = (info.get("agent") or {}).get("tool_calls") or []
        ran += any(c.get("name") == "edit_file" and c.get("ok") for c in calls)
    return ran / len(rollouts) if rollouts else float("nan")


def _line(d: dict[str, Any]) -> str:
    return "; ".join(
        f"{kind} {v['accuracy']:.2f} [{v['ci_low']:.2f}, {v['ci_high']:.2f}] (edit ran {v['edit_ran_rate']:.2f}, "
        f"{v.get('tool_calls_per_episode', float('nan')):.2f} calls/episode)"
        for kind, v in d.items()
    )


async def run_workspace_demo(cfg: Any, cleanups: list[Callable[[], Any]]) -> dict[str, Any]:
    """Evaluate, train, evaluate; returns the summary (also ``<out>/summary.json``)."""
    from rich.console import Console
    from transformers import AutoModelForCausalLM

    from ludic_lab.demos import backend
    from ludic_lab.demos.preflight import build_algorithm
    from ludic_lab.lab.reports import plot_metrics, write_rollouts_html
    from ludic_lab.rollouts import RolloutBatchSource
    from ludic_lab.training import Trainer
    from ludic_lab.training.loggers import ConsoleLogger

    cfg = workspace_demo_config(cfg)  # run_demo has run cfg.preflight() (these defaults included)
    console = Console()
    out = Path(cfg.out)
    run = RunFolder(out, config={**asdict(cfg), "task": "workspace"}, algo=cfg.algo, model=cfg.model, kind="demo")
    t_all = time.perf_counter()
    with console.status("loading the model (the first run materialises SmolLM2 into the cache)..."):
        client, model_path = await backend.start_backend(cfg, out, cleanups)
    train = workspace_edit_task("train", tokenizer=tokenizer_of(client))
    console.print(f"workspace task: {train.size} training / {HELD_OUT_TASKS} held-out bug-fix tasks, fix located; "
                  f"{cfg.steps} steps of {cfg.questions_per_step} tasks x {cfg.group_size} episodes")  # fmt: skip
    with console.status(f"evaluating on {HELD_OUT_TASKS} held-out tasks (before training)..."):
        before = await evaluate_workspace(client, cfg, tag="before")
    console.print(f"[bold]before[/bold]: {_line(before)}")
    run.log_eval("held-out", 0, before)

    algo = build_algorithm(cfg.algo, max_tokens=cfg.max_tokens)
    inference = InferenceSpec(
        SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens), ReturnSpec.for_training()
    )
    source = RolloutBatchSource(
        train.engine(client, episode_timeout_s=EPISODE_TIMEOUT_S),
        train.requests(per_step=cfg.questions_per_step, seed=cfg.seed, inference=inference),
        algo.credit_assigner,
        request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
    )
    run.source = source
    policy = AutoModelForCausalLM.from_pretrained(model_path)
    keys = ("reward_mean", "loss", "grad_norm", "time/step_s")
    loggers = [ConsoleLogger(keys=keys, console=console), run]
    trainer = Trainer(policy, algo, source, config=cfg.trainer, publisher=backend.publisher(client, policy),
                      loggers=loggers, pad_token_id=client.pad_token_id)  # fmt: skip
    warmed: dict[str, Any] | None = None
    if cfg.sft_warmup_steps:
        from ludic_lab.demos.workspace_warmup import warm_up

        t0 = time.perf_counter()
        with console.status(f"SFT warm-up: {cfg.sft_warmup_steps} steps on demonstrated train episodes..."):
            warm = await warm_up(trainer, client, train, steps=cfg.sft_warmup_steps, per_step=WARMUP_PER_STEP,
                                 seed=cfg.seed, max_tokens=cfg.max_tokens, lr=WARMUP_LR,
                                 episode_timeout_s=EPISODE_TIMEOUT_S)  # fmt: skip
            warmed = await evaluate_workspace(client, cfg, tag="after warm-up")
        losses = ", ".join(f"{float(m['loss']):.3f}" for m in warm)
        console.print(f"[bold]after the SFT warm-up[/bold] ({cfg.sft_warmup_steps} steps, loss {losses}, "
                      f"{time.perf_counter() - t0:.0f} s): {_line(warmed)}")  # fmt: skip
        run.log_eval("held-out", trainer.step, warmed)  # the optimizer steps so far are the warm-up's
    t0 = time.perf_counter()
    history = await trainer.train(cfg.steps, progress=False)
    train_s = time.perf_counter() - t0
    trainer.close()
    with console.status("evaluating after training..."):
        after = await evaluate_workspace(client, cfg, tag="after")
    console.print(f"[bold]after[/bold]:  {_line(after)}")
    run.log_eval("held-out", trainer.step, after)
    if cfg.save_policy:
        from ludic_lab.saving import save_policy

        saved = save_policy(trainer, out / "policy", overwrite=True)
        console.print(f"saved the policy to [bold]{saved.path}[/bold]")
    run.close()
    rewards = [float(h["reward_mean"]) for h in history if isinstance(h.get("reward_mean"), (int, float))]
    k = max(1, min(3, len(rewards) // 3))
    summary: dict[str, Any] = {
        "config": {**asdict(cfg), "task": "workspace"},
        "held_out_tasks": HELD_OUT_TASKS,
        "before": before,
        "after_warmup": warmed,
        "after": after,
        "train_reward": {"first": sum(rewards[:k]) / k, "last": sum(rewards[-k:]) / k} if rewards else None,
        "train_seconds": train_s,
        "total_seconds": time.perf_counter() - t_all,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_metrics(history, out / "reward_curve.png", keys=("reward_mean", "loss", "grad_norm"),
                 title="GRPO on located bug fixes in a workspace",
                 hlines={"held-out before (greedy)": before["greedy"]["accuracy"],
                         "held-out after (greedy)": after["greedy"]["accuracy"]})  # fmt: skip
    write_rollouts_html(out / "rollouts.html", source.last_rollouts, weights=source.last_weights,
                        tokenizer=model_path, training_step=trainer.step, title="workspace run: last training batch",
                        summary={"held-out before": before, "held-out after": after})  # fmt: skip
    console.print(
        f"held-out greedy {before['greedy']['accuracy']:.2f} -> {after['greedy']['accuracy']:.2f}; "
        f"{summary['total_seconds'] / 60:.1f} min in all, peak RSS {summary['peak_rss_gb']:.2f} GB"
    )
    console.print(f"wrote {out}/: run.json, metrics.jsonl, evals.jsonl, rollouts.jsonl, summary.json, "
                  "reward_curve.png, rollouts.html")  # fmt: skip
    return summary
