"""Token traces of several model calls folded into one (layer 0, no torch).

A tool turn, or a segment of an agent program's calls, is a chain of model calls where each
call's prompt extends the previous call's prompt + completion. :func:`merge_traces` makes the
one trace the trainer scores: the first prompt, then every sampled token (mask 1) with the
tokens inserted between calls (tool results, template glue: mask 0, logprob 0). Per-token
policy versions follow the tokens (an inserted token gets the version of the call whose
prompt carried it in); the merged ``policy_version`` is the oldest.
"""

from __future__ import annotations

from collections.abc import Sequence

from ludic_lab.types import TokenTrace


def merge_traces(traces: Sequence[TokenTrace | None]) -> TokenTrace | None:
    """One trace for a tool step: the first prompt, then each call's completion (mask 1) with
    the inserted tokens between calls (mask 0). ``None`` if any call has no trace; a call
    whose prompt does not extend the sequence so far is an error (nothing re-tokenized)."""
    if not traces or any(t is None for t in traces):
        return None
    first = traces[0]
    assert first is not None
    if len(traces) == 1:
        return first
    seq = list(first.input_ids)
    ids, mask, lps = list(first.completion_token_ids), [1] * len(first.completion_token_ids), []
    per_call = [t.versions if t is not None else None for t in traces]
    have_vs = all(v is not None for v in per_call)
    vs: list[int] = list(per_call[0] or ())
    have_lps = all(t is not None and t.completion_logprobs is not None for t in traces)
    if have_lps:
        lps = list(first.completion_logprobs or ())
    for t, t_vs in zip(traces[1:], per_call[1:], strict=True):
        assert t is not None
        prompt = list(t.prompt_token_ids)
        if prompt[: len(seq)] != seq:
            raise RuntimeError("a tool turn's prompt does not extend the previous turn's ids; cannot merge traces")
        inserted = prompt[len(seq) :]
        ids += inserted + list(t.completion_token_ids)
        mask += [0] * len(inserted) + [1] * len(t.completion_token_ids)
        if have_lps:
            lps += [0.0] * len(inserted) + list(t.completion_logprobs or ())
        if have_vs and t_vs is not None:  # the call's prompt ran under its first token's version
            vs += [t_vs[0] if t_vs else t.policy_version or 0] * len(inserted) + list(t_vs)
        seq = prompt + list(t.completion_token_ids)
    versions = [t.policy_version for t in traces if t is not None and t.policy_version is not None]
    return TokenTrace(
        prompt_token_ids=first.prompt_token_ids,
        completion_token_ids=tuple(ids),
        completion_logprobs=tuple(lps) if have_lps else None,
        prompt_source=first.prompt_source,
        policy_version=min(versions) if versions else None,
        finish_reason=traces[-1].finish_reason,  # type: ignore[union-attr]  # a step has at least one trace
        completion_mask=tuple(mask),
        token_versions=tuple(vs) if have_vs and len(set(vs)) > 1 else None,  # None: one version for all
    )
