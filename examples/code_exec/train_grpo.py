"""GRPO on programs that must pass tests: SmolLM2 writes Python, a bubblewrap sandbox runs it.

The algorithm: for each training problem sample a group of G programs, run each against the
problem's tests in the sandbox (reward = fraction of tests passed; a program that does not
compile gets -0.1), normalise rewards within the group (GRPO), and take a clipped-surrogate
step on a LoRA adapter. The pass rate (all tests passed) on held-out problems is measured
before and after, greedy and for ``--eval-samples k`` programs sampled per problem (with
pass@k): the problems are the library's own small set (42 MBPP-format function problems,
every 4th held out), greedy SmolLM2 solves most of them already, and the sampled policy is
the one with room to move. Replies end at the code block's closing fence (``--stop-at-fence``).
On a shared CPU set ``OMP_NUM_THREADS=1`` (two threads on two busy cores ran >10x slower here).

    .venv/bin/python examples/code_exec/train_grpo.py                      # local sampler (transformers)
    .venv/bin/python examples/code_exec/train_grpo.py --steps 2 --smoke true   # CI smoke: a minute
    .venv/bin/python examples/code_exec/train_grpo.py --sampler vllm        # starts the bundled vLLM server

On a GPU machine the same commands apply (``--sampler vllm`` then serves from the GPU);
the sandbox stays on the CPU. The result is printed and written to ``<run_dir>/report.json``
(per-step metrics in ``<run_dir>/metrics.jsonl``).

Needs bubblewrap (scripts/install_system_deps.sh); the model's code never runs outside it.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from ludic_lab.config import pass_down
from ludic_lab.recipes.training import lora_trainer_field
from ludic_lab.training.config import TrainerConfig


@dataclass
class Config:
    model: str = "default"
    """SmolLM2-135M-Instruct (embedded) or a local model folder."""
    sampler: Literal["local", "vllm"] = "local"
    """Sample with the in-process model, or start the bundled vLLM server (weights pushed each step)."""
    steps: int = 12
    """Optimizer steps."""
    problems_per_step: int = 6
    group_size: int = 6
    max_tokens: int = 256
    """Completion budget; with ``stop_at_fence`` a reply ends at its code block's closing fence."""
    stop_at_fence: bool = True
    """End a completion at a line holding only the closing ```` ``` ```` (the model keeps
    explaining its code otherwise, and those tokens earn nothing but a cut reply)."""
    temperature: float = 1.0
    trainer: TrainerConfig = lora_trainer_field(lr=3e-4, max_seq_len=512, micro_token_budget=2048)
    """The trainer's config; each of its fields is a flag (``--lr``, ``--lora-r``, ...); LoRA alpha 2r."""
    sandboxes: int = 2
    """Concurrent sandboxes (one per core is plenty)."""
    per_test_timeout_s: float = 2.0
    eval_samples: int = 4
    """Also score this many programs per held-out problem sampled at ``temperature`` (pass
    rate and pass@k of the sampled policy, where learning shows before the greedy one moves; 0: off)."""
    seed: int = 0
    run_dir: str = "runs/code_exec"
    smoke: bool = False
    """Tiny settings for CI: 2 problems x 2 samples, 48 tokens, 4 held-out problems, 2 samples each."""

    def __post_init__(self) -> None:
        pass_down(self, "trainer", scoring_temperature=self.temperature)  # seed too; the trainer scores as sampled


def split(rows: list[dict], name: str) -> list[dict]:
    return [r for r in rows if r.get("split") == name]


