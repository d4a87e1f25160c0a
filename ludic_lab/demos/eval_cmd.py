"""``ludic-lab eval``: a saved model (or the embedded default) on any task, from the command line.

    ludic-lab eval --model runs/demo/policy --task capitals --k 4 --out runs/demo/eval
    ludic-lab eval --model tiny --task my_agents.py:agent --data questions.jsonl --k 8
    ludic-lab eval --task reasoning_gym:basic_arithmetic --limit 20

Each pass (greedy, and sampled when ``--k`` > 1 or ``--temperature`` > 0) is one
:func:`~ludic_lab.eval.evaluate_task` over the same loaded model; the command prints one line
per pass and, with ``--out``, writes ``<pass>.csv`` and ``<pass>.html`` (one row per episode)
and ``summary.json``. The flags come from :class:`EvalConfig`.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

HELDOUT_SEED_OFFSET = 7
"""The demos sample their held-out evaluation with seeds from ``seed + 7``; so does ``--seed``."""

EVAL_DESCRIPTION = """\
Evaluate a model on a task: accuracy and pass@k with Wilson 95% intervals, mean reward,
format-error and tool-call rates, and one row per episode (--out: CSV, HTML, summary.json).

--task is a bundled task (capitals, tools, digits, bugfix), reasoning_gym:NAME (its held-out rows),
a .jsonl file of {"question", "answer"} rows, or module:factory (a module on PYTHONPATH or a
.py file): a Task, an env class or factory, or an agent program `async def agent(client,
question)` written against the openai SDK, which then answers the questions of --data.

examples:
  ludic-lab eval --model runs/demo/policy --task capitals --k 4
      the demo's held-out numbers of its saved policy (add --seed S for a demo run with --seed S)
  ludic-lab eval --task my_agent.py:agent --data questions.jsonl --k 8 --out runs/eval
      an openai-SDK agent program on your questions, 8 samples each, tables into runs/eval
  ludic-lab eval --task reasoning_gym:basic_arithmetic --limit 20 --max-tokens 128
      20 held-out reasoning-gym problems, scored by reasoning-gym
  ludic-lab eval --task bugfix --timeout-s 3600
      the 20 held-out bug-fix tasks as workspace episodes (needs bwrap), scored by hidden tests
