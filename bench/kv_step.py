"""One decode step of a running batch, old vs new KV path, on one model in one process.

Fills a cache of ``--rows`` rows x ``--context`` columns (random keys and values, a quarter
of the rows left-padded), then times ``--steps`` decode steps under each configuration
(rotating order, ``--rounds`` rounds, the fastest run of each kept):

  old   transformers' ``DynamicCache`` (a ``torch.cat`` of every layer's cache per step) and
        the model's own attention (KV heads copied per query head: ``repeat_kv``)
  gqa   ``DynamicCache`` and grouped-query attention (``inference/local/grouped_attention.py``)
  new   in-place KV buffers (``inference/local/kv_slab.py``) and grouped-query attention

``--model smollm2-shape`` builds a randomly initialised model of SmolLM2-135M's shape
(30 layers, 9 query / 3 KV heads of 64, vocab 49152) without any download, so the step can be
timed on a machine that has no model files; ``default`` loads the real SmolLM2.

    .venv/bin/python bench/kv_step.py --context 200,400,800
    taskset -c 0,1 python bench/kv_step.py --model smollm2-shape --threads 2 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from ludic_lab.inference.local.grouped_attention import GROUPED_IMPLEMENTATIONS, use_grouped_attention
from ludic_lab.inference.local.kv_slab import SlabCache


def load(name: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    attn = "eager" if dtype != torch.float32 else "sdpa"  # LocalChatClient's CPU defaults
    if name == "smollm2-shape":
        cfg = LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
            tie_word_embeddings=True, attn_implementation=attn,
        )  # fmt: skip
        torch.manual_seed(0)
        return LlamaForCausalLM(cfg).to(dtype).eval()
    from ludic_lab.inference.models import resolve_model

    return AutoModelForCausalLM.from_pretrained(resolve_model(name), dtype=dtype, attn_implementation=attn).eval()


def filled_kv(model: Any, rows: int, context: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random keys and values for every layer (a prefill of ``rows`` x ``context`` tokens would
    cost more than all the timed steps; the step's cost does not depend on the values)."""
    c = model.config
    kv_heads, head_dim = c.num_key_value_heads, c.hidden_size // c.num_attention_heads
    g = torch.Generator().manual_seed(context)
    dtype = next(model.parameters()).dtype
    return [
        tuple(torch.randn(rows, kv_heads, context, head_dim, generator=g).to(dtype) for _ in range(2))  # type: ignore[misc]
        for _ in range(c.num_hidden_layers)
    ]


def time_steps(
    model: Any, cfg: str, base: str, kv: list[tuple[torch.Tensor, torch.Tensor]], steps: int
) -> tuple[float, torch.Tensor]:
    """Seconds per decode step of ``cfg`` over a cache holding ``kv``, and the last step's argmax."""
    from transformers import DynamicCache

    model.set_attn_implementation(base if cfg == "old" else GROUPED_IMPLEMENTATIONS[base])
    rows, context = kv[0][0].shape[0], kv[0][0].shape[2]
    mask = torch.ones(rows, context, dtype=torch.long)
    mask[: rows // 4, : context // 4] = 0  # a quarter of the rows are shorter (left padding)
    p = mask.sum(-1)
    tok = torch.arange(rows) + 100
    cache: Any = SlabCache.from_kv(kv, extra=0) if cfg == "new" else DynamicCache(ddp_cache_data=kv)
    with torch.no_grad():
        t0 = time.perf_counter()
        for _ in range(steps):
            mask = torch.cat([mask, torch.ones(rows, 1, dtype=mask.dtype)], 1)
            out = model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=p[:, None],
                past_key_values=cache,
                logits_to_keep=1,
            )
            tok, p = out.logits[:, -1].argmax(-1), p + 1
        return (time.perf_counter() - t0) / steps, tok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default", help="'default' (SmolLM2-135M), 'smollm2-shape', or a folder")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--context", default="200,400,800", help="prompt lengths, comma-separated")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype)
    model = load(a.model, dtype)
    base = model.config._attn_implementation
    if not use_grouped_attention(model):
        raise SystemExit("no grouped variant applies to this model")
    print(f"kv step: model={a.model} dtype={a.dtype} rows={a.rows} steps={a.steps} attention={base} "
          f"threads={torch.get_num_threads()}")  # fmt: skip
    configs = ("old", "gqa", "new")
    for context in (int(c) for c in a.context.split(",")):
        best = dict.fromkeys(configs, float("inf"))
        toks = {}
        kv = filled_kv(model, a.rows, context)
        time_steps(model, "new", base, kv, 2)  # warm-up
        for rnd in range(a.rounds):
            for cfg in configs[rnd % 3 :] + configs[: rnd % 3]:
                dt, toks[cfg] = time_steps(model, cfg, base, kv, a.steps)
                best[cfg] = min(best[cfg], dt)
        same = all(torch.equal(toks["old"], t) for t in toks.values())
        cells = "   ".join(f"{c} {best[c] * 1e3:7.1f} ms ({best['old'] / best[c]:.2f}x)" for c in configs)
        print(f"  context {context:5d}: {cells}   {'same' if same else 'different'} argmax tokens", flush=True)


if __name__ == "__main__":
    main()
