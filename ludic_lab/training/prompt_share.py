"""Shared prompts: the items of a step that begin with the same prompt are scored with that
prompt stored (and computed) once.

A GRPO group is ``G`` samples of one prompt. Scored as ``G`` separate sequences, the prompt's
``P`` tokens go through the model ``G`` times; laid out as one *unit* — the first item whole,
then only the completion tokens of the others — they go through it once:

    row:  [ p0 p1 ... pP-1 a0 a1 ... ] [ b_P b_P+1 ... ] [ c_P ... ]
           item k0 (whole)              item k1 (tail)    item k2 (tail)

Every tail keeps its true positions (``P, P+1, ...``), attends to the first ``P`` tokens of
``k0`` plus its own earlier tokens (:func:`~ludic_lab.training.causal_lm.attention_mask_for`
reads ``TokenBatch.prefix_source``/``prefix_length``), and its first token is predicted from
``k0``'s hidden state at position ``P - 1`` (``TokenBatch.predictor``). Each item's logprobs,
and the gradient through the shared prompt (the sum of every item's contribution), are those
of scoring the items one by one (tests/test_prompt_share.py).

The shared part is the prompt only: the tokens before an item's first action token, the same
tokens in every item of the unit. Action tokens are never shared (each item's own weights and
sequence-level aggregations stay its own), so losses see exactly the tokens they saw before.
A unit is at most ``max_seq_len`` tokens long; a larger group is split into several units,
each with the prompt once.

Needs an attention implementation that takes a custom 4-D mask (``sdpa``, ``eager``); under
flash / flex attention the trainer packs items one by one (``TrainerConfig.share_prompts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_PackSeq = Any
"""A packed sequence (``packing._Seq``): ``.item`` (a SAWItem) and ``.length``."""


@dataclass(frozen=True)
class Unit:
    """Sequences packed together: ``seqs[0]`` whole, the others from token ``prefix`` on."""

    seqs: tuple[Any, ...]
    prefix: int
    """Tokens of ``seqs[0]`` the others share (0: no sharing, a unit of one)."""

    @property
    def length(self) -> int:
        """Stored tokens: the first sequence whole plus the others' tails."""
        first = self.seqs[0].length
        return first + sum(s.length - self.prefix for s in self.seqs[1:])

    @property
    def saved_tokens(self) -> int:
        """Prompt tokens not stored (and not computed) thanks to sharing."""
        return self.prefix * (len(self.seqs) - 1)


def prompt_length(action_mask: Sequence[int]) -> int:
    """Tokens before the first action token (all of them when there is none)."""
    for i, m in enumerate(action_mask):
        if m:
            return i
    return len(action_mask)


def group_units(seqs: Sequence[_PackSeq], max_seq_len: int) -> list[Unit]:
    """Sequences with the same prompt grouped into units of at most ``max_seq_len`` tokens,
    in order of first appearance; a prompt seen once (or of no token) is a unit of one."""
    by_prompt: dict[tuple[int, ...], list[_PackSeq]] = {}
    order: list[tuple[int, ...] | int] = []
    for k, s in enumerate(seqs):
        p = prompt_length(s.item.action_mask[: s.length])
        if p == 0 or p >= s.length:  # nothing to share, or nothing to score after it
            order.append(k)
            continue
        key = tuple(s.item.input_ids[:p])
        if key not in by_prompt:
            by_prompt[key] = []
            order.append(key)
        by_prompt[key].append(s)
    units: list[Unit] = []
    for o in order:
        if isinstance(o, int):
            units.append(Unit((seqs[o],), 0))
            continue
        units.extend(_split(by_prompt[o], len(o), max_seq_len))
    return units


def _split(members: list[_PackSeq], prefix: int, max_seq_len: int) -> list[Unit]:
    """Consecutive members into units no longer than ``max_seq_len`` (each a whole first item)."""
    out: list[Unit] = []
    cur: list[_PackSeq] = []
    length = 0
    for s in members:
        add = s.length if not cur else s.length - prefix
        if cur and length + add > max_seq_len:
            out.append(Unit(tuple(cur), prefix if len(cur) > 1 else 0))
            cur, length, add = [], 0, s.length
        cur.append(s)
        length += add
    if cur:
        out.append(Unit(tuple(cur), prefix if len(cur) > 1 else 0))
    return out
