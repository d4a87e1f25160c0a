"""Resident memory of the main training paths, step by step: peak, per step, and growth.

Each path runs in its own subprocess (one path's heap never carries into the next), with a
thread sampling the process's resident set size (RSS, psutil) every 20 ms. The table gives,
per path: RSS when the first training step starts (models loaded, any evaluation before
training done), each step's peak (its rollouts included: a ``Trainer`` step pulls its batch)
and RSS at its end, the growth from the end of one step to the end of the next, the tokens
each step trained on (what the trainer's activations scale with), and the run's peak. The run
stops after ``--steps`` training steps (no evaluation after training: it measures training).

  capitals   ``ludic-lab demo``: GRPO + LoRA r=16 on SmolLM2, capital-city questions,
             ``--scale`` x 8 questions x 6 samples a step
  tools      ``ludic-lab demo --task tools``: the calculator tool, ``--scale`` x 4 x 6
             (the tool run only, not its no-tool control)
  agent      an agent program written against the ``openai`` SDK (one tool, ~490-token
             prompts with two few-shot exchanges, up to 3 calls of 80 tokens) behind
             ``OpenAIEndpoint`` over ``LocalChatClient(max_batch_size=16)``, run by
             ``AgentProgramProtocol``; GRPO + LoRA r=16, ``TrainerConfig(max_seq_len=1024)``
             (its other fields at their defaults: micro-batches of 8192 tokens),
             ``--scale`` x 4 questions x 8 samples = 32 episodes a step. Learning rate
             ``--agent-lr`` (1e-5): at 1e-3 this policy collapses after one step to one short
             reply, and the later steps would train on a fraction of the first one's tokens.
  tictactoe  ``examples/tic_tac_toe/train_tic_tac_toe.py``: ``--scale`` x 4 games x 4 plays
  textarena  ``train_env(textarena_task("TicTacToe-v0"))`` against TextArena's random opponent,
             ``--scale`` x 4 games x 4 plays = 16 games a step (``train_env``'s defaults otherwise)
  verifiers  ``train_env(verifiers_task("vf_calc"))``: the test suite's verifiers taskset with one
             tool (a calculator on a shared MCP server, ``tests/verifiers_envs``), ``--scale``
             x 4 tasks x 4 samples, 96 tokens a reply

``--merge-turns off`` trains the ``train_env`` paths one item per turn whatever the task says
(textarena merges a game's turns by default); ``--release-between off`` keeps the sampler's
prefix cache and malloc's free pages between the rollouts and the step whatever the task says
(``Task.release_between``: textarena releases them). ``--gradient-checkpointing on|off`` sets
``TrainerConfig.gradient_checkpointing`` of the agent, textarena and verifiers paths (default: each
path's own).

``--release on`` (the default) is ``TrainerConfig(release_host_memory=True)``: the trainer trims
glibc's arenas once, at a step's end, when that end is more than 10% above the resident memory
after the last trim. ``--release off`` runs with ``TrainerConfig(release_host_memory=False)`` (glibc's malloc
defaults: what the trainer did before it bounded host memory); ``--release map`` also maps every
block of 1 MiB and more on its own from the start (``map_large_blocks``: what the option did
until it cost 1.3x the seconds a step; see ``ludic_lab/training/host_memory.py`` and
``bench/memory_speed.py``). Each step's peak is also given per phase: its rollouts (sampling),
packing, forward/backward with the optimizer step, and publishing into the sampler. On 2 cores
SmolLM2 takes minutes per agent step at full scale; ``--scale 0.25`` keeps every path to a few GB.

    .venv/bin/python bench/memory.py                                   # all paths, 8 steps, full scale
    .venv/bin/python bench/memory.py --paths agent --steps 8 --scale 0.25
    .venv/bin/python bench/memory.py --paths agent,capitals --steps 4 --release off
    .venv/bin/python bench/memory.py --model tiny --steps 3 --scale 0.25   # a quick check of the bench
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PATHS = ("capitals", "tools", "agent", "tictactoe", "textarena", "verifiers")
MB = 2**20


# -- in the child: the RSS monitor and the step hook -----------------------------------------------


PHASES = ("sampling", "pack", "fwd_bwd", "publish")
"""A step's phases, in order: its rollouts (the batch source's pull), packing the batch into
micro-batches, forward/backward and the optimizer step, publishing into the sampler."""


@dataclass
class Monitor:
    """RSS sampled every ``interval_s``; the peak since the last :meth:`mark`, of the run, and
    of each phase of the current step (:meth:`phase` names the phase the process is in)."""

    interval_s: float = 0.02
    peak: int = 0
    run_peak: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)
    before: int | None = None
    phase_peaks: dict[str, int] = field(default_factory=dict)
    current: str = "sampling"

    def __post_init__(self) -> None:
        import psutil

        self._proc = psutil.Process()
        threading.Thread(target=self._sample, daemon=True).start()

    def rss(self) -> int:
        r = int(self._proc.memory_info().rss)
        self.peak, self.run_peak = max(self.peak, r), max(self.run_peak, r)
        self.phase_peaks[self.current] = max(self.phase_peaks.get(self.current, 0), r)
        return r

    def _sample(self) -> None:
        while True:
            self.rss()
            time.sleep(self.interval_s)

    def mark(self) -> int:
        """RSS now; the step peak and the phase peaks start again from it (phase: sampling)."""
        self.phase_peaks, self.current = {}, "sampling"
        r = self.rss()
        self.peak = r
        return r

    def phase(self, name: str) -> None:
        """From now on the process is in phase ``name``: its peak starts from RSS now."""
        self.rss()
        self.current = name
        self.rss()


class Done(Exception):
    """Raised by the step hook after the last measured step: the run stops there."""


def _cpu_s() -> float:
    """CPU seconds of this process so far, every thread, user and system."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _in_phase(monitor: Monitor, name: str, fn: Any) -> Any:
    """``fn`` wrapped so that the monitor is in phase ``name`` from its call on."""

    def wrapped(*a: Any, **kw: Any) -> Any:
        monitor.phase(name)
        return fn(*a, **kw)

    return wrapped


