"""GRPO + LoRA on an OpenEnv environment server: SmolLM2 learns to answer capital-city questions
that a separate server process asks and scores.

What it shows: an environment written with ``openenv-core``'s own API (an ``Action`` and an
``Observation`` as pydantic models, an ``Environment`` with ``reset`` / ``step`` / ``state``,
served by ``create_app``: what ``openenv init`` writes), trained on by ludic_lab without
rewriting it. The first half of this file is that environment; nothing in it knows ludic_lab.
The second half starts it once as a uvicorn subprocess
(:class:`~ludic_lab.integrations.openenv_server.OpenEnvServer`), gives every episode its own
WebSocket session on it (:class:`~ludic_lab.integrations.openenv_env.OpenEnvEnv`: the reply
is the action's ``message`` field, the observation's ``question`` the prompt, the server's
reward the step's reward) and trains with GRPO (groups of ``group_size`` samples of a
question, group-normalised advantages, clipped token surrogate), LoRA, the merged weights
pushed into the in-process sampler after every step. The server is stopped at the end.

Task: the built-in capitals data (105 countries train, 26 held out, ``ludic_lab/data``),
asked by the server: ``reset(seed=i)`` picks question ``i`` (seeds 0-104 train, 105-130 the
held-out ones), ``step`` scores the reply with the capitals verifier (1 when it names the
right capital and no other), one turn per episode. Replies cut at ``max_tokens`` score -0.1
(the agent's default), as in ``ludic-lab demo``, whose task this is, so the two compare.

Launch:

    python examples/openenv_server.py                                     # SmolLM2, CPU
    python examples/openenv_server.py --model tiny --steps 1 --eval-k 2   # smoke (random model)

Before and after training it answers the held-out questions greedily and ``eval_k`` times
sampled at temperature 1 (pass@k); ``<out>/summary.json`` holds both, the reward per step
and the wall time.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ludic_lab.aio import run_sync
from ludic_lab.config import parse_config
from ludic_lab.recipes.training import lora_trainer_field, output_dir, pass_down_trainer
from ludic_lab.training.config import TrainerConfig

MAX_SESSIONS = 64
"""The server's ``max_concurrent_envs``: one WebSocket session (one environment) per episode in flight."""


# -- the environment: an OpenEnv server, written with openenv-core's API -------------------------
def build_app() -> Any:
    """The FastAPI app of the capitals environment (uvicorn calls it: ``--factory``)."""
    from openenv.core.env_server.http_server import create_app
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field

    from ludic_lab.data import capital_verifier, load_capitals

    rows = load_capitals("train") + load_capitals("test")  # seed i -> row i
    verify = capital_verifier()

    class CapitalAction(Action):
        message: str = Field(..., description="The answer")

    class CapitalObservation(Observation):
        question: str = Field(default="", description="The question, or the verdict on the answer")

    class CapitalsEnvironment(Environment):
        SUPPORTS_CONCURRENT_SESSIONS = True  # each session gets its own instance

        def __init__(self) -> None:
            self._state, self._row = State(step_count=0), rows[0]

        def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CapitalObservation:
            self._state, self._row = State(episode_id=episode_id, step_count=0), rows[(seed or 0) % len(rows)]
            return CapitalObservation(question=self._row["question"], done=False, reward=0.0)

        def step(self, action: CapitalAction, timeout_s: float | None = None, **kwargs: Any) -> CapitalObservation:
            self._state.step_count += 1
            right = verify(action.message, self._row["answer"])
            verdict = "Correct." if right else f"Wrong: it is {self._row['answer']}."
            return CapitalObservation(question=verdict, done=True, reward=float(right))

        @property
        def state(self) -> State:
            return self._state

    return create_app(CapitalsEnvironment, CapitalAction, CapitalObservation, env_name="capitals",
                      max_concurrent_envs=MAX_SESSIONS)  # fmt: skip


# -- the run: ludic_lab trains on the server --------------------------------------------------------
TRAIN, HELD_OUT = 105, 26
SYSTEM_PROMPT = "Answer with just the name of the city."


