"""GRPO + LoRA where no exact match can grade: "explain X in one sentence a young child understands".

What it shows: a reward that needs a judge, wired the standard way. The env
(``explain_engine``: one question per episode, the reply taken as it is) gives 0; the reward
is a :class:`~ludic_lab.judges.RubricJudge` applied to every batch right after generation,
``RolloutBatchSource(rewards=[judge])``, before GRPO's group-normalised advantages. The judge
is a *frozen* second ``LocalChatClient`` (same weights as the starting policy, never updated),
so the held-out score before and after training is judged alike; the policy's own sampler
would drift with the weights it judges.

The rubric (``ludic_lab.demos.explain_task.explain_rubric``) is a hybrid, because the only
judges here are 135M-270M models. Code judges what code can judge honestly: one sentence,
at most 25 words, names the concept asked about (weight 2), plain words. The model judges
"a correct explanation a young child understands" as the probability of "yes" against "no"
at its reply's first token (``ask="logprob"``), after four worked examples (a good and a
bad answer for two concepts not in the data), weight ``model_weight``. Score = weighted mean
of the criteria in [0, 1]; a reply cut at ``max_tokens`` also gets the agent's -0.1.

How much to trust each part, measured on 24 hand-labelled answers
(``bench/judge_agreement.py``, docs/judges.md): the code checks put a good answer above a
bad one of the same concept in 0.71 of pairs (they cannot see a fluent false answer);
SmolLM2's verdict, in every prompt form tried, is not reliably better than chance (0.38 to
0.71 of pairs, one probe at 1.00 that did not reproduce). So its criterion ``good`` rising
means "the judge liked the answers more", not "a child would understand them better".
The rubric with it agrees less than the code checks alone (0.62 against 0.71 of pairs):
with this judge ``--model-weight 0`` (the code checks alone) is the more honest reward; the
default keeps the model criterion to show a model judge at work, and ``--judge-model`` takes
any local model folder (a stronger judge drops into the same place).

Measured here (2026-11-26, 2 cores shared with 4-5 other jobs, load 6-8, so timings are
noisy upper bounds), ``--steps 6``: held-out judge score (12 concepts, greedy, same frozen
judge) 0.843 -> 0.932, ``good`` (the model's P(yes)) 0.66 -> 0.84, ``short`` 0.67 -> 1.00;
154 judge calls (2 cache hits, 0 failures); judge 203 s against generation 123 s (0.62 of
rollout time, 0.45 of the 452 s of steps); 964 s wall. **And the run was reward-hacked**:
the mean answer shrank from 32 to 6 tokens, held-out answers became fragments ("A tornado",
"to clean") that pass every code check and that the weak judge liked more. With
``--model-weight 0`` (code checks alone, 203 s wall) the same 6 steps gave full plain
sentences ("A big earthquake makes the ground shake."), score 0.917 -> 1.000. Details and
the fix still to make (a check a fragment fails, or a stronger judge): docs/judges.md.

Launch:

    python examples/judges/train_explain.py                                   # SmolLM2 policy and judge, CPU
    python examples/judges/train_explain.py --model tiny --judge-model tiny --steps 1   # smoke (random models)

Before and after training the policy answers the 12 held-out concepts greedily; the same
frozen judge scores them (``score``, per criterion). ``<out>/summary.json`` holds both, the
reward per step, the judge's calls and cache hits, and its share of the step's time
(``rewards/seconds`` against ``generation_s``). Measured runs: docs/judges.md.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from ludic_lab.aio import run_sync
from ludic_lab.config import parse_config
from ludic_lab.data import load_explain_concepts
from ludic_lab.demos.explain_task import evaluate_explain, explain_engine, explain_judge
from ludic_lab.inference import LocalChatClient
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.recipes import Sampler
from ludic_lab.recipes.training import (
    finish_example,
    lora_trainer_field,
    output_dir,
    pass_down_trainer,
    sampler_trainer,
    train_timed,
)
from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
from ludic_lab.task import RequestStream
from ludic_lab.training import make_grpo
from ludic_lab.training.config import TrainerConfig


@dataclass
class Config:
    """GRPO + LoRA on child-level explanations, rewarded by a frozen rubric judge."""

    model: str = "default"
    """Policy: "default" (SmolLM2-135M-Instruct), "tiny" (the test model) or a local model folder."""
    judge_model: str = "default"
    """Judge (frozen): a model name or folder; loaded once as its own LocalChatClient."""
    model_weight: float = 2.0
    """Weight of the model-judged criterion next to the code checks (1, 1, 2, 1); 0: code checks only."""
    steps: int = 8
    """Optimizer steps."""
    questions_per_step: int = 4
    """Distinct concepts (GRPO groups) per step."""
    group_size: int = 6
    """Samples of each concept."""
    max_tokens: int = 48
    """Completion budget (a good answer is about 20 tokens)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same one)."""
    trainer: TrainerConfig = lora_trainer_field(lr=1e-3, max_seq_len=256)
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r`` (0 = train every
    weight), ``--micro-token-budget`` (tokens per micro-batch, padding included: small keeps CPU
    memory low; raise it on a GPU), ...); LoRA alpha 2r."""
    eval_concepts: int = 12
    """Held-out concepts answered (greedy) and judged before and after training (of 12)."""
    device: str = "cpu"
    """Training device."""
    seed: int = 0
    """Seeds concepts, sampling and the LoRA initialisation."""
    out: str = "runs/explain"
    """Output folder: metrics.jsonl, summary.json."""

    def __post_init__(self) -> None:
        pass_down_trainer(self)  # seed, device and sampling temperature into the trainer's config


