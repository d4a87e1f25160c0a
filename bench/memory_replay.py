"""Host memory of one trainer step on a fixed batch: the same SAW items under several settings.

``bench/memory.py`` measures a whole path (rollouts, then the step); its rollouts take minutes
and differ from run to run. This bench separates the two: ``--dump`` samples one step of the
TextArena path of ``bench/memory.py`` (``train_env(textarena_task("TicTacToe-v0",
opponent="random"))``, ``--games`` games: prompts of 4 samples, seed 0) and writes its SAW items
as JSONL; then each setting replays those items through one ``Trainer.train_step`` of
``train_env``'s trainer (LoRA r=8, alpha 16, lr 1e-4) in its own subprocess, with the resident set
sampled every 20 ms, and prints the peak of the forward/backward phase, the end of the step, the
seconds, the loss (identical settings train on identical tokens: the loss must match) and the
packing figures. The items' weights are set to +1 / -1 by rollout (CRC32 of its id), so that a
step whose rewards carry no signal still has a gradient.

A setting is ``budget[,merge][,mmap][,ckpt][,trim][,saved]``: ``TrainerConfig.micro_token_budget``;
``merge``: each game's turns folded into one sequence first (``rollouts/turn_merge.py``, what
``textarena_task`` runs do: the loss must still match); glibc's mmap
threshold at 1 MiB (``MALLOC_MMAP_THRESHOLD_``: what is live, without the allocator's retained
pages), ``gradient_checkpointing=True``, ``malloc_trim(0)`` before each micro-batch; ``saved``
also counts what the first micro-batch's forward saves for the backward, by shape.

    .venv/bin/python bench/memory_replay.py --dump /tmp/items16.jsonl --games 16
    .venv/bin/python bench/memory_replay.py --items /tmp/items16.jsonl --settings 8192,ckpt 2048 1024 1024,mmap
    .venv/bin/python bench/memory_replay.py --items /tmp/items16.jsonl --settings 1024 1024,merge 1024,merge,mmap
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import zlib
from typing import Any

MB = 2**20


class Peaks:
    """Resident set sampled every 20 ms; the peak of each named phase."""

    def __init__(self) -> None:
        import psutil

        self.proc, self.phase = psutil.Process(), "load"
        self.peaks: dict[str, int] = {}
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            r = self.proc.memory_info().rss
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), r)
            time.sleep(0.02)


def dump(path: str, games: int, model: str) -> None:
    """Sample one step of ``games`` TextArena games (prompts of 4) and write its items."""
    from ludic_lab.env_training import build_env_training
    from ludic_lab.inference import LocalChatClient
    from ludic_lab.task.external.textarena import textarena_task

    peaks = Peaks()
    task = textarena_task("TicTacToe-v0", opponent="random")
    client = LocalChatClient(model, max_batch_size=games)
    engine = task.engine(client, episode_timeout_s=86_400.0)
    run = build_env_training(task, model=client, prompts_per_step=max(1, games // 4), group_size=4, out=None,
                             engine=engine)  # fmt: skip
    peaks.phase = "sampling"
    t0 = time.perf_counter()
    batch = asyncio.run(run.source.next_batch())
    with open(path, "w") as f:
        f.writelines(it.to_json() + "\n" for it in batch.items)
    lens = sorted(it.num_tokens for it in batch.items)
    took, peak = time.perf_counter() - t0, peaks.peaks["sampling"] / MB
    print(f"{len(lens)} items, {sum(lens):,} tokens ({batch.num_action_tokens:,} actions),"
          f" lengths {lens[0]}-{lens[-1]};"
          f" sampled in {took:.0f} s, peak {peak:,.0f} MB", flush=True)  # fmt: skip
    os._exit(0)  # the sampler's threads need no joining


def replay(items_path: str, setting: str, model_path: str) -> dict[str, Any]:
    """One ``train_step`` on the items under ``setting`` (in this process); its figures."""
    import torch  # noqa: F401 - loaded before the clock starts
    from transformers import AutoModelForCausalLM

    import ludic_lab.training.trainer as tm
    from ludic_lab.rollouts.saw import SAWBatch, SAWItem
    from ludic_lab.training import Trainer, TrainerConfig
    from ludic_lab.training.algorithm import make_preset

    parts = setting.split(",")
    peaks = Peaks()
    items = []
    for line in open(items_path):
        it = SAWItem.from_json(line)
        sign = 1.0 if zlib.crc32(it.rollout_id.encode()) % 2 else -1.0
        items.append(SAWItem(**{**it.to_dict(), "weights": [sign * m for m in it.action_mask]}))
    if "merge" in parts:
        from ludic_lab.rollouts.turn_merge import merge_turns

        items = merge_turns(items)[0]

    class Replay:
        async def next_batch(self) -> SAWBatch:
            return SAWBatch(tuple(items), {})

    cfg = TrainerConfig(lr=1e-4, lora_r=8, lora_alpha=16, micro_token_budget=int(parts[0]),
                        gradient_checkpointing="ckpt" in parts)  # fmt: skip
    policy = AutoModelForCausalLM.from_pretrained(model_path)
    trainer = Trainer(policy, make_preset("grpo", max_tokens=64), Replay(), config=cfg)
    forward_backward = tm.Trainer._forward_backward

    def in_phase(self: Any, *a: Any, **kw: Any) -> Any:
        peaks.phase = "fwd_bwd"
        return forward_backward(self, *a, **kw)

    tm.Trainer._forward_backward = in_phase  # type: ignore[method-assign]
    if "trim" in parts:
        import ctypes

        libc, micro = ctypes.CDLL("libc.so.6"), tm.Trainer._micro_batch_loss

        def trimmed(self: Any, *a: Any, **kw: Any) -> Any:
            libc.malloc_trim(0)
            return micro(self, *a, **kw)

        tm.Trainer._micro_batch_loss = trimmed  # type: ignore[method-assign]
    saved: dict[str, int] = {}
    if "saved" in parts:  # the first micro-batch's tensors saved for backward, by shape
        _count_saved(tm, trainer, saved)
    peaks.phase = "before"
    time.sleep(0.1)
    t0 = time.perf_counter()
    m = asyncio.run(trainer.train_step())
    seconds = time.perf_counter() - t0
    peaks.phase = "end"
    time.sleep(0.1)
    mem = {k: v / MB for k, v in peaks.peaks.items()}
    return {"setting": setting, "seconds": round(seconds, 1), "loss": m["loss"], "tokens": m["tokens"],
            "micro_batches": m.get("pack/num_micro_batches"), "saved": saved, **mem}  # fmt: skip


def _count_saved(tm: Any, trainer: Any, saved: dict[str, int]) -> None:
    """Count, once, the bytes the first micro-batch's forward saves for backward (each storage
    once, parameters left out) by shape, into ``saved`` (``"tokens"``: its real tokens)."""
    import torch

    micro = tm.Trainer._micro_batch_loss
    params = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    seen: set[int] = set()

    def pack(t: Any) -> Any:
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen and ptr not in params:
            seen.add(ptr)
            key = f"{tuple(t.shape)} {t.dtype}"
            saved[key] = saved.get(key, 0) + t.untyped_storage().nbytes()
        return t

    def counted(self: Any, mb: Any, *a: Any, **kw: Any) -> Any:
        if saved:
            return micro(self, mb, *a, **kw)
        saved["tokens"] = mb.num_real_tokens
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return micro(self, mb, *a, **kw)

    tm.Trainer._micro_batch_loss = counted


def turn_chains(items_path: str, max_seq_len: int = 1024) -> str:
    """How much of the items repeats earlier turns: consecutive turns of a rollout whose tokens
    start with the previous turn's exact tokens (its actions all after them), and the tokens left
    if each such turn were stored as the tail of the one before (each item cut at ``max_seq_len``)."""
    by_rollout: dict[str, list[dict[str, Any]]] = {}
    for line in open(items_path):
        d = json.loads(line)
        by_rollout.setdefault(d["rollout_id"], []).append(d)
    total = stored = links = pairs = 0
    for turns in by_rollout.values():
        prev: list[int] | None = None
        for d in sorted(turns, key=lambda d: d["step_index"]):
            ids = d["input_ids"][:max_seq_len]
            total += len(ids)
            n = len(prev) if prev is not None else 0
            pairs += prev is not None
            if prev is not None and len(ids) > n and ids[:n] == prev and 1 not in d["action_mask"][:n]:
                links, stored = links + 1, stored + len(ids) - n
            else:
                stored += len(ids)
            prev = ids
    return (
        f"{len(by_rollout)} rollouts, {total:,} tokens (items cut at {max_seq_len}); {links} of {pairs} consecutive "
        f"turns start with the turn before, as tails: {stored:,} tokens"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--dump", help="sample one TextArena step and write its items here (JSONL)")
    ap.add_argument("--games", type=int, default=16, help="games of the dumped step (prompts of 4 samples)")
    ap.add_argument("--model", default="default", help='"default" (SmolLM2-135M), "tiny" or a model folder')
    ap.add_argument("--items", help="the items to replay (JSONL from --dump)")
    ap.add_argument(
        "--settings",
        nargs="*",
        default=["2048", "1024", "1024,mmap"],
        help="budget[,merge][,mmap][,ckpt][,trim][,saved]",
    )
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dump:
        dump(args.dump, args.games, args.model)
    if args.child:
        from ludic_lab.inference.models.resolve import resolve_model

        print(json.dumps(replay(args.items, args.child, resolve_model(args.model))), flush=True)
        os._exit(0)
    if not args.items:
        ap.error("give --dump PATH (sample) or --items PATH (replay)")
    print(f"replay of {args.items}, load average {os.getloadavg()[0]:.1f}; {turn_chains(args.items)}; MB resident")
    print(f"{'setting':>14} {'micro':>6} {'tokens':>7} {'before':>7} {'fwd_bwd':>8} {'end':>7} {'s':>6}  loss")
    for s in args.settings:
        env = dict(os.environ, **({"MALLOC_MMAP_THRESHOLD_": str(MB)} if "mmap" in s.split(",") else {}))
        cmd = [sys.executable, __file__, "--items", args.items, "--child", s, "--model", args.model]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            print(f"{s:>14}  failed (exit {out.returncode}): {out.stderr[-400:]}")
            continue
        r = json.loads(lines[-1])
        print(f"{s:>14} {r['micro_batches']:>6.0f} {r['tokens']:>7} {r['before']:>7,.0f} {r.get('fwd_bwd', 0):>8,.0f} "
              f"{r['end']:>7,.0f} {r['seconds']:>6}  {r['loss']:.8f}", flush=True)  # fmt: skip
        if r["saved"]:
            n = r["saved"].pop("tokens")
            total = sum(r["saved"].values())
            print(
                f"{'':>14} saved for backward by the first micro-batch ({n} tokens): {total / MB:,.0f} MB, "
                f"{total / MB / n:.2f} MB a token; largest:"
            )
            for key, b in sorted(r["saved"].items(), key=lambda kv: -kv[1])[:6]:
                print(f"{'':>16}{b / MB:>9,.1f} MB  {key}")


if __name__ == "__main__":
    main()
