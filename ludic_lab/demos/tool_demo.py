"""``ludic-lab demo --task tools``: SmolLM2 learns to use a calculator, with GRPO (LoRA) on CPU.

The task (:mod:`ludic_lab.demos.tool_task`): "What is 347 * 29?" — a product SmolLM2-135M cannot
compute in its head. The agent is a :class:`~ludic_lab.agents.ToolAgent` with a
``calculator`` tool; one episode is one env step holding every model turn and tool result,
and only the tokens the model sampled are trained on. Reward 1 when the final reply's last
number is the product. Untrained and sampled at temperature 1, the model calls the tool in
most episodes but often writes invalid JSON, so few episodes succeed; GRPO teaches the format.

The run evaluates on held-out questions before and after (greedy and one sampled answer each,
with the tool), then trains a **control**: the same model, same steps and settings, without
the tool (questions answered directly) — that run cannot learn multiplication, which shows the
tool is what makes the difference. Each step prints the reward, the tool-call rate, the
valid-call rate (episodes where a call ran) and calls per episode. The output folder is the
tool run's run folder (``docs/runs.md``: ``run.json``, ``metrics.jsonl``, ``evals.jsonl``,
``rollouts.jsonl``) with ``summary.json``, ``reward_curve.png`` and ``rollouts.html``; the
control's run folder is ``control/`` in it (``ludic-lab runs OUT OUT/control`` compares them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ludic_lab.data import load_multiplication
from ludic_lab.demos.tool_task import evaluate_tool_task, tool_stats_callback, tool_task_engine
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.rollouts import GRPORequestStrategy
from ludic_lab.runs.folder import RunFolder
from ludic_lab.task import RequestStream

TOOL_DEFAULTS: dict[str, Any] = {
    "steps": 5,
    "questions_per_step": 4,
    "max_tokens": 40,
    "eval_k": 1,
    "out": "runs/demo_tools",
}
"""``--task tools`` defaults for the DemoConfig fields left at their capitals-demo default."""
TOOL_TRAINER_DEFAULTS: dict[str, Any] = {"lr": 1e-3, "max_seq_len": 768, "micro_token_budget": 1024}
"""The same for the fields of ``DemoConfig.trainer`` (episodes with tool turns run longer)."""
EVAL_QUESTIONS = 20
"""Held-out questions evaluated (the first of the 40 in the test split): each evaluation is
two to three model calls per question, the dearest part of the run on a 2-core CPU."""


def tool_demo_config(cfg: Any) -> Any:
    """``cfg`` with :data:`TOOL_DEFAULTS` and :data:`TOOL_TRAINER_DEFAULTS` for every field
    still at the capitals default."""
    base = type(cfg)()

    def unset(defaults: dict[str, Any], now: Any, default: Any) -> dict[str, Any]:
        return {k: v for k, v in defaults.items() if getattr(now, k) == getattr(default, k)}

    trainer = replace(cfg.trainer, **unset(TOOL_TRAINER_DEFAULTS, cfg.trainer, base.trainer))
    return replace(cfg, trainer=trainer, **unset(TOOL_DEFAULTS, cfg, base))


async def _evaluate(
    client: Any, rows: list[dict[str, Any]], cfg: Any, *, use_tool: bool, tag: str, sampled: bool = True
) -> dict[str, Any]:
    """Greedy held-out stats and, with ``sampled`` and ``eval_k > 0``, those of one answer per
    question sampled at the training temperature (the policy RL trains)."""
    out: dict[str, Any] = {}
    kinds = [("greedy", 0.0)] + ([("sampled", cfg.temperature)] if sampled and cfg.eval_k > 0 else [])
    for kind, temp in kinds:
        r = await evaluate_tool_task(
            client, rows, use_tool=use_tool, temperature=temp, max_tokens=cfg.max_tokens,
            sampling_seed=cfg.seed + 7, name=f"{tag} {kind}",
        )  # fmt: skip
        out[kind] = {k: round(float(v), 4) for k, v in r.items() if k != "result"}
    return out


def _line(d: dict[str, Any]) -> str:
    """``greedy: accuracy 0.25, tool call rate 0.5, ...; sampled: ...`` (numbers to 3 digits)."""
    from ludic_lab.lab.reports import format_metrics

    return format_metrics(d)


async def _train(
    cfg: Any,
    client: Any,
    model_path: str,
    publisher_for: Callable[[Any], Any],
    rows: list[dict[str, Any]],
    *,
    use_tool: bool,
    run: Any,
    console: Any,
    save_to: Path | None = None,
) -> tuple[list[dict[str, Any]], Any, float]:
    """One GRPO run on ``rows``, logged to ``run`` (a :class:`~ludic_lab.runs.folder.RunFolder`);
    returns ``(history, source, seconds)``. Each step's history and metrics line
    get the batch's :func:`~ludic_lab.demos.tool_task.tool_stats` under ``tools/``; with
    ``save_to`` the trained policy is saved there (``docs/saving.md``)."""
    from rich.markup import escape
    from transformers import AutoModelForCausalLM

    from ludic_lab.demos.preflight import build_algorithm
    from ludic_lab.rollouts import RolloutBatchSource
    from ludic_lab.rollouts.signal_check import NoSignalNotice
    from ludic_lab.training import Trainer

    algo = build_algorithm(cfg.algo, max_tokens=cfg.max_tokens)  # DemoConfig checked the name and group size
    engine, env, protocol = tool_task_engine(client, rows, use_tool=use_tool)
    inference = InferenceSpec(
        SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens), ReturnSpec.for_training()
    )
    requests = RequestStream(  # the next questions each step
        env, protocol, per_step=cfg.questions_per_step, size=len(rows), seed=cfg.seed, inference=inference, max_steps=1
    )

    source = RolloutBatchSource(
        engine, requests, algo.credit_assigner, request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed)
    )
    policy = AutoModelForCausalLM.from_pretrained(model_path)
    run.source = source  # a few rollouts of each step go into the run's rollouts.jsonl
    add_tool_stats = tool_stats_callback(source, run)
    no_signal = NoSignalNotice()  # a step with nothing to learn says so, with the likely causes

    def on_step(step: int, m: dict[str, Any]) -> None:
        add_tool_stats(step, m)
        console.print(
            f"step {step:3d}  reward {m.get('reward_mean', float('nan')):.3f}  "
            + (f"tool-call {m['tools/tool_call_rate']:.2f}  valid-call {m['tools/valid_call_rate']:.2f}  "
               f"calls/episode {m['tools/calls_per_episode']:.2f}  " if use_tool else "")
            + f"({m.get('time/step_s', float('nan')):.1f}s)"
        )  # fmt: skip
        warning = no_signal(step, m)
        if warning is not None:
            console.print(f"[yellow]{escape(warning)}[/yellow]")

    trainer = Trainer(policy, algo, source, config=cfg.trainer, publisher=publisher_for(policy), callbacks=[on_step],
                      pad_token_id=client.pad_token_id)  # fmt: skip
    t0 = time.perf_counter()
    history = await trainer.train(cfg.steps, progress=False)
    seconds = time.perf_counter() - t0
    trainer.close()
    run.close()
    if save_to is not None:
        from ludic_lab.saving import save_policy

        saved = save_policy(trainer, save_to, overwrite=True)
        console.print(f"saved the policy to [bold]{saved.path}[/bold]")
    return history, source, seconds


async def run_tool_demo(cfg: Any, cleanups: list[Callable[[], Any]]) -> dict[str, Any]:
    """The tool run, then the no-tool control; returns the summary (also ``summary.json``).

    The control is evaluated greedily only (sampling answers it cannot compute adds nothing).
    """
    from rich.console import Console
    from transformers import AutoModelForCausalLM

    from ludic_lab.demos import backend
    from ludic_lab.lab.reports import plot_metrics, write_rollouts_html

    cfg = tool_demo_config(cfg)  # run_demo has run cfg.preflight() (these defaults included)
    console = Console()
    out = Path(cfg.out)
    run = RunFolder(out, config={**asdict(cfg), "task": "tools"}, algo=cfg.algo, model=cfg.model, kind="demo")
    train_rows, test_rows = load_multiplication("train"), load_multiplication("test")[:EVAL_QUESTIONS]
    t_all = time.perf_counter()
    with console.status("loading the model (the first run materialises SmolLM2 into the cache)..."):
        client, model_path = await backend.start_backend(cfg, out, cleanups)
    console.print(f"tool task: {len(train_rows)} training / {len(test_rows)} held-out products; "
                  f"{cfg.steps} steps of {cfg.questions_per_step} questions x {cfg.group_size} samples")  # fmt: skip

    with console.status(f"evaluating on {len(test_rows)} held-out questions, with the tool (before training)..."):
        before = await _evaluate(client, test_rows, cfg, use_tool=True, tag="before")
    console.print(f"[bold]before, with the tool[/bold]: {_line(before)}")
    run.log_eval("held-out", 0, before)
    console.print(f"[bold]training {cfg.algo} with the calculator tool[/bold]")
    history, source, train_s = await _train(
        cfg, client, model_path, lambda p: backend.publisher(client, p), train_rows, use_tool=True,
        run=run, console=console, save_to=out / "policy" if cfg.save_policy else None,
    )  # fmt: skip
    with console.status("evaluating after training..."):
        after = await _evaluate(client, test_rows, cfg, use_tool=True, tag="after")
    console.print(f"[bold]after, with the tool[/bold]: {_line(after)}")
    run.log_eval("held-out", cfg.steps, after)
    write_rollouts_html(  # the rollouts and credit weights of the batch the last step trained on
        out / "rollouts.html", source.last_rollouts, weights=source.last_weights, tokenizer=model_path,
        training_step=history[-1].get("step") if history else None, title=f"tool run ({cfg.algo}): last training batch",
        summary={"held-out before, with the tool": before, "held-out after, with the tool": after},
    )  # fmt: skip

    # the control: the untrained weights back into the sampler, then the same run without the tool
    base = AutoModelForCausalLM.from_pretrained(model_path)
    pub = backend.publisher(client, base)
    await pub.publish_async(base.state_dict()) if hasattr(pub, "publish_async") else pub.publish(base.state_dict())
    del base
    with console.status("control: evaluating without the tool (before training)..."):
        control_before = await _evaluate(client, test_rows, cfg, use_tool=False, tag="control before", sampled=False)
    console.print(f"[bold]control, no tool, before[/bold]: {_line(control_before)}")
    control = RunFolder(out / "control", config={**asdict(cfg), "task": "tools", "use_tool": False}, algo=cfg.algo,
                        model=cfg.model, kind="demo")  # fmt: skip
    control.log_eval("held-out", 0, control_before)
    console.print(f"[bold]control: training {cfg.algo} without the tool[/bold] (same steps and settings)")
    control_history, _, control_s = await _train(
        cfg, client, model_path, lambda p: backend.publisher(client, p), train_rows, use_tool=False,
        run=control, console=console,
    )  # fmt: skip
    with console.status("control: evaluating after training..."):
        control_after = await _evaluate(client, test_rows, cfg, use_tool=False, tag="control after", sampled=False)
    console.print(f"[bold]control, no tool, after[/bold]: {_line(control_after)}")
    control.log_eval("held-out", cfg.steps, control_after)

    summary: dict[str, Any] = {
        "config": {**asdict(cfg), "task": "tools"},
        "held_out_questions": len(test_rows),
        "with_tool": {"before": before, "after": after},
        "control_without_tool": {"before": control_before, "after": control_after},
        "train_reward": _ends(history, "reward_mean"),
        "tool_call_rate": _ends(history, "tools/tool_call_rate"),
        "valid_call_rate": _ends(history, "tools/valid_call_rate"),
        "calls_per_episode": _ends(history, "tools/calls_per_episode"),
        "control_train_reward": _ends(control_history, "reward_mean"),
        "train_seconds": train_s,
        "control_train_seconds": control_s,
        "total_seconds": time.perf_counter() - t_all,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_metrics(
        history, out / "reward_curve.png", keys=("reward_mean", "tools/valid_call_rate", "tools/calls_per_episode"),
        title="GRPO with a calculator tool",
        hlines={"held-out before (greedy)": before["greedy"]["accuracy"],
                "held-out after (greedy)": after["greedy"]["accuracy"]},
    )  # fmt: skip
    r = summary["train_reward"]
    console.print(
        f"train reward {r['first']:.2f} -> {r['last']:.2f}; held-out greedy accuracy with the tool "
        f"{before['greedy']['accuracy']:.2f} -> {after['greedy']['accuracy']:.2f}; control without the tool "
        f"{control_before['greedy']['accuracy']:.2f} -> {control_after['greedy']['accuracy']:.2f}; "
        f"{summary['total_seconds'] / 60:.1f} min in all"
    )
    console.print(f"wrote {out}/: the tool run's folder (run.json, metrics.jsonl, evals.jsonl, rollouts.jsonl), "
                  "summary.json, reward_curve.png, rollouts.html; the control's in control/ "
                  f"(compare: ludic-lab runs {out} {out / 'control'})")  # fmt: skip
    return summary


def _ends(history: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Mean of ``key`` over the first and the last few steps (a third of the run, at most 3)."""
    xs = [float(h[key]) for h in history if isinstance(h.get(key), (int, float))]
    if not xs:
        return {"first": float("nan"), "last": float("nan")}
    k = max(1, min(3, len(xs) // 3))
    return {"first": sum(xs[:k]) / k, "last": sum(xs[-k:]) / k}