async def main(cfg: Config) -> dict:
    from transformers import AutoModelForCausalLM

    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.envs.code_exec import CodeExecConfig, CodeExecEnv, RunConfig, SandboxPool, shipped_problems
    from ludic_lab.eval import evaluate
    from ludic_lab.eval.success import InfoKeySuccess
    from ludic_lab.inference import InferenceSpec, SamplingConfig
    from ludic_lab.interaction import SingleAgentSyncProtocol
    from ludic_lab.rollouts import (
        EnvSpec,
        GRPORequestStrategy,
        ProtocolSpec,
        RolloutBatchSource,
        RolloutEngine,
        RolloutRequest,
    )
    from ludic_lab.sampler import Sampler
    from ludic_lab.training import Trainer, make_grpo
    from ludic_lab.training.loggers import JSONLLogger

    if cfg.smoke:
        cfg.problems_per_step, cfg.group_size, cfg.max_tokens = 2, 2, 48
        cfg.eval_samples = min(cfg.eval_samples, 2)
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    rows = shipped_problems("code_problems")
    train, test = split(rows, "train"), split(rows, "test")
    if cfg.smoke:
        test = test[:4]

    env_cfg = CodeExecConfig(run=RunConfig(per_test_timeout_s=cfg.per_test_timeout_s), partial_credit=True)

    # the bundled vLLM server (--sampler vllm) is stopped on leaving, also on error
    async with Sampler(cfg.sampler, cfg.model, max_batch_size=cfg.problems_per_step * cfg.group_size,
                       log_dir=cfg.run_dir, max_model_len=1024) as sampler:  # fmt: skip
        async with SandboxPool(cfg.sandboxes) as pool:  # refuses to start without bubblewrap
            client, model_path = sampler.client, sampler.model_path

            def engine_for(data: list[dict]) -> RolloutEngine:
                return RolloutEngine(
                    {"code": lambda: CodeExecEnv(data, pool=pool, config=env_cfg)},
                    {
                        "single": lambda: SingleAgentSyncProtocol(
                            Agent(client, FullDialog(), CodeExecEnv.recommended_parser())
                        )
                    },
                    max_concurrency=cfg.problems_per_step * cfg.group_size,
                )

            stop = ("\n```\n",) if cfg.stop_at_fence else ()
            sampling = InferenceSpec(SamplingConfig(temperature=cfg.temperature, max_tokens=cfg.max_tokens, stop=stop))

            async def held_out(name: str) -> dict:
                args = (engine_for(test), EnvSpec("code"), ProtocolSpec("single"), range(len(test)))
                kw = dict(inference=sampling, success=InfoKeySuccess("all_passed"), name=name)
                runs = {"greedy": await evaluate(*args, temperature=0.0, **kw)}
                if cfg.eval_samples > 0:
                    runs["sampled"] = await evaluate(*args, k=cfg.eval_samples, temperature=cfg.temperature, **kw)
                out = {}
                for how, res in runs.items():
                    s, t = res.summary(), res.table
                    out[how] = {
                        "pass_rate": s["accuracy"],
                        f"pass@{res.k}": s[f"pass@{res.k}"],
                        "samples": len(t),
                        "failed_episodes": s["num_failed"],
                        "parse_error_rate": s["parse_error_rate"],
                        "cut_at_max_tokens": float((t["finish_reason"] == "length").mean()),
                        "mean_completion_tokens": s["mean_completion_tokens"],
                        "minutes": round(res.duration_s / 60, 2),
                    }
                print(
                    json.dumps({"held_out": name, **out}), flush=True
                )  # the numbers so far, should a long run be stopped
                return out

            t0 = time.perf_counter()
            before = await held_out("before")
            algo = make_grpo()
            engine = engine_for(train)
            source = RolloutBatchSource(
                engine,
                lambda: [
                    RolloutRequest(
                        env=EnvSpec("code"),
                        protocol=ProtocolSpec("single"),
                        inference=sampling,
                        num_episodes=cfg.problems_per_step,
                    )
                ],
                algo.credit_assigner,
                request_strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
            )
            policy = AutoModelForCausalLM.from_pretrained(model_path)
            publisher = sampler.publisher(policy)  # LoRA merged, pushed after each step
            trainer = Trainer(
                policy,
                algo,
                source,
                config=cfg.trainer,
                publisher=publisher,
                pad_token_id=client.pad_token_id,
                loggers=[JSONLLogger(f"{cfg.run_dir}/metrics.jsonl")],
            )
            history = await trainer.train(cfg.steps, progress=False)
            after = await held_out("after")
            report = {
                "config": asdict(cfg),
                "held_out_problems": len(test),
                "pass_rate_before": before["greedy"]["pass_rate"],
                "pass_rate_after": after["greedy"]["pass_rate"],
                "sampled_pass_rate_before": before.get("sampled", {}).get("pass_rate"),
                "sampled_pass_rate_after": after.get("sampled", {}).get("pass_rate"),
                "held_out_before": before,
                "held_out_after": after,
                "train_reward": [h.get("reward_mean") for h in history],
                "train_reward_first": history[0].get("reward_mean") if history else None,
                "train_reward_last": history[-1].get("reward_mean") if history else None,
                "sandbox": pool.stats(),
                "minutes": round((time.perf_counter() - t0) / 60, 2),
            }
    print(json.dumps(report, indent=2, default=str))
    Path(cfg.run_dir, "report.json").write_text(json.dumps(report, indent=2, default=str))
    return report


if __name__ == "__main__":
    from ludic_lab.config import parse_config

    asyncio.run(main(parse_config(Config, description=__doc__.split("\n")[0])))
