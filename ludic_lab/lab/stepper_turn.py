"""A stepped turn (:class:`Turn`) and the HTML views of an episode: one card per turn, and
the transcript around them."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.agents.base_agent import ActResult
from ludic_lab.inference.request import SamplingConfig
from ludic_lab.lab.token_html import fmt, sequence_html, view_html
from ludic_lab.parsers import ParseResult
from ludic_lab.types import Message, Step


@dataclass(frozen=True)
class Turn:
    """One stepped turn: what the model saw and said, and what came back."""

    index: int
    """Turn (step) index in the episode, from 0."""
    act: ActResult
    """The agent's act result (response, parse result, token trace, prompt messages)."""
    step: Step
    """The step exactly as the protocol records it."""
    system_prompt: str | None
    """System prompt of the episode this turn belongs to."""
    sampling: SamplingConfig
    """Sampling config of the request (before the per-turn seed was applied)."""
    attempt: int = 0
    """0 for the first sample of this turn, n for its n-th re-run."""
    tokenizer: Any = field(default=None, repr=False, compare=False)

    @property
    def prompt_messages(self) -> tuple[Message, ...]:
        return self.act.prompt_messages

    @property
    def completion(self) -> str:
        return self.act.text

    @property
    def parse_result(self) -> ParseResult:
        return self.act.parse_result

    @property
    def format_reward(self) -> float:
        return self.step.format_reward

    @property
    def env_reward(self) -> float:
        """The env's reward (0 when parsing failed and the env was not called)."""
        return self.step.env_reward

    @property
    def next_obs(self) -> str | None:
        return self.step.next_obs

    @property
    def reward(self) -> float:
        return self.step.reward

    @property
    def done(self) -> bool:
        return self.step.done

    def _repr_html_(self) -> str:
        return view_html(turn_html(self))


def turn_html(t: Turn, *, open_prompt: bool = False) -> str:
    """The body of a turn's view: prompt messages, completion tokens, parse and env results."""
    s = t.step
    flags = [f for f, on in (("terminated", s.terminated), ("truncated", s.truncated)) if on]
    head = (
        f"<div class='ll-head'><b>turn {t.index}</b>"
        + (f" (re-run {t.attempt})" if t.attempt else "")
        + f" · reward <b>{fmt(s.reward)}</b> = env {fmt(s.env_reward)} + format {fmt(s.format_reward)}"
        + f" · temperature {t.sampling.temperature:g}, max_tokens {t.sampling.max_tokens}"
        + ("" if not flags else " · " + ", ".join(flags))
        + "</div>"
    )
    msgs = "".join(
        f"<div class='ll-msg'><b>{html.escape(str(m.get('role')))}</b>\n{html.escape(str(m.get('content')))}</div>"
        for m in t.prompt_messages
    )
    prompt = (
        f"<details{' open' if open_prompt else ''}><summary>prompt: {len(t.prompt_messages)} message(s)</summary>"
        f"{msgs}</details>"
    )
    tr = t.act.trace
    if tr is not None:
        lps = tr.completion_logprobs
        comp = sequence_html(
            list(tr.completion_token_ids), tokenizer=t.tokenizer, logprobs=None if lps is None else list(lps)
        )
        comp = (
            f"<div class='ll-head'>completion · {len(tr.completion_token_ids)} tokens ({tr.finish_reason})</div>{comp}"
        )
    else:
        comp = f"<div class='ll-head'>completion</div><div class='ll-msg'>{html.escape(t.completion)}</div>"
    pr = t.parse_result
    if pr.action is None:
        parse = (
            f"<div class='ll-head'><span class='ll-err'>parse error</span> · format reward {fmt(pr.reward)}"
            f" · env not called · feedback:</div><div class='ll-msg'>{html.escape(s.next_obs or '')}</div>"
        )
    else:
        parse = (
            f"<div class='ll-head'>parsed action: <code>{html.escape(repr(pr.action))}</code> · format reward "
            f"{fmt(pr.reward)}</div><div class='ll-head'>env reward <b>{fmt(s.env_reward)}</b> · "
            "next observation:</div>"
            f"<div class='ll-msg'>{html.escape(s.next_obs or '')}</div>"
        )
    return f"<div class='ll-card' data-turn='{t.index}'>{head}{prompt}{comp}{parse}</div>"


def transcript_html(
    head: str,
    turns: Sequence[Turn],
    *,
    started: bool,
    system_prompt: str | None,
    next_obs: str | None,
    error: str | None,
) -> str:
    """The episode so far below ``head`` (HTML): the system prompt, one card per turn (the
    newest prompt unfolded), the observation the next turn will see, and an error if any."""
    if not started:
        body = "<div class='ll-head'>not started: press Step</div>"
    else:
        body = (
            "<div class='ll-head'>system prompt:</div>"
            f"<div class='ll-msg'>{html.escape(system_prompt or '(none)')}</div>"
            + "".join(turn_html(t, open_prompt=(i == len(turns) - 1)) for i, t in enumerate(turns))
        )
        if next_obs is not None and turns:
            body += f"<div class='ll-head'>next observation:</div><div class='ll-msg'>{html.escape(next_obs)}</div>"
    if error:
        body += f"<div class='ll-err'>{html.escape(error)}</div>"
    return view_html(head + body)
