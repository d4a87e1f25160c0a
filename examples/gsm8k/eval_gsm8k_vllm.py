"""Evaluate a model on GSM8K-format problems through the bundled vLLM server: accuracy and pass@k.

Algorithm: none (evaluation). Each held-out problem is one item: one greedy answer
(accuracy) and ``k`` sampled answers at ``temperature`` (pass@k, the unbiased estimator from
``n`` samples, here ``n = k``). Answers are read from ``<answer></answer>``; the verifier is a
numeric match (reasoning-gym's own scorer for ``--data gsm_symbolic``).

What it shows: evaluation through the OpenAI-compatible vLLM server, the path a trained
model takes to serving. The script starts ``python -m ludic_lab.inference.vllm_server`` on
``--model`` (CPU here: ``--enforce-eager``, bfloat16) and stops it at the end, or uses the
server at ``--vllm-url``. Run it on the base model and on the folder ``train_gsm8k.py``
saved (``<out>/model``) for the before/after comparison.

Launch:

    # CPU, here
    python examples/gsm8k/eval_gsm8k_vllm.py --model default
    python examples/gsm8k/eval_gsm8k_vllm.py --model runs/gsm8k/policy
    python examples/gsm8k/eval_gsm8k_vllm.py --model tiny --limit 4 --k 2     # smoke run

    # GPU cluster: an already running server
    CUDA_VISIBLE_DEVICES=0 python -m ludic_lab.inference.vllm_server --model runs/gsm8k/policy --port 8000 &
    python examples/gsm8k/eval_gsm8k_vllm.py --model runs/gsm8k/policy --vllm-url http://127.0.0.1:8000 \\
        --data /data/gsm8k --limit 1319 --k 8 --max-tokens 512

Result it got here (40 held-out problems, 128 new tokens, lenient answers, ``--k 4`` at T=1; the
bundled server in bf16 on CPU, one core, ``OMP_NUM_THREADS=1``; each run starts its own
server): SmolLM2-135M greedy accuracy 0.275, sampled accuracy 0.106, pass@4 0.375 (114 s wall);
the model ``train_gsm8k.py`` saved (its defaults, 8 steps) greedy 0.550, sampled 0.375, pass@4
0.775 (80 s). The in-process fp32 evaluation of the same 40 problems gave 0.300 -> 0.550.
``--out`` receives ``eval.json``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ludic_lab.aio import run_sync
from ludic_lab.config import parse_config
from ludic_lab.recipes import Sampler
from ludic_lab.recipes.math import ENV, PROTOCOL, accuracy_summary, load_math, math_engine, math_verifier
from ludic_lab.recipes.training import output_dir


@dataclass
class Config:
    """Accuracy and pass@k of a model on held-out GSM8K-format problems, through vLLM."""

    model: str = "default"
    """"default", "tiny" or a local model folder (e.g. runs/gsm8k/policy)."""
    data: str = "shipped"
    """"shipped", "gsm_symbolic", or a GSM8K JSONL file / datasets folder (its test split)."""
    vllm_url: str | None = None
    """Use this running server (serving --model) instead of starting one."""
    limit: int = 80
    """Held-out problems evaluated."""
    k: int = 4
    """Sampled answers per problem for pass@k (1 = greedy accuracy only)."""
    temperature: float = 1.0
    """Sampling temperature of the pass@k answers."""
    max_tokens: int = 128
    """Completion budget (as train_gsm8k.py)."""
    answer_format: Literal["tags", "lenient"] = "lenient"
    """How answers are read: "tags" (<answer>42</answer> only) or "lenient" (else the last number)."""
    seed: int = 0
    """Sampling seeds (and the gsm_symbolic generator's)."""
    out: str = "runs/gsm8k_eval"
    """Output folder: eval.json, vllm_server.log."""


async def run(cfg: Config) -> dict[str, Any]:
    from ludic_lab.eval import evaluate
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec

    out = output_dir(cfg.out)
    test = load_math(cfg.data, "test", seed=cfg.seed)
    n = min(cfg.limit, len(test))
    t0 = time.perf_counter()
    async with Sampler("vllm", cfg.model, vllm_url=cfg.vllm_url, log_dir=str(out)) as sampler:
        engine = math_engine(sampler.client, test, math_verifier(cfg.data), answer_format=cfg.answer_format)
        env, proto = EnvSpec(ENV), ProtocolSpec(PROTOCOL)
        greedy = await evaluate(engine, env, proto, range(n), k=1, max_tokens=cfg.max_tokens, name="greedy")
        result = {"greedy": accuracy_summary(greedy)}
        if cfg.k > 1:
            sampled = await evaluate(engine, env, proto, range(n), k=cfg.k, temperature=cfg.temperature,
                                     max_tokens=cfg.max_tokens, sampling_seed=cfg.seed, name="sampled")  # fmt: skip
            result["sampled"] = accuracy_summary(sampled, cfg.k)
        version = await sampler.policy_version()
    summary = {"config": asdict(cfg), **result, "server_policy_version": version, "seconds": time.perf_counter() - t0}
    (out / "eval.json").write_text(json.dumps(summary, indent=2))
    line = f"{cfg.model}: greedy accuracy {result['greedy']['accuracy']:.3f} on {n} problems"
    if "sampled" in result:
        line += f", pass@{cfg.k} {result['sampled'].get(f'pass@{cfg.k}', float('nan')):.3f}"
    print(line, flush=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "config"}))
    return summary


def main(cfg: Config) -> dict[str, Any]:
    """Evaluate as ``cfg`` says; returns the summary (also in ``<out>/eval.json``)."""
    return run_sync(run(cfg))


if __name__ == "__main__":
    main(parse_config(Config))
