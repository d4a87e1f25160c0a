"""GRPO wall time against TRL's ``GRPOTrainer``, same model, same recipe, same steps; and how
far each stage is from this machine's limits.

Both sides train SmolLM2-135M-Instruct (LoRA r=16, alpha 32, on q/k/v/o; AdamW, lr 1e-4
constant) on the demo's task (capital cities, reward 1 for the right city and no other), with
``--prompts`` questions x ``--group`` samples per step, ``--max-tokens`` new tokens at T=1,
a token-mean clipped surrogate (TRL ``loss_type="dapo"``, eps 0.2, no KL), one optimizer step
per batch of rollouts:

  trl     ``trl.GRPOTrainer`` (transformers ``generate`` for sampling), ``--trl-bf16`` for
          bf16 autocast, fp32 otherwise
  ludic   ``RolloutBatchSource`` + ``LocalChatClient`` + ``Trainer`` (fp32; ``--ludic-bf16``:
          ``TrainerConfig(autocast="bf16")``, ``--ludic-sampler-bf16``: a bf16 sampler), the new
          weights published into the sampler after each step; a group's shared prompt is
          prefilled once by the sampler and scored once by the trainer (the library's defaults;
          ``--ludic-no-share-prefill`` / ``--ludic-no-share-prompts`` turn them off);
          ``--ludic-async-level 1``: the next batch is sampled while the step optimises
          (``TrainerConfig(async_level=1)``, one policy version behind), the sampler and the
          trainer on ``--ludic-stage-threads S,T`` torch threads (default: half the threads each)

Each side runs in its own process, one after the other, so neither competes with the other
for the cores; run it with nothing else on the machine. It prints seconds per step (median
over the steps after the first), each side's split of a step (sampling, scoring,
forward/backward, optimizer, publish, other; ``wait``: the step waiting for its batch, all of
sampling unless it was sampled ahead), both reward curves, and a roofline:

  - this CPU's dense matmul throughput at the shapes of the model's linears (fp32 and bf16,
    ``torch.mm``, all threads) and its memory bandwidth (a 1 GiB copy);
  - each stage's achieved FLOP/s as a fraction of it (of the fp32 and of the bf16 peak): sampling
    at 2 N FLOP per token (every sequence's prompt + completion, N = the weights of the model's
    matmuls, LM head included; a prompt prefilled once for its group still counts per sequence,
    as the work done), the forward/backward at 4 N per token computed with LoRA (forward +
    activation gradients; the adapters' own gradients are negligible; a shared prompt scored
    once counts once) and 6 N when all weights train;
  - decoding's achieved bytes/s against the bandwidth: every decode step of a batch reads all
    weights once, and a batch takes as many decode steps as its longest completion.

    pip install 'trl==1.16.0'                 # bench-only dependency, not in any extra
    .venv/bin/python bench/vs_trl.py --steps 10
    .venv/bin/python bench/vs_trl.py --steps 3 --model tiny --sides ludic   # smoke, no TRL
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

SYSTEM_PROMPT = "Answer with just the name of the city."  # the capitals task's (ludic_lab.task.capitals)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


# -- the machine's limits --------------------------------------------------------------------
def matmul_peak(shapes: list[tuple[int, int, int]], dtype: torch.dtype, seconds: float = 1.0) -> float:
    """Best FLOP/s of ``torch.mm`` over ``shapes`` (M, K, N) in ``dtype``."""
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        torch.mm(a, b)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            torch.mm(a, b)
            reps += 1
        best = max(best, 2.0 * m * k * n * reps / (time.perf_counter() - t0))
    return best


def memory_bandwidth(nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Bytes/s of a large copy (bytes read + bytes written)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    return 2.0 * nbytes * reps / (time.perf_counter() - t0)


def matmul_params(model: Any) -> int:
    """Weights that take part in a matmul per token: every Linear (the LM head included)."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def linear_shapes(model: Any, tokens: int) -> list[tuple[int, int, int]]:
    """Distinct (M, K, N) of the model's linears for a batch of ``tokens`` rows."""
    seen = {(tokens, m.in_features, m.out_features) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return sorted(seen)


# -- data ------------------------------------------------------------------------------------
def question_stream(prompts: int, seed: int, inference: Any = None) -> Any:
    """The capitals task's request stream: ``prompts`` questions per step, consecutive rows of
    the train split from row ``seed * 7919 % rows`` (no shuffle). Both sides walk this one."""
    from ludic_lab.task.capitals import capitals_task

    return capitals_task("train").requests(per_step=prompts, seed=seed, inference=inference)


def question_rows(steps: int, prompts: int, seed: int) -> list[dict[str, Any]]:
    """The training questions in the order ludic's side asks them (TRL keeps it: no shuffle)."""
    from ludic_lab.data import load_capitals

    rows, stream = load_capitals("train"), question_stream(prompts, seed)
    return [rows[r.env_seed] for _ in range(steps) for r in stream()]


# -- ludic_lab -------------------------------------------------------------------------------
def run_ludic(a: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from ludic_lab.agents import Agent
    from ludic_lab.aio import run_sync
    from ludic_lab.context import FullDialog
    from ludic_lab.distributed import ClientPublisher
    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
    from ludic_lab.interaction import SingleAgentSyncProtocol
    from ludic_lab.parsers import identity_parser
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource, RolloutEngine
    from ludic_lab.rollouts.credit import GroupNormalizedReturn
    from ludic_lab.task.capitals import capitals_task
    from ludic_lab.training import RLAlgorithm, Trainer, TrainerConfig
    from ludic_lab.training.losses import TokenClippedSurrogateLoss

    torch.manual_seed(a.seed)
    dtype = torch.bfloat16 if a.ludic_sampler_bf16 else torch.float32
    half = max(1, (a.threads or torch.get_num_threads()) // 2)
    sampler_threads, trainer_threads = (int(x) for x in (a.ludic_stage_threads or f"{half},{half}").split(","))
    client = LocalChatClient(
        a.model,
        max_batch_size=a.prompts * a.group,
        dtype=dtype,
        share_prompt_prefill=not a.ludic_no_share_prefill,
        num_threads=sampler_threads if a.ludic_async_level else None,
    )
    policy = AutoModelForCausalLM.from_pretrained(str(client.model_path))
    # the capitals task's env (DatasetQAEnv over the train split, SYSTEM_PROMPT, the capital
    # verifier), each whole reply judged as TRL's reward function judges it: identity_parser,
    # and a reply cut at max_tokens judged too (the task's own parser would give it -0.1)
    task = capitals_task("train")
    agent = lambda: Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)  # noqa: E731
    engine = RolloutEngine(
        {task.name: task.env}, {task.protocol_kind: lambda: SingleAgentSyncProtocol(agent())}, max_concurrency=64
    )
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=a.max_tokens), ReturnSpec.for_training())
    requests = question_stream(a.prompts, a.seed, spec)  # the questions TRL's dataset holds, in order

    loss = TokenClippedSurrogateLoss(clip_eps_low=0.2, clip_eps_high=0.2, aggregation="token_mean")
    algo = RLAlgorithm("grpo_token_mean", GroupNormalizedReturn(normalize_adv=True), loss)
    source = RolloutBatchSource(
        engine, requests, algo.credit_assigner, request_strategy=GRPORequestStrategy(a.group, seed=a.seed)
    )
    cfg = TrainerConfig(
        lr=1e-4,
        lora_r=16,
        lora_alpha=32.0,
        lora_target_modules=LORA_TARGETS,
        max_seq_len=512,
        micro_token_budget=4096,
        scoring_temperature=1.0,
        seed=a.seed,
        autocast="bf16" if a.ludic_bf16 else "off",
        share_prompts=not a.ludic_no_share_prompts,
        async_level=a.ludic_async_level,
        num_threads=trainer_threads if a.ludic_async_level else None,
    )
    steps: list[dict[str, Any]] = []
    last = [time.perf_counter()]

    def record(step: int, m: dict[str, Any]) -> None:
        # wall per step between step ends (sampled ahead, a step's batch was generated during
        # the step before; this counts everything once); the trainer's own time/* split it
        now, wall = time.perf_counter(), 0.0
        wall, last[0] = now - last[0], now
        rollouts = trainer.batch_source.last_rollouts  # the rollouts of the batch this step trained on
        longest = max((len(s.trace.completion_token_ids) for r in rollouts for s in r.steps), default=0)
        t = {k: float(v) for k, v in m.items() if k.startswith("time/")}
        steps.append(
            {
                "step_s": wall,
                "sampling_s": float(m.get("source/generation_s", t.get("time/data_s", 0.0))),  # the batch's episodes
                "wait_s": t.get("time/data_s", 0.0),  # the step waiting for its batch (sampled ahead: a part)
                "scoring_s": 0.0,
                "fwd_bwd_s": t.get("time/fwd_bwd_s", 0.0),
                "publish_s": t.get("time/publish_s", 0.0),
                "optimizer_s": t.get("time/optimizer_s", float("nan")),
                "reward": float(m.get("reward_mean", float("nan"))),
                "ratio_max_dev": max(float(m.get("loss/ratio_max", 1.0)) - 1, 1 - float(m.get("loss/ratio_min", 1.0))),
                "lag": float(m.get("source/policy_lag_max", 0.0)),
                # every sequence's prompt + completion, whether or not a shared prompt was
                # computed once (the same nominal work as TRL's); train_tokens: positions computed
                "sample_tokens": int(m.get("tokens", 0) + m.get("pack/shared_prompt_tokens", 0)),
                "train_tokens": int(m.get("tokens", 0)),
                "completion_tokens": int(m.get("action_tokens", 0)),
                "longest_completion": longest,
            }
        )

    trainer = Trainer(
        policy,
        algo,
        source,
        config=cfg,
        publisher=ClientPublisher(client),
        pad_token_id=client.pad_token_id,
        callbacks=[record],
    )
    last[0] = time.perf_counter()
    run_sync(trainer.train(a.steps, progress=False))  # one event loop for every step
    trainer.close()
    return {"side": "ludic", "params": matmul_params(policy), "steps": steps}