"""


@dataclass
class EvalConfig:
    """Evaluate a saved model (or the embedded default) on a task: pass@k, intervals, per-episode tables."""

    task: str = "capitals"
    """What to evaluate: capitals, tools, digits, bugfix, reasoning_gym:NAME, a .jsonl file, or
    module:factory (a Task, an env class or factory, or an agent program)."""
    model: str = "default"
    """A model folder (e.g. runs/demo/policy), "default" (SmolLM2-135M-Instruct) or "tiny"."""
    data: str | None = None
    """For an agent-program --task: the questions it answers (a task name, a .jsonl file, or
    module:factory of an env or Task)."""
    k: int = 1
    """Samples per item (pass@1..k); 1 with no --temperature is greedy only."""
    temperature: float | None = None
    """Temperature of the k samples (default: 1.0 when k > 1, greedy when k = 1)."""
    greedy: bool = True
    """Also run a greedy pass (one sample per item) before the sampled one, as the demos report both."""
    max_tokens: int | None = None
    """Completion budget per model call (default: the task's own: capitals 20, tools 40, else 128-256)."""
    limit: int | None = None
    """Evaluate only the first N items."""
    seeds: tuple[int, ...] = ()
    """Env seeds to evaluate (one item each) instead of the task's held-out rows."""
    seed: int = 0
    """The evaluated run's seed: samples are seeded from seed + 7 on, the demos' held-out rule, so
    the numbers of `ludic-lab demo --seed S` come back with --seed S."""
    out: str | None = None
    """Folder for <pass>.csv, <pass>.html (one row per episode) and summary.json; none: print only."""
    timeout_s: float | None = None
    """Seconds one episode may take (default: the rollout engine's 600); long workspace episodes
    of a busy CPU need more."""
    backend: Literal["local", "vllm"] = "local"
    """Sampler: "local" (in-process) or "vllm" (the bundled vLLM server)."""
    max_batch_size: int = 64
    """The in-process sampler's batch (the demo's is questions per step x group size)."""

    def __post_init__(self) -> None:
        from ludic_lab.validation import check_config

        check_config(
            self,
            {
                "k": ">= 1",
                "max_tokens": ">= 1",
                "limit": ">= 1",
                "max_batch_size": ">= 1",
                "temperature": ">= 0",
                "timeout_s": "> 0",
            },
            hints={"k": "k samples per item give pass@1..k"},
        )
        if not self.task.strip():
            raise ValueError("EvalConfig.task is empty; name a task (capitals), a .jsonl file or module:factory")

    def preflight(self) -> None:
        """What must hold before the model loads (well under a second for a bundled task): the
        model folder or name, and the task (and data) resolve; an agent program has data."""
        from ludic_lab.demos.preflight import check_model
        from ludic_lab.eval.task_eval import is_agent_program
        from ludic_lab.eval.task_spec import as_eval_task, resolve

        try:
            check_model(self.model)
        except ValueError as e:
            raise ValueError(str(e).replace("DemoConfig.model", "EvalConfig.model")) from e
        try:
            obj = resolve(self.task, extra=cli_tasks())
        except ValueError as e:
            raise ValueError(f"EvalConfig.task: {e}") from e
        if is_agent_program(obj) and self.data is None:
            raise ValueError(
                f"EvalConfig.task {self.task!r} is an agent program: say which questions it answers with "
                "EvalConfig.data (a task name such as capitals, a .jsonl file, or module:factory of an env)"
            )
        if self.data is not None and not is_agent_program(obj):
            raise ValueError("EvalConfig.data is for an agent-program EvalConfig.task; a task brings its own rows")
        field, spec = ("data", self.data) if self.data is not None else ("task", obj)
        try:
            as_eval_task(spec, extra=cli_tasks())  # builds the task (one env at most): its errors now
        except ValueError as e:
            raise ValueError(f"EvalConfig.{field}: {e}") from e

    def passes(self) -> list[tuple[str, int, float]]:
        """``(name, k, temperature)`` of each pass this config runs, in order."""
        temp = self.temperature if self.temperature is not None else (1.0 if self.k > 1 else 0.0)
        if temp == 0:
            return [("greedy", self.k, 0.0)]
        return ([("greedy", 1, 0.0)] if self.greedy else []) + [("sampled", self.k, temp)]


def cli_tasks() -> dict[str, Any]:
    """Task names the command knows besides :data:`ludic_lab.eval.task_spec.NAMES`: ``tools``
    (the calculator demo's held-out questions, with its ToolAgent)."""

    def tools() -> Any:
        from ludic_lab.data import load_multiplication
        from ludic_lab.demos.tool_task import multiplication_task
        from ludic_lab.eval.task_spec import EvalTask

        return EvalTask(multiplication_task(load_multiplication("test")), None, 40)

    return {"tools": tools}


def _interval(s: dict[str, Any], key: str) -> str:
    lo, hi = s.get(f"{key}_ci_low"), s.get(f"{key}_ci_high")
    if not isinstance(lo, float) or math.isnan(lo):
        return ""
    return f" [{lo:.2f}, {hi:.2f}]"


def summary_line(name: str, s: dict[str, Any]) -> str:
    """One pass's summary as one line: accuracy and pass@k with their 95% intervals, reward,
    format errors, tool calls (when reported), failures and time."""
    k = int(s["k"])
    parts = [f"{name:<8} {s['num_items']} items x {k}", f"accuracy {s['accuracy']:.3f}{_interval(s, 'accuracy')}"]
    if k > 1:
        parts.append(f"pass@{k} {s[f'pass@{k}']:.3f}{_interval(s, f'pass@{k}')}")
    parts += [f"mean reward {s['mean_reward']:.3f}", f"format errors {s['parse_error_rate']:.3f}"]
    if "tool_call_rate" in s:
        parts.append(f"tool calls {s['tool_call_rate']:.3f} ({s['tool_calls_per_episode']:.2f}/episode)")
    parts.append(f"failed {s['num_failed']}, {s['duration_s']:.1f}s")
    return " | ".join(parts)


def write_pass(out: Path, name: str, result: Any) -> None:
    """``<out>/<name>.csv`` and ``<out>/<name>.html``: the per-episode table (the HTML with the summary above)."""
    result.table.to_csv(out / f"{name}.csv", index=False)
    page = result._repr_html_() + result.table.to_html(index=False, na_rep="", border=0)
    (out / f"{name}.html").write_text(f"<!doctype html><meta charset='utf-8'><title>{name}</title>{page}\n")


async def run_eval(cfg: EvalConfig) -> dict[str, Any]:
    """Run every pass of ``cfg`` on one loaded model; print a line each, write ``--out``; return
    ``{pass name: summary}``."""
    from ludic_lab.eval import evaluate_task
    from ludic_lab.sampler import Sampler

    cfg.preflight()
    out = Path(cfg.out) if cfg.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, Any] = {}
    async with Sampler(cfg.backend, cfg.model, max_batch_size=cfg.max_batch_size) as sampler:
        print(f"model {sampler.model_path} ({cfg.backend}), task {cfg.task}" + (f" on {cfg.data}" if cfg.data else ""))
        for name, k, temp in cfg.passes():
            result = await evaluate_task(
                sampler.client, cfg.task, data=cfg.data, seeds=cfg.seeds or None, limit=cfg.limit, k=k,
                temperature=temp, max_tokens=cfg.max_tokens, sampling_seed=cfg.seed + HELDOUT_SEED_OFFSET,
                timeout_s=cfg.timeout_s, extra_tasks=cli_tasks(), name=name,
            )  # fmt: skip
            summaries[name] = {**result.summary(), "temperature": temp}
            print(summary_line(name, summaries[name]), flush=True)
            if out is not None:
                write_pass(out, name, result)
    if out is not None:
        report = {"config": asdict(cfg), "model_path": sampler.model_path, "passes": summaries}
        (out / "summary.json").write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {out}/summary.json and " + ", ".join(f"{n}.csv/.html" for n in summaries))
    return summaries
