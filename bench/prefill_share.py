"""Shared-prompt prefill in ``LocalChatClient``: a GRPO batch sampled with and without it.

A GRPO step samples ``--group`` completions of each of ``--prompts`` prompts in one batch.
With ``share_prompt_prefill=True`` (the default) each distinct prompt is prefilled once and
its KV rows copied to its group; without it every row prefills its own copy. Both sides use
the same model object, the same requests and the same per-request seeds, alternating over
``--rounds`` rounds (on, off, off, on, ...) so that load on a shared machine hits both alike.
Prints the median seconds per batch of each side, the ratio, and whether the completions
were identical (they must be: the same seeds give the same tokens).

    .venv/bin/python bench/prefill_share.py                          # capitals (the demo's task)
    .venv/bin/python bench/prefill_share.py --task math --max-tokens 128   # GSM8K-style prompts
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig


def requests(task: str, prompts: int, group: int, max_tokens: int, round_: int) -> list[ChatCompletionRequest]:
    if task == "capitals":
        from ludic_lab.data import load_capitals

        rows, system = load_capitals("train"), "Answer with just the name of the city."
    else:
        from ludic_lab.recipes.math import SYSTEM_PROMPT, load_math

        rows, system = load_math("shipped", "train"), SYSTEM_PROMPT
    out = []
    for q in range(prompts):
        row = rows[(round_ * prompts + q) % len(rows)]
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": row["question"]}]
        for k in range(group):
            cfg = SamplingConfig(temperature=1.0, max_tokens=max_tokens, seed=1000 * q + k)
            out.append(
                ChatCompletionRequest(model="bench", messages=msgs, sampling=cfg, return_=ReturnSpec.for_training())
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--task", choices=("capitals", "math"), default="capitals")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    client = LocalChatClient(a.model, max_batch_size=a.prompts * a.group)
    times: dict[bool, list[float]] = {True: [], False: []}
    same, prompt_tokens = 0, 0
    for r in range(a.rounds + 1):  # round 0 warms up, untimed
        reqs = requests(a.task, a.prompts, a.group, a.max_tokens, r)
        outs = {}
        for share in (True, False) if r % 2 else (False, True):
            client.share_prompt_prefill = share
            t0 = time.perf_counter()
            outs[share] = client.generate_batch(reqs)
            if r:
                times[share].append(time.perf_counter() - t0)
        if r:
            same += sum(a_.completion_token_ids == b_.completion_token_ids for (a_, _), (b_, _) in
                        zip(outs[True], outs[False], strict=True))  # fmt: skip
            prompt_tokens = sum(len(x.prompt_token_ids or ()) for x, _ in outs[True]) // len(reqs)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    row = {
        "task": a.task,
        "batch": f"{a.prompts} prompts x {a.group}",
        "prompt_tokens": prompt_tokens,
        "max_tokens": a.max_tokens,
        "shared_s": round(on, 3),
        "unshared_s": round(off, 3),
        "shared/unshared": round(on / off, 3),
        "identical_completions": f"{same}/{a.rounds * a.prompts * a.group}",
    }
    print(json.dumps(row))


if __name__ == "__main__":
    main()