# -- TRL -------------------------------------------------------------------------------------
def run_trl(a: argparse.Namespace) -> dict[str, Any]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ludic_lab.data import capital_verifier
    from ludic_lab.inference.models import resolve_model

    path = str(resolve_model(a.model))
    verifier = capital_verifier()
    rows = question_rows(a.steps, a.prompts, a.seed)
    data = Dataset.from_list(
        [
            {
                "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": r["question"]}],
                "answer": r["answer"],
            }
            for r in rows
        ]
    )

    def reward(prompts: Any, completions: Any, answer: list[str], **_: Any) -> list[float]:
        return [1.0 if verifier(c[0]["content"], t) else 0.0 for c, t in zip(completions, answer, strict=True)]

    timers: dict[str, float] = {}
    marks: dict[str, float] = {}
    steps: list[dict[str, Any]] = []

    def timed(obj: Any, name: str, key: str) -> None:
        fn = getattr(obj, name)

        def wrapper(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                timers[key] = timers.get(key, 0.0) + time.perf_counter() - t0

        setattr(obj, name, wrapper)

    class Split(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            timers.clear()
            marks["step"] = time.perf_counter()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            marks["opt"] = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            timers["optimizer"] = time.perf_counter() - marks["opt"]

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            total = time.perf_counter() - marks["step"]
            prep = timers.get("prepare", 0.0)
            steps.append(
                {
                    "step_s": total,
                    "sampling_s": timers.get("generate", 0.0),
                    "scoring_s": timers.get("rewards", 0.0),
                    "fwd_bwd_s": timers.get("train_step", 0.0) - prep,
                    "optimizer_s": timers.get("optimizer", 0.0),
                    "publish_s": 0.0,
                    "prepare_s": prep,
                }
            )

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    params = matmul_params(model)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=a.trl_bf16,
            seed=a.seed,
            max_steps=a.steps,
            logging_steps=1,
            per_device_train_batch_size=a.prompts * a.group,
            num_generations=a.group,
            gradient_accumulation_steps=1,
            max_completion_length=a.max_tokens,
            temperature=1.0,
            learning_rate=1e-4,
            lr_scheduler_type="constant",
            loss_type="dapo",
            shuffle_dataset=False,
            beta=0.0,
            epsilon=0.2,
            report_to=[],
            save_strategy="no",
            dataloader_num_workers=0,
        )
        peft = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM"
        )
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok, peft_config=peft
        )
        timed(trainer, "_generate", "generate")
        timed(trainer, "_calculate_rewards", "rewards")
        timed(trainer, "_prepare_inputs", "prepare")
        timed(trainer, "training_step", "train_step")
        trainer.add_callback(Split())
        trainer.train()
        logs = [h for h in trainer.state.log_history if "reward" in h]
    for s, h in zip(steps, logs, strict=True):
        n_compl = float(h.get("completions/mean_length", 0.0)) * a.prompts * a.group
        s.update(
            reward=float(h["reward"]),
            completion_tokens=int(n_compl),
            longest_completion=int(h.get("completions/max_length", 0)),
        )
    rendered = tok.apply_chat_template(data[0]["prompt"], add_generation_prompt=True)
    ids = rendered["input_ids"] if hasattr(rendered, "keys") else rendered  # transformers 5: a BatchEncoding
    prompt_tokens = len(ids) * a.prompts * a.group
    for s in steps:
        s["sample_tokens"] = s["train_tokens"] = prompt_tokens + s.get("completion_tokens", 0)
        s["other_s"] = s["prepare_s"] - s["sampling_s"] - s["scoring_s"]  # old logprobs, advantages
    return {"side": "trl", "params": params, "steps": steps}


