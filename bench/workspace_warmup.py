"""Does an SFT warm-up on demonstrations give the workspace demo a learning signal?

The workspace demo's task (located bug fixes, one ``edit_file`` call in a bubblewrap workspace,
rewarded by the hidden tests): SmolLM2-135M, untrained, scores 0/20 held out and GRPO gets no
signal (docs/demo.md). This runs, in one process and one LoRA policy:

1. held-out greedy (20 tasks) before anything;
2. ``--sft-steps`` SFT steps on demonstrated episodes of the *train* tasks
   (``ludic_lab.demos.workspace_warmup``: the demo's own agent and env, replies written);
3. held-out greedy again;
4. ``--rl-steps`` GRPO steps on the train tasks (sampled at ``--temperature``, reward the hidden
   tests), then held-out greedy and sampled once more.

and prints each figure with its Wilson 95% interval, the train rewards per step, seconds and the
peak resident memory.

    OMP_NUM_THREADS=2 python bench/workspace_warmup.py --sft-steps 6 --rl-steps 4
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time

from transformers import AutoModelForCausalLM

from ludic_lab.demos.backend import publisher
from ludic_lab.demos.workspace_task import workspace_edit_task
from ludic_lab.demos.workspace_warmup import DemonstrationClient
from ludic_lab.eval import evaluate
from ludic_lab.inference import InferenceSpec, LocalChatClient, ReturnSpec, SamplingConfig
from ludic_lab.inference.models import default_model_path
from ludic_lab.rollouts import EnvSpec, GRPORequestStrategy, ProtocolSpec, RolloutBatchSource
from ludic_lab.training import Trainer, TrainerConfig
from ludic_lab.training.algorithm import make_preset, make_sft

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--sft-steps", type=int, default=6)
p.add_argument("--sft-per-step", type=int, default=8, help="demonstrated train tasks per SFT step")
p.add_argument("--rl-steps", type=int, default=4)
p.add_argument("--tasks-per-step", type=int, default=4)
p.add_argument("--group-size", type=int, default=4)
p.add_argument("--temperature", type=float, default=0.7)
p.add_argument("--lr", type=float, default=1e-3, help="learning rate of the SFT steps")
p.add_argument("--rl-lr", type=float, default=2e-4, help="learning rate of the GRPO steps")
p.add_argument("--max-tokens", type=int, default=96)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()


async def held_out(client, tag: str, *, k: int = 1, temperature: float = 0.0) -> str:
    held = workspace_edit_task("heldout")
    engine = held.engine(client, episode_timeout_s=3600)
    r = await evaluate(engine, EnvSpec(held.name), ProtocolSpec(held.protocol_kind), range(held.size or 0), k=k,
                       temperature=temperature, max_tokens=args.max_tokens, max_steps=1, sampling_seed=args.seed + 7,
                       name=tag, progress=False)  # fmt: skip
    s = r.summary()
    return (f"{tag}: {s['accuracy']:.2f} [{s['accuracy_ci_low']:.2f}, {s['accuracy_ci_high']:.2f}] "
            f"({round(s['accuracy'] * s['num_samples'])}/{s['num_samples']})")  # fmt: skip


def source(engine_client, train, algo, *, temperature: float, group: int, per_step: int) -> RolloutBatchSource:
    inference = InferenceSpec(SamplingConfig(temperature=temperature, max_tokens=args.max_tokens),
                              ReturnSpec.for_training())  # fmt: skip
    return RolloutBatchSource(train.engine(engine_client, episode_timeout_s=3600),
                              train.requests(per_step=per_step, seed=args.seed, inference=inference),
                              algo.credit_assigner,
                              request_strategy=GRPORequestStrategy(group, seed=args.seed))  # fmt: skip


async def main() -> None:
    t_all = time.perf_counter()
    model_path = default_model_path()
    client = LocalChatClient(model_path, max_batch_size=32)
    print(await held_out(client, "held-out greedy, before"), flush=True)
    train = workspace_edit_task("train")
    policy = AutoModelForCausalLM.from_pretrained(model_path)
    cfg = TrainerConfig(lr=args.lr, lora_r=16, max_seq_len=1024, micro_token_budget=2048,
                        scoring_temperature=args.temperature)  # fmt: skip
    sft = make_sft()
    trainer = Trainer(policy, sft, source(DemonstrationClient(client), train, sft, temperature=1.0, group=1,
                                          per_step=args.sft_per_step),
                      config=cfg, publisher=publisher(client, policy), pad_token_id=client.pad_token_id)  # fmt: skip
    trainer.scoring_temperature = 1.0  # SFT: cross-entropy of the plain logits
    t0 = time.perf_counter()
    for h in await trainer.train(args.sft_steps, progress=False):
        print(f"sft step loss {h.get('loss', float('nan')):.3f}", flush=True)
    print(f"SFT: {args.sft_steps} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    print(await held_out(client, "held-out greedy, after SFT"), flush=True)
    grpo = make_preset("grpo", max_tokens=args.max_tokens)
    trainer.algo, trainer.scoring_temperature = grpo, args.temperature
    for group in trainer.optimizer.param_groups:  # the scheduler scales base_lrs each step
        group["lr"] = args.rl_lr
    trainer.scheduler.base_lrs = [args.rl_lr] * len(trainer.optimizer.param_groups)
    trainer.batch_source = source(client, train, grpo, temperature=args.temperature, group=args.group_size,
                                  per_step=args.tasks_per_step)  # fmt: skip
    t0 = time.perf_counter()
    rewards = [round(float(h["reward_mean"]), 3) for h in await trainer.train(args.rl_steps, progress=False)]
    print(
        f"GRPO: {args.rl_steps} steps in {time.perf_counter() - t0:.0f} s, train reward per step {rewards}", flush=True
    )
    print(await held_out(client, "held-out greedy, after SFT + GRPO"), flush=True)
    print(await held_out(client, f"held-out sampled (T={args.temperature}), after", temperature=args.temperature))
    trainer.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"total {time.perf_counter() - t_all:.0f} s, peak resident memory {peak:.2f} GiB")


asyncio.run(main())
