"""Packing: SAW items -> micro-batches of ``[R, T]`` tensors under a token budget.

Instead of padding every sequence to the longest one, :func:`pack_items` puts several whole
sequences back to back in each row (bin packing, longest first), so almost every computed
position is a real token. Attention must then stay inside each sequence:
:func:`block_causal_mask` builds the ``[R, 1, T, T]`` mask from ``seq_ids``, and positions
restart at 0 per sequence, so a packed forward gives the same per-token logprobs as running
each sequence alone. :func:`pad_to_longest` is the naive one-sequence-per-row baseline.

Budget rule (both functions): a micro-batch of ``R`` rows of width ``T`` costs ``R * T``
tokens, padding included, and ``R * T <= micro_token_budget``; ``T <= max_seq_len``.

How rows are filled (measured in ``bench/packing_efficiency.py``): several candidate plans
are built and the cheapest kept. Two families, both bin packing longest first:

* *common width*: best-fit decreasing into rows of one width ``W`` (for each candidate
  ``W``), then rows, fullest first, grouped into micro-batches;
* *per micro-batch width*: each micro-batch is as wide as the longest sequence left (at least
  a floor ``F``, for each candidate ``F``), its rows filled with the largest sequences that fit.

Padding is the first cost: a plan is a candidate if its computed tokens are within
``tolerance`` (1 %) of the fewest. Among those, the one with the least dense-attention work
(``sum R * T**2``) wins: a block-diagonal mask over a wide row still costs ``T**2`` per row
(sdpa/eager on CPU), and narrow micro-batches for short sequences roughly halve it on skewed
lengths for at most 1 % more padding.

Sequences longer than ``max_seq_len`` follow the ``truncation`` policy
(:mod:`~ludic_lab.training.truncation`: ``"truncate"``, the default, keeps the first
``max_seq_len`` tokens; ``"drop"``; ``"error"``), and what happened is counted in
:class:`PackingStats` (``result.stats``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.rollouts.turn_merge import turn_starts
from ludic_lab.training.packing_plans import candidate_plans, plan_cost
from ludic_lab.training.prompt_share import ShareMode, Unit, group_units
from ludic_lab.training.token_batch import TokenBatch
from ludic_lab.training.truncation import (
    TRUNCATION_POLICIES,
    TruncationPolicy as TruncationPolicy,  # the older import path
    prepare,
    truncate_item as truncate_item,
)

DEFAULT_TOLERANCE = 0.01
"""Plans within this fraction of the fewest computed tokens compete on attention work."""


@dataclass(frozen=True)
class PackingStats:
    """What packing did to one list of items (log it with :meth:`to_metrics`)."""

    num_items: int
    """Items given."""
    num_sequences: int
    """Items packed (``num_items - dropped_items``)."""
    num_micro_batches: int
    num_rows: int
    real_tokens: int
    """Tokens of the packed sequences (after truncation)."""
    computed_tokens: int
    """``sum(R * T)`` over micro-batches: positions the model computes, padding included."""
    truncated_items: int = 0
    truncated_tokens: int = 0
    """Tokens cut off the tails of truncated items."""
    truncated_action_tokens: int = 0
    """Of those, action tokens (the loss never sees them)."""
    dropped_items: int = 0
    dropped_tokens: int = 0
    dropped_indices: tuple[int, ...] = ()
    """Input indices of dropped items (too long under ``"drop"``, or nothing left to train on)."""
    attention_pairs: int = 0
    """``sum(R * T**2)``: query-key pairs a dense (masked) attention computes per layer and head."""
    plan: str = ""
    """Which packing plan was chosen (e.g. ``"common width 2048"``, ``"per-batch width >= 486"``)."""
    shared_prompt_tokens: int = 0
    """Prompt tokens stored once for several items (``share_prompts``) and so not computed again."""

    @property
    def efficiency(self) -> float:
        """``real_tokens / computed_tokens`` (1.0 for no micro-batches)."""
        return self.real_tokens / self.computed_tokens if self.computed_tokens else 1.0

    def to_metrics(self, prefix: str = "packing/") -> dict[str, float]:
        """Flat numeric metrics (all fields but ``dropped_indices`` and ``plan``), keys prefixed."""
        d = {k: float(v) for k, v in asdict(self).items() if k not in ("dropped_indices", "plan")}
        d["efficiency"] = self.efficiency
        return {prefix + k: v for k, v in d.items()}


class PackedMicroBatches(list):
    """``list[TokenBatch]`` with the :class:`PackingStats` of how it was made (``.stats``)."""

    def __init__(self, micro_batches: Sequence[TokenBatch], stats: PackingStats) -> None:
        super().__init__(micro_batches)
        self.stats = stats


def pack_items(
    items: Sequence[SAWItem],
    *,
    micro_token_budget: int,
    max_seq_len: int,
    pad_token_id: int = 0,
    truncation: TruncationPolicy = "truncate",
    tolerance: float = DEFAULT_TOLERANCE,
    share_prompts: bool | ShareMode = False,
    row_len: int | None = None,
) -> PackedMicroBatches:
    """Pack items into micro-batches, several sequences per row, ``R * T <= micro_token_budget``.

    Every item lands in exactly one micro-batch (or is counted as dropped in ``.stats``);
    output is deterministic for the same input. ``tolerance=0`` minimises padding alone.
    ``share_prompts``: items share their common prompt tokens, stored once in their row
    (:mod:`~ludic_lab.training.prompt_share`; needs sdpa or eager attention): ``"group"`` only
    a whole prompt (a GRPO group), ``"prefix"`` (``True``) also any common prefix of at least
    ``MIN_SHARED`` tokens (a system prompt shared across groups), in units up to ``row_len``.
    ``row_len``: the widest a row may be (default ``max_seq_len``, the longest a sequence may
    be); wider rows pad less and cost nothing where each sequence is attended on its own.
    """
    _check_args(micro_token_budget, max_seq_len, truncation)
    row_len = max_seq_len if row_len is None else row_len
    if not max_seq_len <= row_len <= micro_token_budget:
        raise ValueError(f"row_len must be in [max_seq_len={max_seq_len}, micro_token_budget={micro_token_budget}], "
                         f"got {row_len}")  # fmt: skip
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    seqs, counts = prepare(items, max_seq_len, truncation)
    if not seqs:
        return PackedMicroBatches([], _stats(len(items), [], counts))
    if share_prompts:
        mode: ShareMode = "prefix" if share_prompts is True else share_prompts
        units = group_units(seqs, max_seq_len, mode, unit_len=row_len)
    else:
        units = [Unit((s,)) for s in seqs]
    lengths = [u.length for u in units]
    plans = candidate_plans(lengths, micro_token_budget, row_len)
    costs = [plan_cost(groups, lengths) for _, groups in plans]
    least = min(tokens for tokens, _ in costs)
    k = min(
        (k for k, (tokens, _) in enumerate(costs) if tokens <= least * (1 + tolerance)),
        key=lambda k: (costs[k][1], costs[k][0], k),
    )
    name, groups = plans[k]
    batches = [_build([[units[i] for i in row] for row in g], pad_token_id) for g in groups]
    counts["shared_prompt_tokens"] = sum(u.saved_tokens for u in units)
    return PackedMicroBatches(batches, _stats(len(items), batches, counts, plan=name))


def pad_to_longest(
    items: Sequence[SAWItem],
    *,
    micro_token_budget: int,
    max_seq_len: int,
    pad_token_id: int = 0,
    truncation: TruncationPolicy = "truncate",
    sort_by_length: bool = False,
) -> PackedMicroBatches:
    """The naive baseline: one sequence per row, rows padded to the micro-batch's longest.

    Items are taken in input order (or longest first with ``sort_by_length``) and added to
    the current micro-batch while ``rows * longest <= micro_token_budget``.
    """
    _check_args(micro_token_budget, max_seq_len, truncation)
    seqs, counts = prepare(items, max_seq_len, truncation)
    if sort_by_length:
        seqs = sorted(seqs, key=lambda s: (-s.length, s.index))
    groups: list[list[list[Unit]]] = []
    cur: list[list[Unit]] = []
    longest = 0
    for s in seqs:
        if cur and (len(cur) + 1) * max(longest, s.length) > micro_token_budget:
            groups.append(cur)
            cur, longest = [], 0
        cur.append([Unit((s,))])
        longest = max(longest, s.length)
    if cur:
        groups.append(cur)
    batches = [_build(g, pad_token_id) for g in groups]
    plan = "one sequence per row" + (", longest first" if sort_by_length else "")
    return PackedMicroBatches(batches, _stats(len(items), batches, counts, plan=plan))


def block_causal_mask(seq_ids_RT: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``[R, 1, T, T]`` attention mask: query ``i`` sees key ``j <= i`` of its own sequence only.

    Bool (True = attend; what transformers' sdpa attention takes as a custom 4D mask) by
    default; with a float ``dtype``, additive (0 / dtype min; what eager attention adds).
    Padding (``seq_ids == -1``) attends to itself only, so no softmax row is empty (no NaN).
    """
    R, T = seq_ids_RT.shape
    q, k = seq_ids_RT[:, :, None], seq_ids_RT[:, None, :]
    causal_TT = torch.ones(T, T, dtype=torch.bool, device=seq_ids_RT.device).tril()
    mask_RTT = (q == k) & (q >= 0) & causal_TT
    eye_TT = torch.eye(T, dtype=torch.bool, device=seq_ids_RT.device)
    mask_RTT = mask_RTT | (eye_TT & (q < 0))
    mask = mask_RTT[:, None, :, :]
    if dtype is None:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