@dataclass
class Config:
    """GRPO + LoRA on capital-city questions asked and scored by an OpenEnv server."""

    model: str = "default"
    """Policy: "default" (SmolLM2-135M-Instruct), "tiny" (the test model) or a local model folder."""
    steps: int = 30
    """Optimizer steps."""
    questions_per_step: int = 8
    """Distinct questions (GRPO groups) per step."""
    group_size: int = 6
    """Samples of each question."""
    max_tokens: int = 20
    """Completion budget (a reply cut there scores -0.1)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer scores at the same one)."""
    eval_k: int = 4
    """Held-out samples per question at temperature 1 (pass@k); 0 skips the sampled evaluation."""
    trainer: TrainerConfig = lora_trainer_field(lr=3e-4, max_seq_len=512, micro_token_budget=4096)
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r``, ...); LoRA alpha 2r."""
    device: str = "cpu"
    """Training device."""
    seed: int = 0
    """Seeds questions, sampling and the LoRA initialisation."""
    out: str = "runs/openenv_server"
    """Output folder: metrics.jsonl, summary.json."""

    def __post_init__(self) -> None:
        pass_down_trainer(self)  # seed, device and sampling temperature into the trainer's config


async def held_out(task: Any, client: Any, cfg: Config, name: str) -> dict[str, float]:
    """Greedy accuracy on the held-out questions, and sampled accuracy / pass@k with ``eval_k`` > 0."""
    greedy = await task.evaluate(client, max_tokens=cfg.max_tokens, name=f"{name}_greedy")
    out = {"greedy_accuracy": round(float(greedy["accuracy"]), 4), "failed": greedy["num_failed"]}
    if cfg.eval_k > 0:
        sampled = await task.evaluate(client, k=cfg.eval_k, temperature=1.0, max_tokens=cfg.max_tokens,
                                      sampling_seed=cfg.seed + 7, name=f"{name}_sampled")  # fmt: skip
        out["sampled_accuracy"] = round(float(sampled["accuracy"]), 4)
        out[f"pass@{cfg.eval_k}"] = round(float(sampled[f"pass@{cfg.eval_k}"]), 4)
    print(f"{name}: held-out {out}", flush=True)
    return out


async def run(cfg: Config) -> dict[str, Any]:
    from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
    from ludic_lab.integrations.openenv_env import OpenEnvServer
    from ludic_lab.recipes import Sampler
    from ludic_lab.recipes.training import finish_example, sampler_trainer, train_timed
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.task.external.openenv import openenv_task
    from ludic_lab.training import make_grpo

    out, t_start = output_dir(cfg.out), time.perf_counter()
    here = str(Path(__file__).resolve().parent)
    # started once for every episode of the run; each episode opens its own session on it
    async with OpenEnvServer.launch("openenv_server:build_app", cwd=here, uvicorn_args=["--factory"],
                                    max_sessions=MAX_SESSIONS) as server:  # fmt: skip
        task = openenv_task(server, name="capitals", train_size=TRAIN, eval_size=HELD_OUT, system_prompt=SYSTEM_PROMPT)
        batch = cfg.questions_per_step * cfg.group_size
        async with Sampler("local", cfg.model, max_batch_size=max(batch, HELD_OUT * max(1, cfg.eval_k))) as sampler:
            before = await held_out(task, sampler.client, cfg, "before")
            spec = InferenceSpec(SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens),
                                 ReturnSpec.for_training())  # fmt: skip
            requests = task.requests(per_step=cfg.questions_per_step, seed=cfg.seed, inference=spec)
            algo = make_grpo()
            source = RolloutBatchSource(
                task.engine(sampler.client), requests, algo.credit_assigner, max_steps=1,
                request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
            )  # fmt: skip
            trainer = sampler_trainer(sampler, algo, source, cfg.trainer, out=out, run_config=asdict(cfg))
            history, train_s = await train_timed(trainer, cfg.steps)
            trainer.close()
            after = await held_out(task, sampler.client, cfg, "after")
    rewards = [round(float(h.get("reward_mean", float("nan"))), 4) for h in history]
    head, tail = rewards[:5], rewards[-5:]
    summary = {
        "config": asdict(cfg),
        "before": before,
        "after": after,
        "reward_per_step": rewards,
        "reward_first5_last5": [round(sum(head) / len(head), 4), round(sum(tail) / len(tail), 4)],
        "train_seconds": round(train_s, 1),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
    }
    show = ("before", "after", "reward_first5_last5", "train_seconds", "wall_seconds", "policy")
    return finish_example(trainer, out, summary, evals={"held-out": (before, after)}, show=show)


def main(cfg: Config) -> dict[str, Any]:
    """Train and evaluate as ``cfg`` says; returns the summary (also in ``<out>/summary.json``)."""
    return run_sync(run(cfg))


if __name__ == "__main__":
    main(parse_config(Config))
