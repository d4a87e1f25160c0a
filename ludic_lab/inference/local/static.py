"""Static batches for :class:`~ludic_lab.inference.local.client.LocalChatClient`
(``scheduling="static"``, and ``generate_batch`` / ``complete_sync`` under either scheduling).

A gathered batch is prefilled together (identical prompts once, their KV rows copied to the
group) and decoded until its longest member ends; finished rows stay in the batch, their
outputs ignored, until a quarter of it is finished. The batch holds the client's lock from
start to end, so a weight update waits for it, and every completion has one policy version.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ludic_lab.inference.local.response import RowState, build_response
from ludic_lab.inference.local.sampling import sample_rows
from ludic_lab.inference.local.shared_prefix import shared_prompt_rows
from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.types import ChatResponse

if TYPE_CHECKING:
    from ludic_lab.inference.local.client import LocalChatClient


@torch.no_grad()
def generate_static(
    client: LocalChatClient, requests: Sequence[ChatCompletionRequest], prompts: Sequence[list[int]]
) -> list[tuple[ChatResponse, dict[str, Any]]]:
    """Sample ``requests`` (with their checked ``prompts``) as one batch on ``client``'s model;
    blocks, holding ``client._lock``, until every row has finished."""
    from transformers import DynamicCache

    with client._lock:
        t0 = time.perf_counter()
        version = client.policy_version
        cfgs = [r.sampling for r in requests]
        gens = [client._generator(c) for c in cfgs]
        top_ks = [min(r.return_.top_logprobs_k, client.vocab_size) for r in requests]
        k_top = max(top_ks, default=0)
        B = len(requests)
        L = max(len(p) for p in prompts)
        input_ids = torch.full((B, L), client.pad_token_id, dtype=torch.long)
        attn = torch.zeros((B, L), dtype=torch.long)
        for b, p in enumerate(prompts):
            input_ids[b, L - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[b, L - len(p) :] = 1
        input_ids, attn = input_ids.to(client.device), attn.to(client.device)
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        need_counts = any(c.frequency_penalty or c.presence_penalty for c in cfgs)
        V = client.model.get_output_embeddings().weight.shape[0]
        counts = torch.zeros((B, V), dtype=torch.float32) if need_counts else None

        context = client.chat_template.context
        states = [
            RowState(c, k, None if context is None else context - len(p))
            for c, k, p in zip(cfgs, top_ks, prompts, strict=True)
        ]
        alive = list(range(B))  # original row index of each current batch row
        alive_t = torch.arange(B)
        done = [False] * B  # per current batch row: finished, output ignored
        cache = DynamicCache()
        step_ids, step_pos, step_attn = input_ids, pos, attn
        max_steps = max(s.max_new for s in states)
        # a GRPO group's samples share their prompt: prefill each distinct prompt once and
        # copy its KV rows to the group (the decode steps then run on every row as before)
        rows = shared_prompt_rows(prompts) if client.share_prompt_prefill else None
        for step in range(max_steps):
            prefill_once = step == 0 and rows is not None
            firsts = rows[0] if rows is not None else None
            out = client.model(
                input_ids=step_ids[firsts] if prefill_once else step_ids,
                attention_mask=step_attn[firsts] if prefill_once else step_attn,
                position_ids=step_pos[firsts] if prefill_once else step_pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float().cpu()
            if prefill_once and rows is not None:
                cache.batch_select_indices(rows[1].to(client.device))
                logits = logits[rows[1]]
            toks, lps, top = sample_rows(
                logits,
                [cfgs[i] for i in alive],
                [gens[i] for i in alive],
                None if counts is None else counts[alive_t],
                k_top,
            )
            if counts is not None:
                counts.index_put_((alive_t, toks), torch.ones(len(alive)), accumulate=True)
            # one conversion per step, not one tensor access per row
            toks_l, lps_l = toks.tolist(), lps.tolist()
            top_ids_l, top_lps_l = (top[0].tolist(), top[1].tolist()) if top is not None else (None, None)
            for j, i in enumerate(alive):
                if not done[j]:
                    ti = top_ids_l[j] if top_ids_l is not None else None
                    tl = top_lps_l[j] if top_lps_l is not None else None
                    done[j] = states[i].add(toks_l[j], lps_l[j], ti, tl, client.chat_template, version)
            n_done = sum(done)
            if n_done == len(alive):
                break
            next_tok = toks.to(client.device)
            # Finished rows stay in the batch (their outputs ignored) until a quarter of it
            # is finished: re-indexing the KV cache of every layer costs more than a few
            # wasted rows.
            if n_done and 4 * n_done >= len(alive):
                keep = [j for j in range(len(alive)) if not done[j]]
                done = [False] * len(keep)
                idx = torch.tensor(keep, dtype=torch.long, device=client.device)
                cache.batch_select_indices(idx)
                next_tok = next_tok[idx]
                step_attn = step_attn[idx]
                step_pos = step_pos[idx]
                alive = [alive[j] for j in keep]
                alive_t = torch.tensor(alive, dtype=torch.long)
            step_ids = next_tok[:, None]
            step_attn = torch.cat(
                [step_attn, torch.ones((len(alive), 1), dtype=step_attn.dtype, device=client.device)], dim=1
            )
            step_pos = step_pos[:, -1:] + 1
        gen_s = time.perf_counter() - t0

    total_new = sum(len(st.ids) for st in states)
    info = {"batch_size": B, "generate_s": gen_s, "batch_completion_tokens": total_new, "scheduler": "static"}
    return [
        build_response(r, prompts[i], states[i], client.chat_template, version=version, info=info)
        for i, r in enumerate(requests)
    ]