# ------------------------------------------------------------------------------------------
# internals
# ------------------------------------------------------------------------------------------


def _check_args(micro_token_budget: int, max_seq_len: int, truncation: str) -> None:
    if max_seq_len < 2:
        raise ValueError(f"max_seq_len must be >= 2 (a prompt token and an action), got {max_seq_len}")
    if micro_token_budget < max_seq_len:
        raise ValueError(
            f"micro_token_budget={micro_token_budget} < max_seq_len={max_seq_len}: a sequence of max_seq_len "
            "tokens could not fit in any micro-batch; raise micro_token_budget or lower max_seq_len"
        )
    if truncation not in TRUNCATION_POLICIES:
        raise ValueError(f"truncation must be one of {TRUNCATION_POLICIES}, got {truncation!r}")


def _build(rows: list[list[Unit]], pad_token_id: int) -> TokenBatch:
    """One micro-batch from rows of units (seq ids numbered row by row, left to right).

    A unit's sequences are stored from their first unshared token on, with their true
    positions, ``prefix_source``/``prefix_length`` naming the sequence and length they share
    and ``predictor`` the column that predicts each token (:mod:`.prompt_share`).
    """
    R = len(rows)
    T = max(sum(u.length for u in row) for row in rows)
    input_ids = torch.full((R, T), pad_token_id, dtype=torch.long)
    position_ids = torch.zeros((R, T), dtype=torch.long)
    seq_ids = torch.full((R, T), -1, dtype=torch.long)
    action_mask = torch.zeros((R, T), dtype=torch.float32)
    weights = torch.zeros((R, T), dtype=torch.float32)
    behaviour = torch.zeros((R, T), dtype=torch.float32)
    shared = any(u.saved_tokens for row in rows for u in row)
    source = torch.full((R, T), -1, dtype=torch.long) if shared else None
    plen = torch.zeros((R, T), dtype=torch.long) if shared else None
    predictor = torch.full((R, T), -1, dtype=torch.long) if shared else None
    merged = any(len(turn_starts(s.item)) > 1 for row in rows for u in row for s in u.seqs)
    turn_ids = torch.full((R, T), -1, dtype=torch.long) if merged else None
    turns = 0
    indices: list[int] = []
    versions: list[int | None] = []
    for r, row in enumerate(rows):
        t = 0
        for u in row:
            cols0: list[int] = []  # each member's first column
            for j, s in enumerate(u.seqs):
                it, k = s.item, len(indices)
                lo = u.first_stored(j)  # tokens of this item stored here: lo..length-1
                n = s.length - lo
                cols = slice(t, t + n)
                cols0.append(t)
                input_ids[r, cols] = torch.tensor(it.input_ids[lo : s.length], dtype=torch.long)
                position_ids[r, cols] = torch.arange(lo, s.length)
                seq_ids[r, cols] = k
                if turn_ids is not None:  # each merged turn a loss sequence of its own
                    starts = torch.tensor(turn_starts(it), dtype=torch.long)
                    turn_ids[r, cols] = turns + torch.bucketize(torch.arange(lo, s.length), starts, right=True) - 1
                    turns += len(starts)
                action_mask[r, cols] = torch.tensor(it.action_mask[lo : s.length], dtype=torch.float32)
                weights[r, cols] = torch.tensor(it.weights[lo : s.length], dtype=torch.float32)
                behaviour[r, cols] = torch.tensor(it.behaviour_logprobs[lo : s.length], dtype=torch.float32)
                if predictor is not None:
                    predictor[r, t + 1 : t + n] = torch.arange(t, t + n - 1)
                    i = u.source(j)
                    if i >= 0:  # the first stored token follows position lo - 1, stored by the source
                        assert source is not None and plen is not None
                        predictor[r, t] = cols0[i] + lo - 1 - u.first_stored(i)
                        source[r, cols] = k - j + i
                        plen[r, cols] = lo
                indices.append(s.index)
                versions.append(it.policy_version)
                t += n
    return TokenBatch(
        input_ids=input_ids,
        position_ids=position_ids,
        seq_ids=seq_ids,
        action_mask=action_mask,
        weights=weights,
        behaviour_logprobs=behaviour,
        num_sequences=len(indices),
        item_indices=tuple(indices),
        policy_versions=tuple(versions),
        prefix_source=source,
        prefix_length=plen,
        predictor=predictor,
        loss_seq_ids=turn_ids,
        num_loss_sequences=turns if turn_ids is not None else None,
    )


def _stats(num_items: int, batches: Sequence[TokenBatch], c: dict, plan: str = "") -> PackingStats:
    return PackingStats(
        num_items=num_items,
        num_sequences=sum(b.num_sequences for b in batches),
        num_micro_batches=len(batches),
        num_rows=sum(b.shape[0] for b in batches),
        real_tokens=sum(b.num_real_tokens for b in batches),
        computed_tokens=sum(b.shape[0] * b.shape[1] for b in batches),
        truncated_items=c["truncated_items"],
        truncated_tokens=c["truncated_tokens"],
        truncated_action_tokens=c["truncated_action_tokens"],
        dropped_items=c["dropped_items"],
        dropped_tokens=c["dropped_tokens"],
        dropped_indices=tuple(c["dropped_indices"]),
        attention_pairs=sum(b.shape[0] * b.shape[1] ** 2 for b in batches),
        plan=plan,
        shared_prompt_tokens=c.get("shared_prompt_tokens", 0),
    )