def hook_trainer(monitor: Monitor, steps: int, release: str) -> None:
    """Record RSS around every ``Trainer.train_step`` of the first trainer built, by phase; stop after ``steps``."""
    import ludic_lab.training.trainer as trainer_mod

    if release == "off" and hasattr(trainer_mod, "HostMemory"):  # works on a library without it too
        off = trainer_mod.HostMemory
        setattr(trainer_mod, "HostMemory", lambda enabled: off(False))  # noqa: B010
    if release == "map":
        from ludic_lab.training.host_memory import map_large_blocks

        map_large_blocks()
    trainer_mod.pack_step = _in_phase(monitor, "pack", trainer_mod.pack_step)  # type: ignore[attr-defined]
    for method, name in (("_forward_backward", "fwd_bwd"), ("_publish_and_checkpoint", "publish")):
        setattr(trainer_mod.Trainer, method, _in_phase(monitor, name, getattr(trainer_mod.Trainer, method)))
    original = trainer_mod.Trainer.train_step
    first: list[Any] = []

    async def train_step(self: Any) -> dict[str, Any]:
        if first and first[0] is not self:  # e.g. the tool demo's no-tool control
            raise Done
        first[:1] = [self]
        start = monitor.mark()
        if monitor.before is None:
            monitor.before = start
        t0, cpu0 = time.perf_counter(), _cpu_s()
        metrics = await original(self)
        end = monitor.rss()
        monitor.steps.append(
            {"peak": monitor.peak, "end": end, "tokens": int(metrics.get("tokens", 0) or 0),
             "seconds": round(time.perf_counter() - t0, 1), "cpu_s": round(_cpu_s() - cpu0, 1),
             "phases": dict(monitor.phase_peaks)}
        )  # fmt: skip
        if len(monitor.steps) >= steps:
            raise Done
        return metrics

    trainer_mod.Trainer.train_step = train_step  # type: ignore[method-assign]


def child(args: argparse.Namespace) -> None:
    """Run one path; write the monitor's figures as JSON to ``args.result``."""
    sys.path.insert(0, str(ROOT / "bench"))
    from memory_paths import RUNNERS

    monitor = Monitor()
    hook_trainer(monitor, args.steps, args.release)
    error = None
    with tempfile.TemporaryDirectory() as out:
        try:
            asyncio.run(RUNNERS[args.child](args, out))
        except Done:
            pass
        except BaseException as e:  # noqa: BLE001 - reported in the table's row
            error = f"{type(e).__name__}: {e}"
    result = {"before": monitor.before, "steps": monitor.steps, "peak": monitor.run_peak, "error": error}
    Path(args.result).write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # background threads (the endpoint's server, the sampler) need no joining


# -- the parent: one subprocess per path, the table -----------------------------------------------------


