"""Continuous batching for :class:`~ludic_lab.inference.local.client.LocalChatClient`.

Requests join the running decode at a token boundary and leave it when they finish: a
request that arrives while others decode is prefilled (its prompt run once, batched with
the other arrivals) and merged into the batch's KV cache at the next step instead of
waiting for the batch's longest member; a finished request's reply is delivered at once.
Each row keeps its own attention mask, so rows of different lengths (and the holes left
where a reused prefix meets a new suffix) need no re-padding; columns no live row uses
are trimmed. Prompts reuse the longest prefix that a finished row already ran through the
model (:class:`~ludic_lab.inference.local.prefix_cache.PrefixCache`): an agent's next turn
prefills only its new messages. Rows sharing a long prompt prefix keep its KV once (:mod:`.cascade`).

Everything here runs on the client's one generation thread. A weight update
(``sync_weights``) with ``weight_update="drain"`` (the default) stops new admissions, lets the
running rows finish, then loads: every completion is sampled with one policy version. With
``weight_update="in_flight"`` it loads between two decode steps and the running rows go on
under the new weights, each token recording the version that sampled it; their KV is kept or
computed again (``in_flight_kv``, :mod:`.in_flight`). The prefix cache is cleared either way.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ludic_lab.inference.local.arrivals import arrival_inputs
from ludic_lab.inference.local.cascade import SharedAttention, SharedPrefix, choose_shared_prefix
from ludic_lab.inference.local.in_flight import let_update_in
from ludic_lab.inference.local.kv_slab import SlabCache
from ludic_lab.inference.local.prefill_buckets import prefill_buckets
from ludic_lab.inference.local.response import RowState, build_response
from ludic_lab.inference.local.rows import Job, Row
from ludic_lab.inference.local.sampling import sample_rows
from ludic_lab.inference.local.shared_prefix import prefill_shared_prefix, shared_prompt_rows

if TYPE_CHECKING:
    from ludic_lab.inference.local.client import LocalChatClient


ADMIT_WAIT_STEPS = 8
"""Decode steps a waiting request may wait for company before it is admitted anyway."""

STEP_TIMES_KEPT = 4096
"""Recent decode steps and prefill calls the batcher keeps the times of (``LocalChatClient.step_times``)."""


class ContinuousBatcher:
    """The running batch of one client: ``submit(jobs)`` from any thread; the rows decode
    on the client's generation thread until none is left."""

    def __init__(self, client: LocalChatClient) -> None:
        self.client = client
        self._inbox: deque[Job] = deque()
        self._inbox_lock = threading.Lock()
        self._serving = False
        self.rows: list[Row] = []
        self.cache: Any = None  # the live rows' KV: a SlabCache (or transformers' DynamicCache)
        self.mask: torch.Tensor | None = None  # (B, T) 1 where a cache column holds a token of that row
        self.pos: torch.Tensor | None = None  # (B,) position id of each row's next fed token
        self.next_tok: torch.Tensor | None = None  # (B,) the token each row feeds next
        self.shared: SharedPrefix | None = None  # a prompt prefix kept once for the rows on it
        self.on_shared: torch.Tensor | None = None  # (B,) bool: the row's cache starts after it
        self.tokens_generated = 0
        self.steps = 0
        self.in_flight_updates = 0  # weight updates loaded while rows were decoding
        self.recomputed_tokens = 0  # tokens prefilled again after them (in_flight_kv="recompute")
        self._since_admit = 0
        self.step_times: deque[tuple[int, float]] = deque(maxlen=STEP_TIMES_KEPT)  # (rows, seconds) a decode step
        self.prefill_times: deque[tuple[int, int, float]] = deque(maxlen=STEP_TIMES_KEPT)  # (rows, new tokens, s)

    # -- any thread ----------------------------------------------------------------------------
    def submit(self, jobs: Sequence[Job]) -> None:
        """Queue ``jobs``; they join the running batch at its next token boundary."""
        with self._inbox_lock:
            self._inbox.extend(jobs)
            if self._serving:
                return
            self._serving = True
        self.client._executor.submit(self._serve)

    # -- the generation thread -------------------------------------------------------------------
    def _serve(self) -> None:
        client = self.client
        while True:
            while client._updates_waiting:  # a weight update goes first (it waits for the drain)
                time.sleep(0.0005)
            with client._lock:
                try:
                    self._run()
                except BaseException as e:
                    self._fail_all(e)
                    if not isinstance(e, Exception):
                        raise
                finally:
                    client.threads.restore()  # the configured count, outside the running batch
            with self._inbox_lock:
                if not self._inbox and not self.rows:
                    self._serving = False
                    return

    def _run(self) -> None:
        """Admit and decode until no row is live, or a weight update waits and the rows drained;
        an in-flight update loads between two decode steps instead (:func:`.let_update_in`).
        Prefill calls and decode steps run at the thread count ``client.threads`` chose."""
        c = self.client
        with torch.no_grad():
            while True:
                c.threads.before_step(prefill=True)
                if c._updates_waiting and c.weight_update == "in_flight" and any(not r.done for r in self.rows):
                    let_update_in(self)
                if not c._updates_waiting and self._should_admit():
                    self._admit()
                    self._since_admit = 0
                self._drop_cancelled()
                if not any(not r.done for r in self.rows):
                    self._reset()
                    return
                self._decode_step()
                self._since_admit += 1

    def _should_admit(self) -> bool:
        """Admit waiting requests now, or let them gather a few steps so their prompts prefill
        in one forward pass: at once when nothing decodes, when the waiting are a quarter of the
        live rows, or when the first has waited ``ADMIT_WAIT_STEPS`` decode steps."""
        waiting = len(self._inbox)
        if not waiting:
            return False
        live = sum(not r.done for r in self.rows)
        return live == 0 or 4 * waiting >= live or self._since_admit >= ADMIT_WAIT_STEPS

    def _admit(self) -> None:
        live = sum(not r.done for r in self.rows)
        free = self.client.max_batch_size - live
        with self._inbox_lock:
            jobs = [self._inbox.popleft() for _ in range(min(free, len(self._inbox)))]
        jobs = [j for j in jobs if not j.cancelled()]
        rows: list[Row] = []
        for job in jobs:
            try:
                rows.append(self._new_row(job))
            except Exception as e:  # noqa: BLE001 - a bad request fails alone
                job.deliver(e)
        if rows:
            self.join(rows)

    def recompute(self) -> None:
        """Run every live row's ids so far through the current weights again: the rows leave the
        batch and rejoin it as continuations (sampled ids and sampling state kept)."""
        live = [r for r in self.rows if not r.done]
        self._reset()
        if live:
            self.recomputed_tokens += sum(len(r.context) for r in live)
            self.join(live)

    def join(self, rows: list[Row]) -> None:
        """Prefill ``rows`` (each one's :attr:`~.rows.Row.context`), merge them into the batch and
        sample their next token; a failure fails them (they are not in the batch yet) and raises."""
        try:
            self._prune(force=True)
            self._share(rows)
            for r in rows:
                r.batch_size = r.batch_size if r.state.ids else len(self.rows) + len(rows)
            for part in self._buckets(rows):  # rows of like length prefill together
                t0 = time.perf_counter()
                cache, mask, logits, on = self._prefill(part)
                self._merge(part, cache, mask, on)
                self._sample(part, logits, list(range(len(self.rows) - len(part), len(self.rows))))
                new = sum(len(r.context) - r.reused for r in part)
                self.prefill_times.append((len(part), new, time.perf_counter() - t0))
        except BaseException as e:  # the arrivals are not all in self.rows yet: fail them here
            err = e if isinstance(e, Exception) else RuntimeError(repr(e))
            for r in rows:
                if not r.done:
                    r.done = True
                    r.job.deliver(err)
            raise

    def _share(self, rows: list[Row]) -> None:
        """Keep the prefix the arrivals share once for the batch (:mod:`.cascade`), unless
        rows are on one already or it covers them all."""
        c, sp, version = self.client, self.shared, self.client.kv_version()
        if not c.cascade_attention:
            return
        in_use = sp is not None and self.on_shared is not None and bool(self.on_shared.any())
        if sp is not None and (in_use or (sp.version == version and all(sp.covers(r.context) for r in rows))):
            return
        self.shared = choose_shared_prefix(c, [r.context for r in rows], version)

    def _attend(self, on: torch.Tensor | None) -> dict[str, Any]:
        """The forward's keyword for rows ``on`` a shared prefix (none: no keyword)."""
        if self.shared is None or on is None or not bool(on.any()):
            return {}
        return {"ludic_shared": SharedAttention(self.shared.kv, on)}

    def _buckets(self, rows: list[Row]) -> list[list[Row]]:
        """``rows`` split into prefill calls of like new length (:mod:`.prefill_buckets`)."""
        c, version = self.client, self.client.kv_version()
        ctx = [r.context for r in rows]
        new = [len(p) - c.prefix_cache.reusable(p[:-1], version) for p in ctx]
        return [[rows[i] for i in part] for part in prefill_buckets(new, [tuple(p) for p in ctx])]

    def _new_row(self, job: Job) -> Row:
        c = self.client
        cfg = job.request.sampling
        prompt = c._checked_prompt(job.request)
        top_k = min(job.request.return_.top_logprobs_k, c.vocab_size)
        counts = (
            torch.zeros(c.vocab_size, dtype=torch.float32) if cfg.frequency_penalty or cfg.presence_penalty else None
        )
        context = c.chat_template.context
        state = RowState(cfg, top_k, None if context is None else context - len(prompt))
        return Row(job, prompt, state, c._generator(cfg), counts, time.perf_counter(), self.tokens_generated)

    def _prefill(self, rows: list[Row]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the arrivals' prompts (each distinct prompt once, after its reused prefix);
        returns their KV, mask, last logits and which are on the shared prefix."""
        from transformers import DynamicCache

        c, dev = self.client, self.client.device
        prompts = [r.context for r in rows]
        shared = shared_prompt_rows(prompts) if c.share_prompt_prefill else None
        firsts = shared[0].tolist() if shared is not None else list(range(len(rows)))
        distinct = [prompts[i] for i in firsts]
        version = c.kv_version()
        if c.shared_prefix_prefill:
            prefill_shared_prefix(c, distinct, version)
        hits = [c.prefix_cache.lookup(p, version) for p in distinct]
        sp = self.shared  # a row on the shared prefix keeps in its own cache only the columns after it
        sp = sp if sp is not None and sp.version == version else None  # never one of older weights
        start = [sp.length if sp is not None and sp.covers(p) else 0 for p in distinct]
        x = arrival_inputs(distinct, hits, start, c.pad_token_id)
        past = [(k.to(dev), v.to(dev)) for k, v in x.past]
        if c.kv_cache == "slab":  # the prompt's keys land in buffers with room to decode into
            cache: Any = SlabCache.from_kv(past, extra=x.ids.shape[1]) if past else SlabCache()
        else:
            cache = DynamicCache(ddp_cache_data=past) if past else DynamicCache()
        out = c.model(
            input_ids=x.ids.to(dev),
            attention_mask=x.mask.to(dev),
            position_ids=x.pos.to(dev),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **self._attend(on := torch.tensor([s > 0 for s in start], device=dev)),
        )
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float().cpu()
        back = shared[1].tolist() if shared is not None else range(len(rows))
        for row, i in zip(rows, back, strict=True):
            row.reused = row.reused if row.state.ids else x.reused[i]  # a rejoining row keeps its first count
            row.kv_from = version
        mask = x.mask
        if shared is not None:
            cache.batch_select_indices(shared[1].to(dev))
            mask, logits, on = mask[shared[1]], logits[shared[1]], on[shared[1].to(dev)]
        return cache, mask.to(dev), logits, on

    def _merge(self, rows: list[Row], cache: Any, mask: torch.Tensor, on: torch.Tensor) -> None:
        """Append the prefilled ``rows`` to the running batch (the shorter side left-padded)."""
        pos = torch.tensor([len(r.context) for r in rows], dtype=torch.long, device=mask.device)
        if self.cache is None or self.mask is None or self.pos is None or self.on_shared is None:
            self.rows, self.cache, self.mask, self.pos, self.on_shared = list(rows), cache, mask, pos, on
            self.next_tok = torch.zeros(len(rows), dtype=torch.long, device=mask.device)
            return
        T, Ta = self.mask.shape[1], mask.shape[1]
        n = max(T, Ta)
        if isinstance(self.cache, SlabCache):
            self.cache.append_rows(cache)
        else:
            for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
                mine.keys = torch.cat([F.pad(mine.keys, (0, 0, n - T, 0)), F.pad(theirs.keys, (0, 0, n - Ta, 0))])
                mine.values = torch.cat([F.pad(mine.values, (0, 0, n - T, 0)), F.pad(theirs.values, (0, 0, n - Ta, 0))])
        self.mask = torch.cat([F.pad(self.mask, (n - T, 0)), F.pad(mask, (n - Ta, 0))])
        self.pos = torch.cat([self.pos, pos])
        self.on_shared = torch.cat([self.on_shared, on])
        assert self.next_tok is not None
        self.next_tok = torch.cat([self.next_tok, torch.zeros(len(rows), dtype=torch.long, device=mask.device)])
        self.rows.extend(rows)

    def _decode_step(self) -> None:
        assert self.mask is not None and self.pos is not None and self.next_tok is not None
        threads, t0, B = self.client.threads.before_step(), time.perf_counter(), len(self.rows)
        self.mask = torch.cat([self.mask, torch.ones((B, 1), dtype=self.mask.dtype, device=self.mask.device)], dim=1)
        out = self.client.model(
            input_ids=self.next_tok[:, None],
            attention_mask=self.mask,
            position_ids=self.pos[:, None],
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
            **self._attend(self.on_shared),
        )
        self.cache, self.pos = out.past_key_values, self.pos + 1
        live, logits = [j for j, r in enumerate(self.rows) if not r.done], out.logits[:, -1, :].float().cpu()
        self._sample([self.rows[j] for j in live], logits[live] if len(live) < B else logits, live)
        self.steps += 1
        self._prune()
        self.step_times.append((B, seconds := time.perf_counter() - t0))
        self.client.threads.after_step(B, threads, seconds)

    def _sample(self, rows: list[Row], logits: torch.Tensor, batch_idx: list[int]) -> None:
        """Sample one token for each of ``rows`` (batch rows ``batch_idx``); finish those done."""
        c = self.client
        k_top = max(r.state.top_k for r in rows)
        counts = None
        if any(r.counts is not None for r in rows):
            counts = torch.stack([r.counts if r.counts is not None else torch.zeros(c.vocab_size) for r in rows])
        toks, lps, top = sample_rows(logits, [r.state.cfg for r in rows], [r.gen for r in rows], counts, k_top)
        toks_l, lps_l = toks.tolist(), lps.tolist()
        top_ids, top_lps = (top[0].tolist(), top[1].tolist()) if top is not None else (None, None)
        assert self.next_tok is not None
        self.next_tok[torch.tensor(batch_idx, dtype=torch.long, device=self.next_tok.device)] = toks.to(
            self.next_tok.device
        )
        self.tokens_generated += len(rows)
        for j, (r, b) in enumerate(zip(rows, batch_idx, strict=True)):
            if r.counts is not None:
                r.counts[toks_l[j]] += 1
            ti = top_ids[j] if top_ids is not None else None
            tl = top_lps[j] if top_lps is not None else None
            if r.state.add(toks_l[j], lps_l[j], ti, tl, c.chat_template, c.policy_version):
                self._finish(r, b)

    def _finish(self, row: Row, b: int) -> None:
        """Deliver ``row``'s reply and keep its KV (everything it fed) in the prefix cache."""
        c = self.client
        row.done = True
        assert self.mask is not None and self.cache is not None
        fed = row.prompt + row.state.ids[:-1]
        if c.prefix_cache.max_bytes and row.kv_from == (version := c.kv_version()):  # never a KV of older weights
            cols = self.mask[b].nonzero().squeeze(-1)
            kv = [(layer.keys[b][:, cols], layer.values[b][:, cols]) for layer in self.cache.layers]
            if (sp := self.shared) is not None and self.on_shared is not None and bool(self.on_shared[b]):
                kv = [(torch.cat([a, k], 1), torch.cat([z, v], 1)) for (a, z), (k, v) in zip(sp.kv, kv, strict=True)]
            if kv[0][0].shape[1] == len(fed):
                c.prefix_cache.add(fed, kv, version)
        now = time.perf_counter()
        info = {
            "batch_size": row.batch_size,
            "generate_s": now - row.admitted_at,
            "queue_s": row.admitted_at - row.job.queued_at,
            "batch_completion_tokens": self.tokens_generated - row.tokens_at_admission,
            "prefix_reused_tokens": row.reused,
            "scheduler": "continuous",
        }
        try:
            result: Any = build_response(
                row.job.request, row.prompt, row.state, c.chat_template, version=c.policy_version, info=info
            )
        except Exception as e:  # noqa: BLE001 - e.g. a detokenisation error: that request's alone
            result = e
        row.job.deliver(result)

    def _drop_cancelled(self) -> None:
        for r in self.rows:
            r.done = r.done or r.job.cancelled()

    def _prune(self, force: bool = False) -> None:
        """Drop finished rows from the batch (once a quarter is finished, or ``force``), then
        the leading cache columns no remaining row uses."""
        n_done = sum(r.done for r in self.rows)
        if not n_done or not (force or 4 * n_done >= len(self.rows)):
            return
        keep = [j for j, r in enumerate(self.rows) if not r.done]
        if not keep:
            self._reset()
            return
        assert self.mask is not None and self.pos is not None and self.next_tok is not None
        idx = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(idx)
        self.rows = [self.rows[j] for j in keep]
        self.mask, self.pos, self.next_tok = self.mask[idx], self.pos[idx], self.next_tok[idx]
        self.on_shared = self.on_shared[idx] if self.on_shared is not None else None
        used = self.mask.any(dim=0)
        first = int(used.to(torch.uint8).argmax())
        if first > 0:
            self.mask = self.mask[:, first:]
            if isinstance(self.cache, SlabCache):
                self.cache.drop_front(first)
                return
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]

    def _reset(self) -> None:
        self.rows, self.cache, self.mask, self.pos, self.next_tok = [], None, None, None, None
        self.shared = self.on_shared = None

    def _fail_all(self, e: BaseException) -> None:
        err = e if isinstance(e, Exception) else RuntimeError(repr(e))
        for r in self.rows:
            if not r.done:
                r.done = True
                r.job.deliver(err)
        self._reset()