def judge_share(history: list[dict[str, Any]], name: str = "explain") -> dict[str, Any]:
    """Judge calls, cache hits and seconds over the run, and the judge's share of generation + judging."""
    get = lambda key: [float(h.get(f"source/{key}", 0.0) or 0.0) for h in history]  # noqa: E731
    judge_s, gen_s, step_s = (
        sum(get("rewards/seconds")),
        sum(get("generation_s")),
        sum(h["time/step_s"] for h in history),
    )
    return {
        "judge_calls": int(sum(get(f"rewards/{name}/judge_calls"))),
        "cache_hits": int(sum(get(f"rewards/{name}/cache_hits"))),
        "judge_failures": int(sum(get(f"rewards/{name}/failures"))),
        "judge_seconds": round(judge_s, 1),
        "generation_seconds": round(gen_s, 1),
        "step_seconds": round(step_s, 1),
        "judge_share_of_rollout_time": round(judge_s / (judge_s + gen_s), 3) if judge_s + gen_s else None,
        "judge_share_of_step_time": round(judge_s / step_s, 3) if step_s else None,
    }


def _held_out(ev: dict[str, Any]) -> dict[str, Any]:
    return {"score": round(ev["score"], 4), "criteria": {k: round(v, 3) for k, v in ev["criteria"].items()},
            "failed": ev["failed"], "answers": ev["answers"][:4]}  # fmt: skip


async def run(cfg: Config) -> dict[str, Any]:
    out = output_dir(cfg.out)
    train_rows, test_rows = load_explain_concepts("train"), load_explain_concepts("test")[: cfg.eval_concepts]
    t_start = time.perf_counter()
    batch = cfg.questions_per_step * cfg.group_size
    judge_client = LocalChatClient(cfg.judge_model, max_batch_size=64)  # frozen: no publisher ever targets it
    judge = explain_judge(judge_client, model_weight=cfg.model_weight)
    async with Sampler("local", cfg.model, max_batch_size=max(batch, cfg.eval_concepts)) as sampler:
        before = await evaluate_explain(sampler.client, judge, test_rows, max_tokens=cfg.max_tokens, name="before")
        print(f"before: held-out judge score {before['score']:.3f} {before['criteria']}", flush=True)

        engine, env, protocol = explain_engine(sampler.client, train_rows)
        spec = InferenceSpec(
            SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens), ReturnSpec.for_training()
        )
        requests = RequestStream(env, protocol, per_step=cfg.questions_per_step, size=len(train_rows),  # next questions
                                 seed=cfg.seed, inference=spec, max_steps=1)  # fmt: skip

        algo = make_grpo()
        source = RolloutBatchSource(
            engine, requests, algo.credit_assigner, request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
            rewards=[judge],  # scored after generation, before the group advantages
        )  # fmt: skip
        config = cfg.trainer
        keys = ("reward_mean", "loss", "source/rewards/explain/mean", "source/rewards/seconds", "time/step_s")
        trainer = sampler_trainer(sampler, algo, source, config, out=out, console_keys=keys, run_config=asdict(cfg))
        history, train_s = await train_timed(trainer, cfg.steps)
        trainer.close()
        after = await evaluate_explain(sampler.client, judge, test_rows, max_tokens=cfg.max_tokens, name="after")
        print(f"after:  held-out judge score {after['score']:.3f} {after['criteria']}", flush=True)
    summary = {
        "config": asdict(cfg),
        "before": _held_out(before),
        "after": _held_out(after),
        "reward_per_step": [round(float(h.get("reward_mean", float("nan"))), 4) for h in history],
        "judge_score_per_step": [round(float(h.get("source/rewards/explain/mean", float("nan"))), 4) for h in history],
        "judge": judge_share(history),
        "train_seconds": round(train_s, 1),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
    }
    show = ("judge_score_per_step", "judge", "train_seconds", "wall_seconds", "policy")
    evals = {"held-out": (summary["before"], summary["after"])}
    return finish_example(trainer, out, summary, evals=evals, show=show)


def main(cfg: Config) -> dict[str, Any]:
    """Train and evaluate as ``cfg`` says; returns the summary (also in ``<out>/summary.json``)."""
    return run_sync(run(cfg))


if __name__ == "__main__":
    main(parse_config(Config))
