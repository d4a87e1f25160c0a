"""Interaction protocols: the single-agent loop, parse-error semantics, truncation,
failures carried by EpisodeError, and the multi-agent protocol with per-agent rollouts."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from helpers import CountingEnv, Reply, ScriptedChatClient, TurnGameEnv, chatml_template

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.interaction import (
    PARSE_ERROR_FEEDBACK,
    EpisodeError,
    InteractionProtocol,
    MultiAgentProtocol,
    SingleAgentSyncProtocol,
    TraceCollector,
)
from ludic_lab.parsers import ParseResult, identity_parser
from ludic_lab.types import Rollout, Step, StepOutcome


@pytest.fixture(scope="module")
def tpl():
    return chatml_template()


def strict_parser(text: str) -> ParseResult:
    """Rejects "bad" (penalty -0.5, with feedback) and "mute" (no feedback); else +0.1."""
    if text == "bad":
        return ParseResult(action=None, reward=-0.5, obs="Use a single word.")
    if text == "mute":
        return ParseResult(action=None, reward=-0.2)
    return ParseResult(action=text, reward=0.1)


def single(script, tpl, parser=strict_parser, **kw) -> SingleAgentSyncProtocol:
    agent = Agent(
        ScriptedChatClient(script, chat_template=tpl, policy_version=kw.pop("version", None)),
        FullDialog(),
        parser,
        system_prompt=kw.pop("system_prompt", None),
    )
    return SingleAgentSyncProtocol(agent, **kw)


# -- single agent ------------------------------------------------------------------------------


async def test_happy_path_rewards_and_fields(tpl):
    proto = single(["guess", "win"], tpl, version=4)
    env = CountingEnv()
    assert isinstance(proto, InteractionProtocol)
    [r] = await proto.run(env=env, max_steps=5, env_seed=11, sampling_seed=3)
    assert env.reset_seeds == [11] and env.step_calls == 2 and env.actions == ["guess", "win"]
    assert [s.index for s in r.steps] == [0, 1]
    s0, s1 = r.steps
    assert s0.prev_obs == "Guess the secret word (seed=11)." and s0.next_obs == "try again (1)"
    assert s0.env_reward == pytest.approx(-0.1) and s0.format_reward == pytest.approx(0.1)
    assert s0.reward == pytest.approx(0.0) and not s0.done
    assert s1.prev_obs == "try again (1)" and s1.terminated and not s1.truncated
    assert s1.reward == pytest.approx(1.1) and s1.parsed_action == "win"
    assert s1.info["correct"] is True and s1.info["parse_error"] is False
    assert s1.trace.prompt_source == "extended" and s0.trace.prompt_source == "fresh"
    assert (r.agent_id, r.env_seed, r.sampling_seed, r.policy_version) == ("agent_0", 11, 3, 4)
    assert r.meta["env"] == "CountingEnv" and r.meta["end"] == "terminated" and r.error is None
    # system prompt came from the env; the rollout survives a JSON round trip
    assert proto.agent.ctx.messages[0] == {"role": "system", "content": "Guess the word."}
    assert Rollout.from_json(r.to_json()) == r


async def test_agent_prompt_wins_over_env_suggestion(tpl):
    proto = single(["win"], tpl, system_prompt="Mine.")
    await proto.run(env=CountingEnv(), max_steps=1)
    assert proto.agent.ctx.messages[0]["content"] == "Mine."


async def test_parse_error_skips_env_and_feeds_feedback_back(tpl):
    proto = single(["bad", "mute", "win"], tpl)
    env = CountingEnv()
    [r] = await proto.run(env=env, max_steps=5)
    assert env.step_calls == 1 and env.actions == ["win"]  # env.step only for the parsed action
    s0, s1, s2 = r.steps
    assert s0.info["parse_error"] is True and s0.parsed_action is None and s0.action == "bad"
    assert (s0.reward, s0.format_reward, s0.env_reward) == (-0.5, -0.5, 0.0)
    assert s0.next_obs == "Use a single word." and not s0.done and s0.trace is not None
    assert s1.next_obs == PARSE_ERROR_FEEDBACK and s1.prev_obs == "Use a single word."
    assert s2.prev_obs == PARSE_ERROR_FEEDBACK and s2.terminated
    # the feedback went into the context, right after the rejected reply
    msgs = proto.agent.ctx.messages
    assert msgs[2:6] == [
        {"role": "assistant", "content": "bad"},
        {"role": "user", "content": "Use a single word."},
        {"role": "assistant", "content": "mute"},
        {"role": "user", "content": PARSE_ERROR_FEEDBACK},
    ]
    assert proto.agent.client.requests[1].messages[-1]["content"] == "Use a single word."
    assert r.meta["num_parse_errors"] == 2


async def test_stop_on_parse_error_ends_episode(tpl):
    proto = single(["bad", "win"], tpl, stop_on_parse_error=True)
    env = CountingEnv()
    [r] = await proto.run(env=env, max_steps=5)
    assert env.step_calls == 0 and len(r.steps) == 1
    assert r.steps[0].terminated and r.steps[0].info["terminated_by"] == "parse_error"
    assert r.meta["end"] == "parse_error"


async def test_max_steps_truncates_last_step(tpl):
    proto = single(["a", "b", "c", "d"], tpl)
    env = CountingEnv()
    [r] = await proto.run(env=env, max_steps=3)
    assert len(r.steps) == 3 and env.step_calls == 3
    assert [s.truncated for s in r.steps] == [False, False, True]
    assert not r.steps[-1].terminated
    assert r.steps[-1].info["max_steps_reached"] is True and r.steps[-1].info["truncation_reason"] == "max_steps"
    assert "max_steps_reached" not in r.steps[0].info and r.meta["end"] == "max_steps"
    # as in Ludic: the step that ends the episode has no next observation (kept in info)
    assert r.steps[-1].next_obs is None and r.steps[-1].info["final_obs"] == "try again (3)"
    assert r.steps[0].next_obs == "try again (1)" and "final_obs" not in r.steps[0].info


async def test_terminal_step_has_no_next_obs(tpl):
    [r] = await single(["guess", "win"], tpl).run(env=CountingEnv(), max_steps=5)
    assert r.steps[0].next_obs == "try again (1)" and r.steps[-1].terminated
    assert r.steps[-1].next_obs is None and isinstance(r.steps[-1].info["final_obs"], str)


async def test_max_steps_on_a_parse_error_step(tpl):
    proto = single(["a", "bad"], tpl)
    [r] = await proto.run(env=CountingEnv(), max_steps=2)
    last = r.steps[-1]
    assert last.info["parse_error"] and last.truncated and last.info["max_steps_reached"]
    assert last.next_obs == "Use a single word."


async def test_terminal_step_is_not_marked_truncated(tpl):
    proto = single(["x", "win"], tpl)
    [r] = await proto.run(env=CountingEnv(), max_steps=2)
    assert r.steps[-1].terminated and not r.steps[-1].truncated
    assert "max_steps_reached" not in r.steps[-1].info


async def test_env_error_mid_episode_raises_episode_error_with_partial_steps(tpl):
    proto = single(["guess", "boom", "win"], tpl)
    env = CountingEnv()
    with pytest.raises(EpisodeError) as ei:
        await proto.run(env=env, max_steps=5, env_seed=2)
    err = ei.value
    assert err.phase == "env.step" and isinstance(err.__cause__, ValueError)
    r = err.rollout
    assert len(r.steps) == 1 and r.steps[0].parsed_action == "guess"
    assert r.failed and r.error.startswith("env.step: ValueError: env exploded") and r.env_seed == 2
    assert "after 1 step(s)" in str(err)


async def test_env_reset_error_is_an_episode_error(tpl):
    proto = single(["win"], tpl)
    with pytest.raises(EpisodeError) as ei:
        await proto.run(env=CountingEnv(reset_raises=True), max_steps=2)
    assert ei.value.phase == "env.reset" and ei.value.rollout.steps == ()
    assert isinstance(ei.value.__cause__, OSError)


async def test_client_error_is_an_episode_error_with_steps_so_far(tpl):
    proto = single(["guess", Reply(error=ConnectionError("vllm died"))], tpl)
    with pytest.raises(EpisodeError) as ei:
        await proto.run(env=CountingEnv(), max_steps=5)
    assert ei.value.phase == "agent.act" and len(ei.value.rollout.steps) == 1
    assert "ConnectionError: vllm died" in ei.value.rollout.error


async def test_timeout_is_an_episode_error_not_a_hang(tpl):
    proto = single(["guess", Reply("win", delay_s=5.0)], tpl)
    with pytest.raises(EpisodeError) as ei:
        await asyncio.wait_for(proto.run(env=CountingEnv(), max_steps=5, timeout_s=0.2), 3.0)
    assert ei.value.phase == "timeout" and len(ei.value.rollout.steps) == 1


async def test_an_episode_cancelled_as_its_agent_replies_stops(tpl):
    """With a deadline, cancelling the episode while the agent is returning its reply stops
    the episode (it must not run on to its end with the cancellation lost)."""
    proto = single(["guess", "guess", "win"], tpl)
    act = proto.agent.act

    async def act_then_cancelled(*a, **kw):
        out = await act(*a, **kw)
        episode.cancel()
        return out

    proto.agent.act = act_then_cancelled
    episode = asyncio.create_task(proto.run(env=CountingEnv(), max_steps=5, timeout_s=30.0))
    with pytest.raises(asyncio.CancelledError):
        await episode


async def test_bad_arguments_are_rejected(tpl):
    proto = single(["x"], tpl)
    with pytest.raises(ValueError, match="max_steps"):
        await proto.run(env=CountingEnv(), max_steps=0)
    with pytest.raises(ValueError, match="MultiAgentProtocol"):
        await proto.run(env=TurnGameEnv(), max_steps=2)
    with pytest.raises(ValueError, match="timeout_s"):
        await proto.run(env=CountingEnv(), max_steps=1, timeout_s=0)
    with pytest.raises(TypeError):
        SingleAgentSyncProtocol(object())  # type: ignore[arg-type]


async def test_sampling_seed_makes_rollouts_reproducible_and_siblings_differ(tpl):
    async def request_seeds(seed):
        proto = single(["a", "b", "win"], tpl)
        await proto.run(env=CountingEnv(), max_steps=5, sampling_seed=seed)
        return [q.sampling.seed for q in proto.agent.client.requests]

    assert await request_seeds(1) == await request_seeds(1)
    assert await request_seeds(1) != await request_seeds(2)


async def test_policy_version_is_oldest_known(tpl):
    versions = iter([5, 3, 7])

    class Drifting(ScriptedChatClient):
        async def complete(self, request):
            self.policy_version = next(versions)
            return await super().complete(request)

    agent = Agent(Drifting(["a", "b", "win"], chat_template=tpl), FullDialog(), identity_parser)
    [r] = await SingleAgentSyncProtocol(agent).run(env=CountingEnv(), max_steps=5)
    assert [s.trace.policy_version for s in r.steps] == [5, 3, 7] and r.policy_version == 3
    [r2] = await single(["win"], None).run(env=CountingEnv(), max_steps=1)
    assert r2.policy_version is None and r2.steps[0].trace is None


async def test_env_info_keys_do_not_clobber_protocol_keys(tpl):
    class Noisy(CountingEnv):
        def env_step(self, action):
            out = super().env_step(action)
            return StepOutcome(out.obs, out.reward, out.truncated, out.terminated, {"parse_error": "env's"})

    [r] = await single(["win"], tpl).run(env=Noisy(), max_steps=1)
    assert r.steps[0].info["parse_error"] is False and r.steps[0].info["env_parse_error"] == "env's"


async def test_env_ending_without_terminal_outcome_truncates(tpl):
    class Quitter(CountingEnv):
        def env_step(self, action):
            out = super().env_step(action)
            if action == "quit":
                self._done = True  # the agent is no longer active, yet no terminal outcome
            return out

    [r] = await single(["quit", "never sent"], tpl).run(env=Quitter(), max_steps=5)
    assert len(r.steps) == 1 and r.steps[0].truncated and not r.steps[0].terminated
    assert r.steps[0].info["truncation_reason"] == "agent_inactive" and "max_steps_reached" not in r.steps[0].info


async def test_async_env_methods_are_awaited(tpl):
    class AsyncEnv(CountingEnv):
        async def reset(self, seed=None):  # type: ignore[override]
            await asyncio.sleep(0)
            return CountingEnv.reset(self, seed)

        async def step(self, actions):  # type: ignore[override]
            await asyncio.sleep(0)
            return CountingEnv.step(self, actions)

    env = AsyncEnv()
    [r] = await single(["x", "win"], tpl).run(env=env, max_steps=5, env_seed=1)
    assert env.step_calls == 2 and r.steps[-1].terminated and env.reset_seeds == [1]


# -- multi agent -------------------------------------------------------------------------------


def players(scripts: dict, tpl, parser=strict_parser) -> dict:
    return {
        a: Agent(ScriptedChatClient(s, chat_template=tpl), FullDialog(), parser, name=f"p{a}")
        for a, s in scripts.items()
    }


async def test_turn_game_terminal_reward_reaches_the_non_mover(tpl):
    agents = players({"A": ["a1", "win"], "B": ["b1"]}, tpl)
    env = TurnGameEnv()
    ra, rb = await MultiAgentProtocol(agents).run(env=env, max_steps=10, env_seed=4, sampling_seed=9)
    assert (ra.agent_id, rb.agent_id) == ("A", "B")
    assert env.step_actions == [{"A": "a1"}, {"B": "b1"}, {"A": "win"}]
    assert [s.index for s in ra.steps] == [0, 1] and [s.index for s in rb.steps] == [0]
    assert ra.steps[-1].terminated and ra.steps[-1].reward == pytest.approx(1.1)
    lost = rb.steps[-1]
    assert lost.terminated and lost.next_obs is None and lost.info["final_obs"] == "you lost"
    assert lost.env_reward == pytest.approx(-1.0) and lost.reward == pytest.approx(-0.9)
    assert lost.info["delivered"][-1]["reward"] == -1.0 and lost.info["delivered"][-1]["info"] == {"winner": "A"}
    assert ra.meta["episode_id"] == rb.meta["episode_id"] and ra.env_seed == rb.env_seed == 4
    assert ra.meta["agent_sampling_seed"] != rb.meta["agent_sampling_seed"]
    # B saw A's move before acting, and used its own system prompt from the env
    b_msgs = agents["B"].client.requests[0].messages
    assert b_msgs[0]["content"] == "You are player B." and b_msgs[-1]["content"] == "A played a1, your turn"
    assert rb.steps[0].prev_obs == "A played a1, your turn"
    assert all(not s.truncated for s in ra.steps + rb.steps)


async def test_trained_agents_filter_rollouts(tpl):
    agents = players({"A": ["win"], "B": []}, tpl)
    rollouts = await MultiAgentProtocol(agents, trained_agents=["A"]).run(env=TurnGameEnv(), max_steps=4)
    assert [r.agent_id for r in rollouts] == ["A"]


async def test_outcome_for_agent_without_steps_is_reported_not_lost(tpl):
    agents = players({"A": ["win"], "B": []}, tpl)
    rollouts = await MultiAgentProtocol(agents).run(env=TurnGameEnv(), max_steps=4)
    assert [r.agent_id for r in rollouts] == ["A"]
    assert rollouts[0].meta["unattached_rewards"] == {"B": -1.0}


async def test_all_agents_failing_to_parse_never_steps_env_and_terminates(tpl):
    agents = players({"A": ["bad"] * 3, "B": ["mute"] * 3}, tpl)
    env = TurnGameEnv(simultaneous=True)
    ra, rb = await asyncio.wait_for(MultiAgentProtocol(agents).run(env=env, max_steps=3), 5.0)
    assert env.step_calls == 0
    for r, fb in ((ra, "Use a single word."), (rb, PARSE_ERROR_FEEDBACK)):
        assert len(r.steps) == 3 and all(s.info["parse_error"] for s in r.steps)
        assert r.steps[-1].truncated and r.steps[-1].info["max_steps_reached"]
        assert r.steps[-1].next_obs == fb and r.meta["num_parse_errors"] == 3
    assert agents["A"].ctx.messages[-1] == {"role": "user", "content": "Use a single word."}


async def test_partial_parse_failure_leaves_agent_out_of_env_step(tpl):
    agents = players({"A": ["bad", "win"], "B": ["b1", "b2"]}, tpl)
    env = TurnGameEnv(simultaneous=True)
    ra, rb = await MultiAgentProtocol(agents).run(env=env, max_steps=5)
    assert env.step_actions == [{"B": "b1"}, {"A": "win", "B": "b2"}]
    assert ra.steps[0].info["parse_error"] and ra.steps[1].terminated
    assert rb.steps[1].terminated and rb.steps[1].env_reward == -1.0  # win checked first: B lost


async def test_turn_based_parse_failure_keeps_same_player_to_move(tpl):
    agents = players({"A": ["bad", "win"], "B": []}, tpl)
    env = TurnGameEnv()
    (ra,) = await MultiAgentProtocol(agents, trained_agents=["A"]).run(env=env, max_steps=5)
    assert env.step_actions == [{"A": "win"}] and len(ra.steps) == 2


async def test_active_agents_act_concurrently(tpl):
    in_flight = {"n": 0}
    both = asyncio.Event()

    class Barrier(ScriptedChatClient):
        async def complete(self, request):
            in_flight["n"] += 1
            if in_flight["n"] == 2:
                both.set()
            await asyncio.wait_for(both.wait(), 2.0)  # sequential acting would time out here
            return await super().complete(request)

    agents = {a: Agent(Barrier(["win"], chat_template=tpl), FullDialog(), identity_parser) for a in "AB"}
    rollouts = await MultiAgentProtocol(agents).run(env=TurnGameEnv(simultaneous=True), max_steps=2)
    assert len(rollouts) == 2 and both.is_set()


async def test_multi_agent_max_steps_truncates_every_open_trajectory(tpl):
    agents = players({"A": ["a1", "a2"], "B": ["b1", "b2"]}, tpl)
    ra, rb = await MultiAgentProtocol(agents).run(env=TurnGameEnv(), max_steps=3)
    assert len(ra.steps) == 2 and len(rb.steps) == 1
    assert ra.steps[-1].truncated and rb.steps[-1].truncated
    assert rb.steps[-1].info["truncation_reason"] == "max_steps" and not ra.steps[0].truncated


async def test_multi_agent_env_error_carries_partial_rollouts(tpl):
    agents = players({"A": ["a1", "boom"], "B": ["b1"]}, tpl)
    with pytest.raises(EpisodeError) as ei:
        await MultiAgentProtocol(agents).run(env=TurnGameEnv(), max_steps=5)
    err = ei.value
    assert err.phase == "env.step" and [r.agent_id for r in err.rollouts] == ["A", "B"]
    assert [len(r.steps) for r in err.rollouts] == [1, 1]
    assert all(r.error and "broke the game" in r.error for r in err.rollouts)


async def test_multi_agent_client_error_names_the_agent(tpl):
    agents = players({"A": [Reply(error=RuntimeError("oom"))], "B": ["b"]}, tpl)
    with pytest.raises(EpisodeError) as ei:
        await MultiAgentProtocol(agents).run(env=TurnGameEnv(simultaneous=True), max_steps=2)
    assert ei.value.phase == "agent.act[A]"


def test_multi_agent_constructor_validation(tpl):
    a = Agent(ScriptedChatClient([], chat_template=tpl), FullDialog(), identity_parser)
    with pytest.raises(ValueError, match="own Agent"):
        MultiAgentProtocol({"A": a, "B": a})
    with pytest.raises(ValueError, match="trained_agents"):
        MultiAgentProtocol(players({"A": [], "B": []}, tpl), trained_agents=["C"])
    with pytest.raises(ValueError, match="at least one"):
        MultiAgentProtocol({})


async def test_multi_agent_roles_must_match_env(tpl):
    with pytest.raises(ValueError, match="missing \\['B'\\]"):
        await MultiAgentProtocol(players({"A": []}, tpl)).run(env=TurnGameEnv(), max_steps=2)


def test_trace_collector_indexes_delivers_and_extracts():
    c = TraceCollector(["A", "B"], meta={"episode_id": "e"})
    s = Step(index=7, prev_obs="o", action="x", parsed_action="x", next_obs="n", reward=0.5)
    assert c.add("A", s).index == 0 and c.add("A", s).index == 1
    assert c.deliver("A", StepOutcome(obs="end", reward=2.0, truncated=False, terminated=True))
    last = c.last("A")
    assert last.reward == 2.5 and last.env_reward == 2.0 and last.terminated and last.next_obs is None
    assert last.info["final_obs"] == "end"  # the episode ended: Ludic's next_obs None, the obs kept in info
    assert not c.deliver("B", StepOutcome(obs="end", reward=-1.0, truncated=False, terminated=True))
    [ra] = c.rollouts(env_seed=3)
    assert ra.agent_id == "A" and ra.meta["episode_id"] == "e" and ra.meta["unattached_rewards"] == {"B": -1.0}
    assert len(c.rollouts(keep_empty=True)) == 2
    with pytest.raises(KeyError, match="unknown agent"):
        c.add("Z", s)
    json.dumps(ra.to_dict())


# -- integration with the in-process model client (tiny random model) ------------------------


@pytest.fixture(scope="module")
def tiny_client(request, tmp_path_factory):
    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.inference.models import tiny_model_path

    try:
        path = request.getfixturevalue("tiny_model_dir")
    except pytest.FixtureLookupError:  # conftest fixture not available: build it here
        path = tiny_model_path(tmp_path_factory.mktemp("tiny-cache"))
    return LocalChatClient(str(path))


async def test_local_client_multi_turn_is_token_exact_and_reproducible(tiny_client):
    from ludic_lab.inference.request import InferenceSpec, SamplingConfig

    spec = InferenceSpec(sampling=SamplingConfig(temperature=1.0, max_tokens=6))

    async def episode(seed):
        agent = Agent(tiny_client, FullDialog(), identity_parser)
        [r] = await SingleAgentSyncProtocol(agent).run(
            env=CountingEnv(), max_steps=3, env_seed=0, sampling_seed=seed, inference=spec
        )
        return r, agent

    r, agent = await episode(5)
    tpl = tiny_client.chat_template
    assert len(r.steps) == 3 and r.steps[-1].truncated
    assert [s.trace.prompt_source for s in r.steps] == ["fresh", "extended", "extended"]
    assert list(r.steps[0].trace.prompt_token_ids) == tpl.render_ids(
        [
            {"role": "system", "content": "Guess the word."},
            {"role": "user", "content": "Guess the secret word (seed=0)."},
        ]
    )
    for prev, cur in itertools.pairwise(r.steps):
        n = len(prev.trace.input_ids)
        assert cur.trace.prompt_token_ids[:n] == prev.trace.input_ids
        assert tpl.decode(cur.trace.prompt_token_ids[n:]).strip().startswith("user")
        assert len(cur.trace.completion_logprobs) == len(cur.trace.completion_token_ids) > 0
    assert r.policy_version == tiny_client.policy_version
    again, _ = await episode(5)
    other, _ = await episode(6)
    ids = lambda ro: [s.trace.completion_token_ids for s in ro.steps]  # noqa: E731
    assert ids(again) == ids(r)
    assert ids(other) != ids(r)
    assert Rollout.from_json(r.to_json()) == r  # client diagnostics in step info stay JSON-ready


async def test_local_client_serves_concurrent_players(tiny_client):
    from ludic_lab.inference.request import InferenceSpec, SamplingConfig

    agents = {a: Agent(tiny_client, FullDialog(), identity_parser) for a in "AB"}
    spec = InferenceSpec(sampling=SamplingConfig(max_tokens=4))
    ra, rb = await MultiAgentProtocol(agents).run(
        env=TurnGameEnv(simultaneous=True), max_steps=2, sampling_seed=1, inference=spec
    )
    assert len(ra.steps) == len(rb.steps) == 2
    assert ra.steps[0].trace.completion_token_ids != rb.steps[0].trace.completion_token_ids
    assert rb.steps[1].trace.prompt_source == "extended"


async def test_tic_tac_toe_multi_agent_env_end_to_end(tpl):
    from ludic_lab.envs.tic_tac_toe import TicTacToeMultiAgentEnv

    env = TicTacToeMultiAgentEnv()
    parser = TicTacToeMultiAgentEnv.recommended_parser()
    agents = {
        "X": Agent(
            ScriptedChatClient(["<move>A1</move>", "<move>B1</move>", "<move>C1</move>"], chat_template=tpl),
            FullDialog(),
            parser,
        ),
        "O": Agent(
            ScriptedChatClient(["hi", "<move>A2</move>", "<move>B2</move>"], chat_template=tpl), FullDialog(), parser
        ),
    }
    rx, ro = await MultiAgentProtocol(agents).run(env=env, max_steps=20, env_seed=0)
    assert [s.parsed_action for s in rx.steps] == ["A1", "B1", "C1"]
    assert rx.steps[-1].terminated and rx.steps[-1].reward == 1.0 and rx.steps[-1].info["result"] == "win"
    assert [s.parsed_action for s in ro.steps] == [None, "A2", "B2"]
    assert ro.steps[0].info["parse_error"] and ro.steps[0].reward == -1.0
    assert ro.steps[-1].terminated and ro.steps[-1].info["delivered"][-1]["info"]["result"] == "loss"
    # O's second prompt shows the format feedback; its first prompt showed X's move
    o_reqs = agents["O"].client.requests
    assert "Opponent (X) played A1" in o_reqs[0].messages[-1]["content"]
    assert o_reqs[1].messages[-1]["content"].startswith("Format error")