# -- report ----------------------------------------------------------------------------------
def summarize(r: dict[str, Any], limits: dict[str, float], a: argparse.Namespace) -> dict[str, Any]:
    body = r["steps"][1:] or r["steps"]  # the first step warms up (allocations, first compile)
    med = {
        k: statistics.median(s.get(k, 0.0) for s in body)
        for k in ("step_s", "sampling_s", "scoring_s", "fwd_bwd_s", "optimizer_s", "publish_s")
    }
    overlapped = any(s.get("lag", 0.0) > 0 for s in body)  # sampled ahead: only the wait adds to a step
    parts = ("wait_s" if overlapped else "sampling_s", "scoring_s", "fwd_bwd_s", "optimizer_s", "publish_s")
    med["other_s"] = statistics.median(  # per step, then the median (medians of parts need not add up)
        s["step_s"] - sum(s.get(k, 0.0) for k in parts if s.get(k, 0.0) == s.get(k, 0.0)) for s in body
    )
    med["wait_s"] = statistics.median(s.get("wait_s", s["sampling_s"]) for s in body)
    n = r["params"]
    tok_s = statistics.median(s["sample_tokens"] for s in body)
    tok_t = statistics.median(s["train_tokens"] for s in body)
    longest = statistics.median(s["longest_completion"] for s in body)
    peak, peak16 = limits["fp32_flops"], limits["bf16_flops"]
    sampling_flops = 2.0 * n * tok_s / med["sampling_s"] if med["sampling_s"] else float("nan")
    train_flops = 4.0 * n * tok_t / med["fwd_bwd_s"] if med["fwd_bwd_s"] else float("nan")
    decode_bytes = longest * n * 4 / med["sampling_s"] if med["sampling_s"] else float("nan")
    return {
        "side": r["side"],
        **{k: round(v, 3) for k, v in med.items()},
        "rewards": [round(s.get("reward", float("nan")), 3) for s in r["steps"]],
        "ratio_max_dev": max((s.get("ratio_max_dev", 0.0) for s in r["steps"]), default=0.0),
        "lag_max": max((s.get("lag", 0.0) for s in r["steps"]), default=0.0),
        "sampling_frac_of_fp32_peak": round(sampling_flops / peak, 4),
        "fwd_bwd_frac_of_fp32_peak": round(train_flops / peak, 4),
        "sampling_frac_of_bf16_peak": round(sampling_flops / peak16, 4),
        "fwd_bwd_frac_of_bf16_peak": round(train_flops / peak16, 4),
        "sample_tokens": tok_s,
        "train_tokens": tok_t,
        "decode_frac_of_bandwidth": round(decode_bytes / limits["bandwidth"], 4),
    }


