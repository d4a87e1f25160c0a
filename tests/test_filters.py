"""Sample filters: step flags for cut completions, the shipped filters and how they combine,
and ``sample_filter=`` on ``RolloutBatchSource`` with every drop counted in ``batch.meta``."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from ludic_lab.agents import Agent
from ludic_lab.agents.base_agent import INCOMPLETE_FEEDBACK
from ludic_lab.context import FullDialog
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import MultiAgentProtocol, SingleAgentSyncProtocol
from ludic_lab.parsers import ParseResult
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.rollouts.batch_source import EmptyBatchError
from ludic_lab.rollouts.filters import (
    ItemFilter,
    any_of,
    apply_filter,
    as_filter,
    combine,
    drop_incomplete_completions,
    drop_parse_errors,
    drop_truncated,
    filter_items,
    keep_all,
    sample_meta,
)
from ludic_lab.rollouts.rollout_source import RolloutBatchSource
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.training.credit_assignment import ConstantCredit
from ludic_lab.types import Rollout, Step
from tests.helpers import CountingEnv, Reply, ScriptedChatClient, TurnGameEnv, chatml_template

SPEC = InferenceSpec(sampling=SamplingConfig(temperature=1.0, max_tokens=8), return_=ReturnSpec.for_training())


def strict_parser(text: str) -> ParseResult:
    if text == "bad":
        return ParseResult(action=None, reward=-0.5, obs="Use a single word.")
    return ParseResult(action=text, reward=0.0)


def item(**meta) -> SAWItem:
    return SAWItem(input_ids=(1, 2), action_mask=(0, 1), weights=(0.0, 1.0), behaviour_logprobs=(0.0, -0.1), meta=meta)


# -- the step records a completion cut at max_tokens ------------------------------------------


async def test_cut_completion_is_flagged_on_its_step():
    client = ScriptedChatClient([Reply("gue", finish_reason="length"), "win"], chat_template=chatml_template())
    agent = Agent(client, FullDialog(), strict_parser, reject_incomplete_completions=False)
    env = CountingEnv()
    [r] = await SingleAgentSyncProtocol(agent).run(env=env, max_steps=4)
    cut, done = r.steps
    assert env.actions == ["gue", "win"]  # the parser accepted the cut reply: the env saw it
    assert cut.info["incomplete_completion"] is True and cut.info["agent"]["finish_reason"] == "length"
    assert done.info["incomplete_completion"] is False and done.terminated


async def test_cut_completion_is_rejected_by_default_like_a_parse_error():
    # Ludic's default: the env never sees a reply cut at max_tokens; the step is a parse-error
    # step with the -0.1 penalty and the cut-off feedback, which the agent reads next turn
    client = ScriptedChatClient([Reply("win", finish_reason="length"), "win"], chat_template=chatml_template())
    agent = Agent(client, FullDialog(), strict_parser)
    env = CountingEnv()
    [r] = await SingleAgentSyncProtocol(agent).run(env=env, max_steps=4)
    cut, done = r.steps
    assert env.actions == ["win"] and done.terminated
    assert cut.info["parse_error"] and cut.info["incomplete_completion"] is True
    assert cut.reward == pytest.approx(-0.1) and cut.env_reward == 0.0 and cut.format_reward == pytest.approx(-0.1)
    assert cut.next_obs == INCOMPLETE_FEEDBACK and cut.parsed_action is None
    assert any(m["content"] == INCOMPLETE_FEEDBACK for m in client.requests[1].messages)


async def test_cut_completion_is_flagged_on_a_rejected_step_too():
    client = ScriptedChatClient([Reply("bad", finish_reason="length"), "win"], chat_template=chatml_template())
    [r] = await SingleAgentSyncProtocol(Agent(client, FullDialog(), strict_parser)).run(env=CountingEnv(), max_steps=4)
    assert r.steps[0].info["parse_error"] and r.steps[0].info["incomplete_completion"] is True


async def test_an_agent_rejecting_cut_completions_gives_a_flagged_penalised_step_the_filter_drops():
    client = ScriptedChatClient([Reply("wi", finish_reason="length"), "win"], chat_template=chatml_template())
    agent = Agent(
        client, FullDialog(), strict_parser, reject_incomplete_completions=True, incomplete_completion_penalty=-0.3
    )
    env = CountingEnv()
    [r] = await SingleAgentSyncProtocol(agent).run(env=env, max_steps=4)
    cut = r.steps[0]
    assert env.actions == ["win"] and cut.info["parse_error"] and cut.info["incomplete_completion"] is True
    assert cut.reward == pytest.approx(-0.3) and cut.env_reward == 0.0
    flagged = item(**sample_meta(r, cut))
    assert not drop_incomplete_completions(flagged) and not drop_parse_errors(flagged)


async def test_multi_agent_steps_carry_the_flag():
    tpl = chatml_template()
    agents = {  # the cut reply must reach the env here: reject_incomplete_completions=False
        a: Agent(
            ScriptedChatClient(s, chat_template=tpl), FullDialog(), strict_parser, reject_incomplete_completions=False
        )
        for a, s in {"A": [Reply("a1", finish_reason="length"), "win"], "B": ["b1"]}.items()
    }
    ra, rb = await MultiAgentProtocol(agents).run(env=TurnGameEnv(), max_steps=5)
    assert [s.info["incomplete_completion"] for s in ra.steps] == [True, False]
    assert rb.steps[0].info["incomplete_completion"] is False


# -- filters on items -------------------------------------------------------------------------


def test_shipped_filters_read_item_meta():
    clean, trunc, bad, cut = item(), item(truncated=True), item(parse_error=True), item(finish_reason="length")
    flagged = item(incomplete_completion=True)
    assert all(f(clean) for f in (keep_all, drop_truncated, drop_parse_errors, drop_incomplete_completions))
    assert not drop_truncated(trunc) and drop_truncated(bad)
    assert not drop_parse_errors(bad) and drop_parse_errors(cut)
    assert not drop_incomplete_completions(cut) and not drop_incomplete_completions(flagged)


def test_filters_combine_with_operators_lists_and_functions():
    its = [
        item(),
        item(truncated=True),
        item(parse_error=True),
        item(finish_reason="length"),
        item(truncated=True, parse_error=True),
    ]
    both = drop_truncated & drop_parse_errors
    assert [both(i) for i in its] == [True, False, False, True, False]
    listed = as_filter([drop_truncated, drop_parse_errors, drop_incomplete_completions])
    assert [listed(i) for i in its] == [True, False, False, False, False]
    assert combine(drop_truncated, drop_parse_errors, drop_incomplete_completions).name == listed.name
    either = drop_truncated | drop_parse_errors
    assert [either(i) for i in its] == [True, True, True, True, False]
    assert [(~drop_truncated)(i) for i in its] == [False, True, False, False, True]

    def short_enough(it: SAWItem) -> bool:  # a plain function composes too
        return len(it.input_ids) < 10

    mixed = short_enough & drop_truncated
    assert isinstance(mixed, ItemFilter) and mixed.name == "short_enough & drop_truncated"
    assert apply_filter(its, mixed) == [its[0], its[2], its[3]]
    assert any_of(drop_truncated)(its[0]) and combine()(its[1])


def test_filter_items_counts_each_drop_under_the_first_filter_that_rejected_it():
    its = [
        item(),
        item(truncated=True),
        item(parse_error=True),
        item(truncated=True, parse_error=True),
        item(finish_reason="length"),
    ]
    kept, dropped = filter_items(its, [drop_truncated, drop_parse_errors, drop_incomplete_completions])
    assert kept == [its[0]]
    assert dropped == {"drop_truncated": 2, "drop_parse_errors": 1, "drop_incomplete_completions": 1}
    assert sum(dropped.values()) + len(kept) == len(its)  # nothing disappears uncounted
    assert filter_items(its, None) == (its, {})
    kept, dropped = filter_items(its, lambda it: not it.meta)
    assert kept == [its[0]] and dropped == {"<lambda>": 4}
    with pytest.raises(TypeError, match="sample_filter must be"):
        as_filter("drop_truncated")  # type: ignore[arg-type]


def test_sample_meta_reads_the_step_and_its_episode():
    s0 = Step(
        index=0,
        prev_obs="o",
        action="a",
        parsed_action=None,
        next_obs="fb",
        reward=0.0,
        info={"parse_error": True, "agent": {"finish_reason": "length"}},
    )
    s1 = Step(
        index=1,
        prev_obs="fb",
        action="b",
        parsed_action="b",
        next_obs="o2",
        reward=0.0,
        truncated=True,
        info={"parse_error": False, "incomplete_completion": False},
    )
    r = Rollout(steps=(s0, s1))
    m0, m1 = sample_meta(r, s0), sample_meta(r, s1)
    # Ludic's keys: "truncated" is the step's own flag, the episode's is "episode_truncated"
    assert m0 == {
        "truncated": False,
        "terminated": False,
        "episode_truncated": True,
        "truncation_reason": "env",
        "step_truncated": False,
        "parse_error": True,
        "incomplete_completion": True,
        "finish_reason": "length",
    }
    assert m1["truncated"] and m1["step_truncated"] and m1["episode_truncated"]
    assert not m1["parse_error"] and not m1["incomplete_completion"]
    # drop_truncated drops the truncated step only; the episode's first step stays
    assert drop_truncated(item(**m0)) and not drop_truncated(item(**m1))
    by_limit = Rollout(steps=(s0, replace(s1, info={**s1.info, "truncation_reason": "max_steps"})))
    assert sample_meta(by_limit, s0)["truncation_reason"] == "max_steps"
    ended = Rollout(
        steps=(s0, Step(index=1, prev_obs="", action="", parsed_action="", next_obs="", reward=1.0, terminated=True))
    )
    assert sample_meta(ended, s0)["episode_truncated"] is False and sample_meta(ended, s0)["truncation_reason"] is None
    assert sample_meta(ended, ended.steps[1])["terminated"] is True


# -- RolloutBatchSource(sample_filter=...) ------------------------------------------------------

SCRIPTS = {  # env seed -> the agent's replies, turn by turn
    0: ["win"],  # clean, terminated
    1: ["bad", "win"],  # a parse error, then done
    2: [Reply("wi", finish_reason="length"), "win"],  # a cut completion (rejected: a parse error), then done
    3: ["guess", "guess"],  # truncated at max_steps=2: the second step is the truncated one
}


def _reply(request) -> Reply:
    seed = int(re.search(r"seed=(\d+)", request.messages[1]["content"]).group(1))
    turn = sum(1 for m in request.messages if m["role"] == "assistant")
    r = SCRIPTS[seed][turn]
    return r if isinstance(r, Reply) else Reply(r)


def _source(**kw) -> RolloutBatchSource:
    client = ScriptedChatClient(_reply, chat_template=chatml_template())
    engine = RolloutEngine(
        {"count": CountingEnv}, {"agent": lambda: SingleAgentSyncProtocol(Agent(client, FullDialog(), strict_parser))}
    )

    def reqs() -> list[RolloutRequest]:
        return [
            RolloutRequest(env=EnvSpec("count"), protocol=ProtocolSpec("agent"), env_seed=s, inference=SPEC)
            for s in SCRIPTS
        ]

    return RolloutBatchSource(engine, reqs, ConstantCredit(), max_steps=2, **kw)


async def test_items_carry_step_flags_without_a_filter():
    batch = await _source().next_batch()
    assert len(batch) == 7 and batch.meta["skipped/filtered_samples"] == 0
    flags = sorted(
        (it.meta["truncated"], it.meta["parse_error"], it.meta["incomplete_completion"]) for it in batch.items
    )
    assert flags.count((True, False, False)) == 1 and flags.count((False, True, False)) == 1
    assert flags.count((False, True, True)) == 1 and flags.count((False, False, False)) == 4
    assert sum(it.meta["episode_truncated"] for it in batch.items) == 2


async def test_rollout_batch_source_drops_and_counts_by_filter():
    src = _source(sample_filter=[drop_truncated, drop_parse_errors, drop_incomplete_completions])
    batch = await src.next_batch()
    m = batch.meta
    assert len(batch) == 4 and m["num_items"] == 4
    assert m["skipped/filtered_samples"] == 3
    assert m["skipped/filtered_samples/drop_truncated"] == 1  # the truncated step, not its whole episode
    assert m["skipped/filtered_samples/drop_parse_errors"] == 2  # the cut reply was rejected: a parse error
    assert m.get("skipped/filtered_samples/drop_incomplete_completions", 0) == 0
    assert not any(
        it.meta["truncated"] or it.meta["parse_error"] or it.meta["incomplete_completion"] for it in batch.items
    )
    assert len(src.last_rollouts) == 4  # the rollouts are all still there to look at
    assert m["parse_error_rate"] == pytest.approx(2 / 7) and m["incomplete_completion_rate"] == pytest.approx(1 / 7)


async def test_a_filter_that_drops_everything_is_an_empty_batch_error_with_reasons():
    src = _source(sample_filter=lambda it: False, max_attempts=2)
    with pytest.raises(EmptyBatchError) as ei:
        await src.next_batch()
    assert ei.value.reasons["filtered_samples"] == 14 and ei.value.reasons["filtered_samples/<lambda>"] == 14


def test_bad_sample_filter_is_refused_at_construction():
    with pytest.raises(TypeError, match="sample_filter"):
        _source(sample_filter=42)


async def test_offline_source_filters_saved_rollouts_once_and_reports_it(tmp_path):
    from ludic_lab.training.batching.offline_source import OfflineBatchSource
    from ludic_lab.types import save_rollouts

    src = _source()
    await src.next_batch()
    path = tmp_path / "rollouts.jsonl"
    save_rollouts(src.last_rollouts, path)
    offline = OfflineBatchSource(
        path,
        batch_size=10,
        shuffle=False,
        sample_filter=drop_truncated & drop_parse_errors & drop_incomplete_completions,
    )
    batch = offline.next_batch_sync()
    assert len(offline) == 4 and len(batch) == 4
    assert batch.meta["skipped/filtered_samples"] == 3 and batch.meta["skipped/filtered_samples/drop_truncated"] == 1
    assert all(not it.meta["truncated"] and not it.meta["parse_error"] for it in batch.items)
    with pytest.raises(EmptyBatchError, match="filtered_samples"):
        OfflineBatchSource(path, batch_size=2, sample_filter=lambda it: False)
