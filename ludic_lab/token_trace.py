"""The token-level record of one model call (layer 0, no torch): :class:`TokenTrace`.

What the trainer scores: the prompt ids, the completion ids the sampler produced, the
behaviour logprob of each, which completion tokens were sampled (a tool turn inserts
others), and the policy version behind them. A completion that spans a weight update (the
in-process sampler's ``weight_update="in_flight"``) records the version of each token
(``token_versions``); ``policy_version`` stays the oldest, what staleness is measured by.
Re-exported by :mod:`ludic_lab.types`, where every other core data type lives.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ludic_lab.types import ChatResponse

PromptSource = Literal["fresh", "extended", "retokenized"]
"""How a turn's prompt ids were made.

- ``"fresh"``: the chat template rendered and tokenized (the first turn of an episode);
- ``"extended"``: the previous turn's prompt ids + its completion ids + the tokens of the
  new messages only — the history the model saw is exactly the history it produced;
- ``"retokenized"``: the context strategy rewrote history, so the prompt does not extend the
  previous call's ids (a new training chain starts): either the sampled replies' ids were
  rewritten in place (``TruncatedThinkingContext``: only their reasoning spans are replaced,
  ``info["rewritten_reply"]``) or the whole prompt was rendered again from messages.
"""


def as_ints(xs: Iterable[int]) -> tuple[int, ...]:
    """``xs`` as a tuple of Python ints."""
    return tuple(int(x) for x in xs)


def as_floats(xs: Iterable[float]) -> tuple[float, ...]:
    """``xs`` as a tuple of Python floats."""
    return tuple(float(x) for x in xs)


def checked_versions(
    versions: Iterable[int] | None, n: int | None, policy_version: int | None, who: str
) -> tuple[tuple[int, ...] | None, int | None]:
    """``(token_versions, policy_version)`` checked: one version per completion token (``n``;
    ``None``: not checked) and ``policy_version`` the oldest of them (filled in when ``None``)."""
    if versions is None:
        return None, policy_version
    vs = as_ints(versions)
    if n is not None and len(vs) != n:
        raise ValueError(f"{who}: {n} completion ids but {len(vs)} token_versions — they must align one to one")
    if vs and policy_version is None:
        policy_version = min(vs)
    elif vs and policy_version != min(vs):
        raise ValueError(
            f"{who}: policy_version={policy_version} but the oldest of token_versions is {min(vs)}; "
            "policy_version must be the oldest version (what staleness is measured by)"
        )
    return vs, policy_version


@dataclass(frozen=True)
class TokenTrace:
    """The canonical token-level record of one model call: what the trainer scores.

    ``len(completion_logprobs) == len(completion_token_ids)`` is enforced. The ids are the
    sampler's own; ``prompt_source`` says whether the prompt extended the previous turn's
    ids or had to be re-rendered because the context strategy rewrote history.
    """

    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    completion_logprobs: tuple[float, ...] | None = None
    prompt_source: PromptSource = "fresh"
    policy_version: int | None = None
    finish_reason: str = "stop"
    completion_mask: tuple[int, ...] | None = None
    """1 where a completion token was sampled by the model, 0 where it was inserted (a tool
    result and the chat template's glue around it, in a multi-call tool turn). ``None``: every
    completion token was sampled. Inserted tokens carry logprob 0 and are never trained on."""
    token_versions: tuple[int, ...] | None = None
    """Per completion token, the policy version that sampled it (an inserted token: that of the
    call it was fed to); ``None``: every token has ``policy_version``, which is the oldest."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_token_ids", as_ints(self.prompt_token_ids))
        object.__setattr__(self, "completion_token_ids", as_ints(self.completion_token_ids))
        if self.completion_mask is not None:
            mask = as_ints(self.completion_mask)
            if len(mask) != len(self.completion_token_ids) or any(m not in (0, 1) for m in mask):
                raise ValueError(
                    f"TokenTrace.completion_mask must hold one 0/1 per completion token "
                    f"({len(self.completion_token_ids)}), got {len(mask)} entries"
                )
            object.__setattr__(self, "completion_mask", mask)
        if self.completion_logprobs is not None:
            object.__setattr__(self, "completion_logprobs", as_floats(self.completion_logprobs))
            if len(self.completion_logprobs) != len(self.completion_token_ids):
                raise ValueError(
                    f"TokenTrace: {len(self.completion_token_ids)} completion ids but "
                    f"{len(self.completion_logprobs)} logprobs — they must align one to one"
                )
        vs, oldest = checked_versions(
            self.token_versions, len(self.completion_token_ids), self.policy_version, "TokenTrace"
        )
        object.__setattr__(self, "token_versions", vs)
        object.__setattr__(self, "policy_version", oldest)
        if self.prompt_source not in ("fresh", "extended", "retokenized"):
            raise ValueError(f"TokenTrace.prompt_source must be fresh/extended/retokenized, got {self.prompt_source!r}")
        if len(self.prompt_token_ids) == 0:
            raise ValueError("TokenTrace: empty prompt_token_ids")

    @property
    def input_ids(self) -> tuple[int, ...]:
        """Prompt followed by completion: the sequence the trainer runs forward on."""
        return self.prompt_token_ids + self.completion_token_ids

    @property
    def sampled_mask(self) -> tuple[int, ...]:
        """Per completion token, 1 if the model sampled it (``completion_mask`` or all ones)."""
        if self.completion_mask is None:
            return (1,) * len(self.completion_token_ids)
        return self.completion_mask

    @property
    def versions(self) -> tuple[int, ...] | None:
        """Per completion token, the policy version it was sampled (or fed) under:
        ``token_versions``, else ``policy_version`` for all; ``None`` when unknown."""
        if self.token_versions is not None or self.policy_version is None:
            return self.token_versions
        return (self.policy_version,) * len(self.completion_token_ids)

    @property
    def num_sampled_tokens(self) -> int:
        """How many completion tokens the model sampled (inserted tool tokens excluded)."""
        return sum(self.sampled_mask)

    def model_turns(self) -> list[TokenTrace]:
        """The trace of each model call inside this one (a tool turn holds several).

        Turn ``k``'s prompt is this prompt plus every completion token before its first
        sampled token (so earlier turns and the inserted tool results), its completion the
        run of sampled tokens: exactly what that call was conditioned on and produced.
        A trace without a mask is one turn (itself).
        """
        if self.completion_mask is None:
            return [self]
        out: list[TokenTrace] = []
        ids, mask, lps = self.completion_token_ids, self.completion_mask, self.completion_logprobs
        vs = self.token_versions
        i, n = 0, len(ids)
        while i < n:
            if not mask[i]:
                i += 1
                continue
            j = i
            while j < n and mask[j]:
                j += 1
            out.append(
                TokenTrace(
                    prompt_token_ids=self.prompt_token_ids + ids[:i],
                    completion_token_ids=ids[i:j],
                    completion_logprobs=lps[i:j] if lps is not None else None,
                    prompt_source=self.prompt_source if not out else "extended",
                    policy_version=min(vs[i:j]) if vs is not None else self.policy_version,
                    finish_reason=self.finish_reason if j == n else "stop",
                    token_versions=vs[i:j] if vs is not None else None,
                )
            )
            i = j
        return out

    @classmethod
    def from_response(cls, response: ChatResponse, prompt_source: PromptSource = "fresh") -> TokenTrace:
        """Build the trace of ``response``; raises if the backend did not return token ids."""
        if response.prompt_token_ids is None or response.completion_token_ids is None:
            raise ValueError(
                "ChatResponse carries no token ids: request them with "
                "ReturnSpec(return_token_ids=True, return_chosen_logprobs=True) for training"
            )
        return cls(
            prompt_token_ids=response.prompt_token_ids,
            completion_token_ids=response.completion_token_ids,
            completion_logprobs=response.completion_logprobs,
            prompt_source=prompt_source,
            policy_version=response.policy_version,
            finish_reason=response.finish_reason,
            token_versions=response.token_versions,
        )