def worker(a: argparse.Namespace) -> None:
    torch.set_num_threads(a.threads or torch.get_num_threads())
    res = run_trl(a) if a.worker == "trl" else run_ludic(a)
    print(json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--model", default="default", help='"default" (SmolLM2-135M-Instruct), "tiny" or a local folder')
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per side (0: torch's default)")
    ap.add_argument("--sides", default="trl,ludic")
    ap.add_argument("--trl-bf16", action="store_true", help="TRL with bf16 autocast")
    ap.add_argument("--ludic-bf16", action="store_true", help="ludic's trainer with TrainerConfig(autocast='bf16')")
    ap.add_argument(
        "--ludic-sampler-bf16",
        action="store_true",
        help="ludic's LocalChatClient in bf16 (sampler/trainer mismatch is then real)",
    )
    ap.add_argument(
        "--ludic-no-share-prompts",
        action="store_true",
        help="ludic's trainer scores every item whole (TrainerConfig(share_prompts=False))",
    )
    ap.add_argument(
        "--ludic-no-share-prefill",
        action="store_true",
        help="ludic's sampler prefills every request (LocalChatClient(share_prompt_prefill=False))",
    )
    ap.add_argument(
        "--ludic-async-level",
        type=int,
        choices=(0, 1),
        default=0,
        help="1: ludic samples the next batch while the step optimises (TrainerConfig(async_level=1))",
    )
    ap.add_argument(
        "--ludic-stage-threads",
        default="",
        help="with --ludic-async-level 1: torch threads of the sampler and of the trainer, 'S,T' (default: half each)",
    )
    ap.add_argument("--json", action="store_true", help="print the summary rows as JSON only")
    ap.add_argument("--worker", choices=("trl", "ludic"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    from transformers import AutoConfig, AutoModelForCausalLM

    from ludic_lab.inference.models import resolve_model

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(resolve_model(a.model))))
    shapes = linear_shapes(model, a.prompts * a.group * 16)
    limits = {
        "fp32_flops": matmul_peak(shapes, torch.float32),
        "bf16_flops": matmul_peak(shapes, torch.bfloat16),
        "bandwidth": memory_bandwidth(),
    }
    del model
    rows = []
    for side in a.sides.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", side] + sys.argv[1:]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.exit(f"{side} side failed ({out.returncode}):\n{out.stderr[-4000:]}")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        row = summarize(res, limits, a)
        row["wall_s"] = round(time.perf_counter() - t0, 1)
        rows.append(row)
    if a.json:
        print(json.dumps({"limits": limits, "rows": rows}))
        return
    print(
        f"machine: {os.cpu_count()} cores, torch threads {a.threads or torch.get_num_threads()}; matmul peak fp32 "
        f"{limits['fp32_flops'] / 1e9:.1f} GFLOP/s, bf16 {limits['bf16_flops'] / 1e9:.1f} GFLOP/s; copy bandwidth "
        f"{limits['bandwidth'] / 1e9:.1f} GB/s"
    )
    cols = ("step_s", "sampling_s", "wait_s", "scoring_s", "fwd_bwd_s", "optimizer_s", "publish_s", "other_s")
    print(
        f"{'side':6s} "
        + " ".join(f"{c:>11s}" for c in cols)
        + "  sampling/peak fp32|bf16  fwd_bwd/peak fp32|bf16  decode/bw  tokens sampled|trained"
    )
    for r in rows:
        print(
            f"{r['side']:6s} "
            + " ".join(f"{r[c]:11.2f}" for c in cols)
            + f"  {r['sampling_frac_of_fp32_peak']:13.3f}|{r['sampling_frac_of_bf16_peak']:.3f}"
            + f"  {r['fwd_bwd_frac_of_fp32_peak']:12.3f}|{r['fwd_bwd_frac_of_bf16_peak']:.3f}"
            + f"  {r['decode_frac_of_bandwidth']:9.3f}  {r['sample_tokens']:7.0f}|{r['train_tokens']:.0f}"
        )
    for r in rows:
        print(
            f"{r['side']} reward per step: {r['rewards']}; importance ratio max |r-1|: {r['ratio_max_dev']:.4f}; "
            f"policy lag max: {r['lag_max']:.0f}"
        )
    by = {r["side"]: r for r in rows}
    if "trl" in by and "ludic" in by:
        print(f"ludic / trl seconds per step: {by['ludic']['step_s'] / by['trl']['step_s']:.2f}x (target <= 0.25x)")


if __name__ == "__main__":
    main()
