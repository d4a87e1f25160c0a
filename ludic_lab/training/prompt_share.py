"""Shared prompts: items of a step whose prompts begin alike are scored with the common
beginning stored (and computed) once.

A GRPO group is ``G`` samples of one prompt; the groups of a tool or agent env also share a
long system prompt (tool schemas) before their different questions. Items are laid out as
*units*: the first member stored whole, every other member ``m`` from token ``L_m`` on, where
``L_m`` is the length of its common prompt prefix with an earlier member, its *source*:

    row:  [ s0 ... s439 qA0 ... a0 a1 ... ] [ b_P ... ] [ qB0 qB1 ... c0 ... ] [ d_P' ... ]
           A1 (whole)                        A2: sees A1   B1: sees A1's 440     B2: sees B1's
                                                 [0, P)   system tokens          [0, P'): A1's
                                                                                 440, then B1's own

Every stored token keeps its true position. A member sees the first ``L_m`` positions of its
source *as the source sees them*: the source's stored tokens below ``L_m`` and, through the
source's own source, the rest (a chain; :func:`~ludic_lab.training.causal_lm.attention_mask_for`
and :func:`~ludic_lab.training.packed_attention.segment_plan` read ``TokenBatch.prefix_source``
/ ``prefix_length``). The source is chosen so it stores position ``L_m - 1`` itself, whose
hidden state predicts the member's first stored token (``TokenBatch.predictor``). Each item's
logprobs, and the gradient through the shared tokens (the sum of every item's contribution),
are those of scoring the items one by one (tests/test_prompt_share.py).

Only prompt tokens are shared: the tokens before an item's first action token (a multi-turn
item's later prompt segments are its own). Action tokens are never shared, so losses see
exactly the tokens they saw before. Two ways to find units (:func:`group_units`):

* ``"group"``: items with the *same whole prompt* (a GRPO group), units at most ``max_seq_len``;
* ``"prefix"``: the same prompt, or any common prompt prefix of at least :data:`MIN_SHARED`
  tokens (the groups of one system prompt share it too), units at most a row wide.

Needs an attention implementation that takes a custom 4-D mask (``sdpa``, ``eager``); under
flash / flex attention the trainer packs items one by one (``TrainerConfig.share_prompts``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

_PackSeq = Any
"""A packed sequence (``packing._Seq``): ``.item`` (a SAWItem), ``.length`` and ``.index``."""

ShareMode = Literal["group", "prefix"]
SHARE_MODES: tuple[str, ...] = ("group", "prefix")

MIN_SHARED = 16
"""``"prefix"`` shares no common prefix shorter than this (a chat template's header) unless
it is the whole prompt of both: it would save a few tokens and tie otherwise independent
sequences into one chain, whose units then fill up and split groups (``bench/prefix_share.py
--threshold``: 3,110 tokens shared from 1 token on vs 3,677 from 16)."""


@dataclass(frozen=True)
class Unit:
    """Sequences packed together, in order: ``seqs[j]`` stored from token ``shared[j]`` on,
    seeing the first ``shared[j]`` positions of ``seqs[sources[j]]`` (``sources[j] < j``; -1 and
    0 for a sequence stored whole). Empty ``sources``/``shared``: every sequence whole."""

    seqs: tuple[Any, ...]
    sources: tuple[int, ...] = ()
    shared: tuple[int, ...] = ()

    def first_stored(self, j: int) -> int:
        """The first token of ``seqs[j]`` stored in the unit (0: stored whole)."""
        return self.shared[j] if self.shared else 0

    def source(self, j: int) -> int:
        """Index in the unit of the sequence ``seqs[j]`` shares with (-1: none)."""
        return self.sources[j] if self.sources else -1

    @property
    def length(self) -> int:
        """Stored tokens: every sequence less its shared prefix."""
        return sum(s.length for s in self.seqs) - sum(self.shared)

    @property
    def saved_tokens(self) -> int:
        """Prompt tokens not stored (and not computed) thanks to sharing."""
        return sum(self.shared)


def prompt_length(action_mask: Sequence[int]) -> int:
    """Tokens before the first action token (all of them when there is none)."""
    for i, m in enumerate(action_mask):
        if m:
            return i
    return len(action_mask)


def group_units(
    seqs: Sequence[_PackSeq], max_seq_len: int, mode: ShareMode = "group", *, unit_len: int | None = None,
    min_shared: int = MIN_SHARED,
) -> list[Unit]:  # fmt: skip
    """``seqs`` as units sharing prompt tokens, in order of their first sequence. ``"group"``:
    sequences with the same prompt, units of at most ``max_seq_len`` tokens; ``"prefix"``: the
    same prompt or a common prompt prefix of ``>= min_shared`` tokens, units of at most
    ``unit_len`` (default ``max_seq_len``). A sequence with no prompt or nothing after it is a
    unit of one."""
    if mode not in SHARE_MODES:
        raise ValueError(f"share mode must be one of {SHARE_MODES}, got {mode!r}")
    cap = max_seq_len if mode == "group" or unit_len is None else unit_len
    least = max(1, min_shared)
    prompts = [tuple(s.item.input_ids[: prompt_length(s.item.action_mask[: s.length])]) for s in seqs]
    alone = [k for k, p in enumerate(prompts) if not 0 < len(p) < seqs[k].length]
    order = sorted((k for k in range(len(seqs)) if 0 < len(prompts[k]) < seqs[k].length), key=lambda k: prompts[k])
    built: list[tuple[int, Unit]] = [(k, Unit((seqs[k],))) for k in alone]
    cur: list[int] = []
    sources: list[int] = []
    shared: list[int] = []
    length = 0

    def close() -> None:
        if cur:
            many = len(cur) > 1
            unit = Unit(tuple(seqs[k] for k in cur), tuple(sources) if many else (), tuple(shared) if many else ())
            built.append((min(cur), unit))

    for k in order:
        s, p = seqs[k], prompts[k]
        L, same = 0, False
        if cur:  # sorted: no earlier member shares more with s than the one before it
            prev = prompts[cur[-1]]
            same = p == prev
            L = len(p) if same else 0 if mode == "group" else _common(p, prev)
        if L > 0 and (same or L >= least) and length + s.length - L <= cap:
            src = len(cur) - 1
            while L <= shared[src]:  # the source must store position L - 1: go down its chain
                src = sources[src]
            cur.append(k)
            sources.append(src)
            shared.append(L)
            length += s.length - L
            continue
        close()
        cur, sources, shared, length = [k], [-1], [0], s.length
    close()
    return [u for _, u in sorted(built, key=lambda x: x[0])]


def _common(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the common prefix of ``a`` and ``b``."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