def measure(path: str, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    result = log_dir / f"{path}.json"
    cmd = [sys.executable, __file__, "--child", path, "--result", str(result), "--steps", str(args.steps),
           "--scale", str(args.scale), "--model", args.model, "--release", args.release,
           "--agent-lr", str(args.agent_lr), "--micro-token-budget", str(args.micro_token_budget),
           "--merge-turns", args.merge_turns, "--release-between", args.release_between,
           "--gradient-checkpointing", args.gradient_checkpointing]  # fmt: skip
    t0 = time.perf_counter()
    with open(log_dir / f"{path}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False)
    if not result.exists():
        tail = (log_dir / f"{path}.log").read_text()[-2000:]
        return {"error": f"exit {proc.returncode}: {tail}", "steps": [], "before": None, "peak": 0}
    data: dict[str, Any] = json.loads(result.read_text())
    data["wall_s"] = time.perf_counter() - t0
    return data


def _mb(x: int | None) -> str:
    return "-" if x is None else f"{x / MB:,.0f}"


def report(path: str, data: dict[str, Any]) -> dict[str, str]:
    """Print ``path``'s per-step rows; return its summary row."""
    steps = data["steps"]
    print(f"\n{path}: before training {_mb(data['before'])} MB" + (f"  ERROR {data['error']}" if data["error"] else ""))
    phases = "".join(f" {p + ' MB':>11}" for p in PHASES)
    head = f"{'end MB':>9} {'growth MB':>10} {'wall s':>7} {'cpu s':>7}"
    print(f"  {'step':>4} {'tokens':>7} {'peak MB':>9}{phases} {head}")
    prev = data["before"]
    for i, s in enumerate(steps, 1):
        growth = "" if prev is None else f"{(s['end'] - prev) / MB:+,.0f}"
        by_phase = "".join(f" {_mb(s.get('phases', {}).get(p)):>11}" for p in PHASES)
        mem = f"{_mb(s['peak']):>9}{by_phase} {_mb(s['end']):>9} {growth:>10}"
        print(f"  {i:>4} {s['tokens']:>7} {mem} {s['seconds']:>7} {s.get('cpu_s', '-'):>7}")
        prev = s["end"]
    ends = [s["end"] for s in steps]
    per_step = "-" if len(ends) < 2 else f"{(ends[-1] - ends[0]) / (len(ends) - 1) / MB:+,.0f}"
    return {
        "path": path,
        "steps": str(len(steps)),
        "tokens/step": "-" if not steps else f"{statistics.fmean(s['tokens'] for s in steps):,.0f}",
        "before": _mb(data["before"]),
        "step 1 peak": _mb(steps[0]["peak"]) if steps else "-",
        "last step peak": _mb(steps[-1]["peak"]) if steps else "-",
        "run peak": _mb(data["peak"]),
        "end: first -> last": f"{_mb(ends[0])} -> {_mb(ends[-1])}" if ends else "-",
        "growth/step after 1": per_step,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--steps", type=int, default=8, help="training steps measured per path")
    ap.add_argument("--scale", type=float, default=1.0, help="episodes per step, times each path's own")
    ap.add_argument("--model", default="default", help='"default" (SmolLM2-135M), "tiny" or a model folder')
    ap.add_argument(
        "--release",
        choices=("on", "off", "map"),
        default="on",
        help="on: TrainerConfig.release_host_memory (a trim when a step ends more than 10%% above the "
        "resident memory after the last trim); off: glibc's malloc defaults; map: on, plus every block of "
        "1 MiB or more mapped on its own from the start (map_large_blocks)",
    )
    ap.add_argument("--agent-lr", type=float, default=1e-5, help="the agent path's learning rate")
    ap.add_argument(
        "--micro-token-budget",
        type=int,
        default=0,
        help="TrainerConfig.micro_token_budget of the agent, textarena and verifiers paths (0: theirs)",
    )
    ap.add_argument(
        "--merge-turns",
        choices=("task", "off"),
        default="task",
        help="train_env paths: the task's Task.merge_turns (textarena: on), or off (one item per turn)",
    )
    ap.add_argument(
        "--release-between",
        choices=("task", "off"),
        default="task",
        help="train_env paths: the task's Task.release_between (textarena: on: the sampler's prefix cache and "
        "malloc's free pages released before and after each batch's rollouts), or off",
    )
    ap.add_argument(
        "--gradient-checkpointing",
        choices=("path", "on", "off"),
        default="path",
        help="TrainerConfig.gradient_checkpointing of the agent, textarena and verifiers paths (path: theirs)",
    )
    ap.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if bad := [p for p in paths if p not in PATHS]:
        ap.error(f"unknown path(s) {bad}; choose from {', '.join(PATHS)}")
    print(
        f"memory: {args.steps} steps, scale {args.scale}, model {args.model}, release_host_memory {args.release}, "
        f"micro_token_budget {args.micro_token_budget or 'the path default'}, merge_turns {args.merge_turns}, "
        f"release between phases {args.release_between}, gradient checkpointing {args.gradient_checkpointing}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in paths:
            rows.append(report(p, measure(p, args, Path(tmp))))
    cols = list(rows[0])
    widths = [max(len(c), *(len(r[c]) for r in rows)) for c in cols]
    print("\nresident memory (MB; growth: end of step k minus end of step k-1, averaged over steps 2..N)")
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for r in rows:
        print("  ".join(r[c].rjust(w) for c, w in zip(cols, widths, strict=True)))


if __name__ == "__main__":
    main()
