"""Reasoning on a real Qwen3 tokenizer: thinking tokens are sampled and trained as actions, kept
in the trace exactly; history that hides earlier reasoning is bridged so the ids trained are
the ids sampled, and a template that rewrites history is counted (``prefix_breaks``).

The client answers with scripted Qwen3 token ids (what a sampler of the family emits) and
decodes them as Qwen3's own tokenizer does: ``<think>`` is not a special token there, so the
reply text keeps it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog, TruncatedThinkingContext
from ludic_lab.envs import SingleAgentEnv
from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.interaction.single_agent import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rendering import read_reply, renderer_for
from ludic_lab.rendering.edit import rewrite_ids
from ludic_lab.rollouts.batch_stats import rollout_stats
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.rollouts.turn_merge import merge_turns
from ludic_lab.types import ChatResponse, Info, StepOutcome
from tests import family_tokenizers as ft

THINK = 151667  # <think> in Qwen3's vocabulary


class Qwen3Client:
    """Answers each request with the next scripted ids; text as Qwen3's tokenizer decodes,
    reasoning as the clients read it (the rendering layer's parse of the ids)."""

    def __init__(self, tok: Any, replies: Sequence[list[int]]) -> None:
        self.tok, self.replies = tok, list(replies)
        self.renderer = renderer_for(tok)
        self.stop = {tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")}
        self.requests: list[ChatCompletionRequest] = []

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        assert request.prompt_token_ids is not None
        self.requests.append(request)
        ids = self.replies[len(self.requests) - 1]
        text = self.tok.decode([t for t in ids if t not in self.stop])
        resp = ChatResponse(
            text=text,
            reasoning=read_reply(self.renderer, ids, text, request.prompt_token_ids).reasoning,
            completion_token_ids=tuple(ids),
            prompt_token_ids=request.prompt_token_ids,
            completion_logprobs=tuple([-0.5] * len(ids)),
        )
        return resp, {}


class TwoQuestions(SingleAgentEnv):
    """Two questions; any answer moves on; the episode ends after the second."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self.n = 0
        return "What is 2+3?", {}

    def env_step(self, action: str) -> StepOutcome:
        self.n += 1
        return StepOutcome("And 4+4?", 1.0, False, self.n >= 2)

    def env_current_obs(self) -> str:
        return "What is 2+3?" if self.n == 0 else "And 4+4?"


def _per_piece(tok: Any, *pieces: str) -> list[int]:
    """Ids of ``pieces`` encoded one by one: a valid tokenisation a sampler may produce that
    encoding the joined text would not (re-tokenising loses it)."""
    return [t for p in pieces for t in tok.encode(p)]


def _replies(tok: Any) -> list[list[int]]:
    first = _per_piece(tok, "<think>\nadd two and three\n</think>\n\n", "fi", "ve", "<|im_end|>")
    second = tok.encode("<think>\nfour and four\n</think>\n\neight<|im_end|>")
    assert tok.encode("five") != _per_piece(tok, "fi", "ve")  # the first answer is non-canonical
    return [first, second]


async def _episode(ctx: Any) -> tuple[Any, Qwen3Client, list[list[int]]]:
    tok = ft.qwen3_tokenizer()
    replies = _replies(tok)
    client = Qwen3Client(tok, replies)
    agent = Agent(client, ctx, identity_parser, renderer=renderer_for(tok))
    protocol = SingleAgentSyncProtocol(agent)
    (rollout,) = await protocol.run(env=TwoQuestions(), max_steps=4)
    return rollout, client, replies


async def test_two_thinking_turns_train_the_sampled_ids_and_count_qwen3s_prefix_break() -> None:
    rollout, client, (r1, r2) = await _episode(FullDialog("Be brief."))
    p1, p2 = (list(r.prompt_token_ids or ()) for r in client.requests)
    s1, s2 = rollout.steps
    # the second prompt is the sampled stream, reasoning and all, then the new user turn
    assert p2[: len(p1) + len(r1)] == [*p1, *r1]
    assert s2.trace is not None and s2.trace.prompt_source == "extended"
    # training: the turns fold into one sequence equal to the sampled stream; the action mask
    # covers exactly the sampled tokens, thinking included
    items = [SAWItem.from_step(rollout, s, 1.0) for s in rollout.steps]
    (merged,), stats = merge_turns(items)
    assert stats.breaks == 0 and list(merged.input_ids) == [*p2, *r2]
    glue = len(p2) - len(p1) - len(r1)
    assert list(merged.action_mask) == [0] * len(p1) + [1] * len(r1) + [0] * glue + [1] * len(r2)
    thinking = [i for i, t in enumerate(merged.input_ids) if t == THINK and i >= len(p1)]
    assert len(thinking) == 2 and all(merged.action_mask[i] == 1 for i in thinking)
    # Qwen3's own template drops the first turn's <think> block from history: counted, not trained
    fresh = renderer_for(ft.qwen3_tokenizer()).render_ids(list(client.requests[1].messages))
    assert p2.count(THINK) == 1 and fresh.count(THINK) == 0 and fresh != p2
    assert "prefix_break" not in s1.info["agent"] and s2.info["agent"]["prefix_break"] is True
    assert rollout_stats([rollout])["prefix_breaks"] == 1


async def test_hidden_reasoning_keeps_every_other_sampled_id() -> None:
    """TruncatedThinkingContext: the second prompt is the first prompt, the first reply's
    sampled ids with only its reasoning replaced, then the new turn; each step trains on
    exactly the ids its call was sampled on, thinking included."""
    ctx = TruncatedThinkingContext("Be brief.", placeholder="...")
    rollout, client, (r1, r2) = await _episode(ctx)
    tok = ft.qwen3_tokenizer()
    p1, p2 = (list(r.prompt_token_ids or ()) for r in client.requests)
    s1, s2 = rollout.steps
    assert s2.trace is not None and s2.trace.prompt_source == "retokenized"
    assert s2.info["agent"]["rewritten_reply"] is True
    shown = rewrite_ids(tok, r1, ctx.rewrite_reply)
    assert shown is not None and tok.decode(shown) == "<think>...</think>\n\nfive<|im_end|>"
    assert p2[: len(p1) + len(shown)] == [*p1, *shown]
    answer = r1[r1.index(THINK + 1) :]  # </think>, "\n\n", "fi", "ve", <|im_end|> as sampled
    assert p2[len(p1) : len(p1) + len(shown)][-len(answer) :] == answer
    for step, prompt, reply in ((s1, p1, r1), (s2, p2, r2)):
        item = SAWItem.from_step(rollout, step, 1.0)
        assert list(item.input_ids) == [*prompt, *reply]
        assert list(item.action_mask) == [0] * len(prompt) + [1] * len(reply)
        assert item.input_ids[len(prompt)] == THINK  # the reasoning is an action
    assert rollout_stats([rollout])["prefix_breaks"] == s2.info["agent"]["prefix_breaks"] == 1


async def test_negative_control_re_rendering_loses_the_sampled_answer() -> None:
    """The old path (render the rewritten messages again) re-tokenises the first answer: its
    sampled ids ("fi", "ve") are not in that prompt, so a test of the new path would fail on it."""
    rollout, client, (r1, _) = await _episode(TruncatedThinkingContext("Be brief.", placeholder="..."))
    tok = ft.qwen3_tokenizer()
    old = renderer_for(tok).render_ids(list(client.requests[1].messages))
    sampled_answer = _per_piece(tok, "fi", "ve")
    p2 = list(client.requests[1].prompt_token_ids or ())

    def contains(seq: list[int], sub: list[int]) -> bool:
        return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))

    assert contains(p2, sampled_answer) and not contains(old, sampled_answer)
    assert old != p2


def test_rewrite_ids_replaces_only_the_changed_span() -> None:
    tok = ft.qwen3_tokenizer()
    ids = _per_piece(tok, "<think>\nlong plan here\n</think>\n\n", "fi", "ve")
    out = rewrite_ids(tok, ids, lambda t: t.replace("long plan here", "[hidden]"))
    assert out is not None and tok.decode(out) == "<think>\n[hidden]\n</think>\n\nfive"
    assert out[0] == THINK and out[-2:] == _per_piece(tok, "fi", "ve")
    assert rewrite_ids(tok, ids, lambda t: t) == ids


async def test_a_tool_turn_after_the_last_user_message_is_no_prefix_break() -> None:
    """Qwen3 keeps the reasoning of turns after the last user message: within one step's tool
    loop the fresh render equals the sampled stream (0 breaks), so the count is not a constant."""
    from ludic_lab.agents import ToolAgent

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    tok = ft.qwen3_tokenizer()
    call = (
        '<think>\nI should add.\n</think>\n\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    )
    replies = [tok.encode(call + "<|im_end|>"), tok.encode("<think>\nok\n</think>\n\n5<|im_end|>")]
    client = Qwen3Client(tok, replies)
    agent = ToolAgent(client, FullDialog(), identity_parser, tools=[add], renderer=renderer_for(tok))
    agent.reset("You are a calculator.")
    agent.on_env_reset("What is 2+3?", {})
    res = await agent.act()
    assert res.info["tools"]["ok"] == 1 and res.info["prefix_breaks"] == 0
    assert res.trace is not None and res.trace.completion_mask is not None
    sampled = [t for t, m in zip(res.trace.completion_token_ids, res.trace.completion_mask, strict=True) if m]
    assert sampled == [*replies[0], *replies[1]] and sampled.count(THINK) == 2


async def test_views_show_reasoning_apart_from_the_answer() -> None:
    """The rollout HTML view marks exactly the thinking tokens (``ll-think``) and lists the
    reasoning under them; the table has ``reasoning`` and ``answer`` columns."""
    from ludic_lab.lab.rollout_html import rollouts_html
    from ludic_lab.rollout_table import rollouts_to_dataframe
    from tests.test_lab_html import parse

    rollout, _, (r1, r2) = await _episode(FullDialog("Be brief."))
    tok = ft.qwen3_tokenizer()
    view = parse(rollouts_html(rollout, tokenizer=tok))
    spans = view.cards[0]["spans"]
    think_ids = [int(i) for s in spans if "ll-think" in s["attrs"]["class"] for i in s["attrs"]["data-ids"].split()]
    expected = []
    for reply in (r1, r2):
        close = reply.index(THINK + 1)
        expected += reply[: close + 1]  # <think> ... </think>, tags included
    assert think_ids == expected
    assert all(s["attrs"]["data-mask"] == "1" for s in spans if "ll-think" in s["attrs"]["class"])
    answers = "".join(
        s["text"] for s in spans if s["attrs"]["data-mask"] == "1" and "ll-think" not in s["attrs"]["class"]
    )
    assert "five" in answers and "eight" in answers and "four and four" not in answers
    page = rollouts_html(rollout, tokenizer=tok)
    assert "reasoning · " in page and "add two and three" in page
    # the table: reasoning and answer apart, from the family's parse (the agent's info)
    df = rollouts_to_dataframe([rollout], per="step")
    assert list(df["reasoning"]) == ["add two and three", "four and four"]
    assert list(df["answer"]) == ["five", "eight"]
    assert rollout.steps[0].info["agent"]["reasoning"] == "add two and three"
    assert rollouts_to_dataframe([rollout])["final_reasoning"].tolist() == ["four and four"]


def test_a_step_without_reasoning_has_none_in_views() -> None:
    from ludic_lab.rollout_table import step_reasoning
    from ludic_lab.types import Step

    plain = Step(index=0, prev_obs="q", action="just 5", parsed_action="just 5", next_obs=None, reward=0.0)
    assert step_reasoning(plain) == (None, "just 5")
    text = Step(index=0, prev_obs="q", action="<think>hm</think> 5", parsed_action="5", next_obs=None, reward=0.0)
    assert step_reasoning(text) == ("hm", "5")


async def test_hidden_reasoning_of_a_whole_tool_step_is_rewritten_in_place() -> None:
    """A tool step's two replies (a call, then the answer) both think; the next step's prompt
    is that step's stream with both reasoning spans replaced and every other id as it was
    (the tool call, the inserted result, the non-canonical answer), not a re-render."""
    from ludic_lab.agents import ToolAgent

    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        return a + b

    tok = ft.qwen3_tokenizer()
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    replies = [
        tok.encode(f"<think>\nI should add.\n</think>\n\n{call}<|im_end|>"),
        _per_piece(tok, "<think>\nit is 5\n</think>\n\n", "fi", "ve", "<|im_end|>"),
        tok.encode("<think>\n8\n</think>\n\neight<|im_end|>"),
    ]
    ctx = TruncatedThinkingContext("You are a calculator.", placeholder="...")
    client = Qwen3Client(tok, replies)
    agent = ToolAgent(client, ctx, identity_parser, tools=[add], renderer=renderer_for(tok))
    agent.reset()
    agent.on_env_reset("What is 2+3?", {})
    first = await agent.act()
    agent.on_after_step("And 4+4?", {})
    second = await agent.act()
    assert first.trace is not None and second.trace is not None
    stream = list(first.trace.input_ids)  # the step's prompt, both replies and the tool result
    p3 = list(client.requests[2].prompt_token_ids or ())
    assert second.info["rewritten_reply"] is True and second.trace.prompt_source == "retokenized"
    shown = [rewrite_ids(tok, r, ctx.rewrite_reply) for r in replies[:2]]
    p1 = list(client.requests[0].prompt_token_ids or ())
    glue = stream[len(p1) + len(replies[0]) : len(stream) - len(replies[1])]  # the tool result, as inserted
    assert p3[: len(p1)] == p1
    expected = [*p1, *(shown[0] or []), *glue, *(shown[1] or [])]
    assert p3[: len(expected)] == expected
    assert tok.decode(p3).count("<think>...</think>") == 2 and "I should add" not in tok.decode(p3)
    # negative control: rendering the shown messages again re-tokenises the sampled answer
    old = renderer_for(tok).render_ids(list(client.requests[2].messages), tools=agent.tool_schemas)
    assert old != p3 and _per_piece(tok, "fi", "ve")[0] not in old[len(p1) :]
