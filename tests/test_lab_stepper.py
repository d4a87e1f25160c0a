"""RolloutStepper: one turn at a time, token-identical to SingleAgentSyncProtocol for the same
seeds (tiny model), re-runs with another config / seed / system prompt, clear errors, and the
ipywidgets panel driven headless."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import CountingEnv, ScriptedChatClient, chatml_template

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.inference.request import ChatCompletionRequest, InferenceSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.lab.stepper import RolloutStepper, Turn
from ludic_lab.parsers import ParseResult
from ludic_lab.types import Info, Rollout


class ReplayableEnv(CountingEnv):
    """CountingEnv whose observations depend on the episode alone (its step count restarts at
    reset), so the stepper can rewind it by replaying; ``total_steps`` counts every step."""

    def __init__(self) -> None:
        super().__init__()
        self.total_steps = 0

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self.step_calls = 0
        return super().env_reset(seed=seed)

    def env_step(self, action: str) -> Any:
        self.total_steps += 1
        return super().env_step(action)


def even_parser(text: str) -> ParseResult:
    """Accepts completions of even length (+0.1), rejects odd ones (-0.5, with feedback)."""
    if len(text) % 2 == 0:
        return ParseResult(text.strip(), 0.1, None)
    return ParseResult(None, -0.5, "Reply with an even number of characters.")


def assert_same_rollout(a: Rollout, b: Rollout) -> None:
    assert (a.agent_id, a.env_seed, a.sampling_seed, a.policy_version) == (
        b.agent_id,
        b.env_seed,
        b.sampling_seed,
        b.policy_version,
    )
    assert a.meta["end"] == b.meta["end"] and a.meta["num_parse_errors"] == b.meta["num_parse_errors"]
    assert a.meta["protocol"] == b.meta["protocol"] == "SingleAgentSyncProtocol"
    assert len(a.steps) == len(b.steps)
    for s, t in zip(a.steps, b.steps, strict=False):
        assert (s.index, s.prev_obs, s.action, s.parsed_action, s.next_obs) == (
            t.index,
            t.prev_obs,
            t.action,
            t.parsed_action,
            t.next_obs,
        )
        assert (s.reward, s.env_reward, s.format_reward, s.truncated, s.terminated) == (
            t.reward,
            t.env_reward,
            t.format_reward,
            t.truncated,
            t.terminated,
        )
        keys = ("parse_error", "max_steps_reached", "truncation_reason", "correct")
        assert {k: s.info.get(k) for k in keys} == {k: t.info.get(k) for k in keys}
        assert s.info["agent"]["sampling_seed"] == t.info["agent"]["sampling_seed"]
        assert s.trace.prompt_token_ids == t.trace.prompt_token_ids
        assert s.trace.completion_token_ids == t.trace.completion_token_ids
        assert s.trace.prompt_source == t.trace.prompt_source and s.trace.finish_reason == t.trace.finish_reason
        assert s.trace.completion_logprobs == pytest.approx(t.trace.completion_logprobs, abs=1e-4)


# -- against the protocol, with the tiny model ------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir: str) -> Any:
    from ludic_lab.inference.local.client import LocalChatClient

    return LocalChatClient(tiny_model_dir)


SPEC = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=7))


async def protocol_rollout(client: Any, sampling_seed: int) -> Rollout:
    agent = Agent(client, FullDialog(), even_parser, reject_incomplete_completions=False)  # 7-token replies: most cut
    [r] = await SingleAgentSyncProtocol(agent).run(
        env=ReplayableEnv(), max_steps=4, env_seed=3, sampling_seed=sampling_seed, inference=SPEC
    )
    return r


async def test_stepped_rollout_equals_the_protocols_token_for_token(tiny_client):
    # a sampling seed whose episode exercises both paths: parse errors and env steps
    for seed in range(11, 41):
        ref = await protocol_rollout(tiny_client, seed)
        if {bool(s.info.get("parse_error")) for s in ref.steps} == {True, False}:
            break
    else:
        pytest.fail("no seed in 11..40 gave both a parse error and an env step")

    st = RolloutStepper(
        ReplayableEnv(),
        Agent(tiny_client, FullDialog(), even_parser, reject_incomplete_completions=False),
        env_seed=3,
        sampling_seed=seed,
        inference=SPEC,
        max_steps=4,
    )
    turns = []
    while not st.done:
        turns.append(await st.step())
    r = st.to_rollout()
    assert_same_rollout(r, ref)
    assert r.steps[-1].truncated and r.steps[-1].info["max_steps_reached"]
    # what a turn shows
    t0 = turns[0]
    assert isinstance(t0, Turn) and t0.index == 0 and t0.attempt == 0
    assert [m["role"] for m in t0.prompt_messages] == ["system", "user"]
    assert (
        t0.prompt_messages[0]["content"] == "Guess the word."
        and t0.prompt_messages[1]["content"] == "Guess the secret word (seed=3)."
    )
    assert t0.completion == ref.steps[0].action and t0.reward == ref.steps[0].reward
    for t, s in zip(turns, ref.steps, strict=False):
        assert t.format_reward == s.format_reward and t.env_reward == s.env_reward and t.next_obs == s.next_obs
        assert t.parse_result.action == s.parsed_action
    html = t0._repr_html_()
    assert "turn 0" in html and "Guess the secret word (seed=3)." in html
    with pytest.raises(RuntimeError, match="episode is over"):
        await st.step()

    # re-running the first turn with another sampling seed replays the episode under it
    await st.rerun(turn=0, sampling_seed=seed + 100)
    r2 = await st.run()
    assert_same_rollout(r2, await protocol_rollout(tiny_client, seed + 100))
    assert r2.meta["stepper"]["reruns"] == 1 and len(st.discarded) == 4


# -- re-runs (scripted client: replies depend on the request's seed and temperature) --------------
def seeded_reply(req: ChatCompletionRequest) -> str:
    seed = req.sampling.seed
    return f"w{'-' if seed is None else seed % 1000} t{req.sampling.temperature:g}"


def make_stepper(**kw: Any) -> tuple[RolloutStepper, ReplayableEnv, ScriptedChatClient]:
    client = ScriptedChatClient(seeded_reply, chat_template=chatml_template())
    env = ReplayableEnv()
    agent = Agent(client, FullDialog(), lambda t: ParseResult(t, 0.0, None))
    args = {
        "env_seed": 5,
        "sampling_seed": 1,
        "sampling": SamplingConfig(temperature=0.7, max_tokens=16),
        "max_steps": 5,
        **kw,
    }
    return RolloutStepper(env, agent, **args), env, client


async def test_rerun_last_turn_same_seed_reproduces_new_seed_changes():
    st, env, _ = make_stepper()
    a0, a1 = await st.step(), await st.step()
    assert env.total_steps == 2
    again = await st.rerun()
    assert again.index == 1 and again.attempt == 1 and len(st.turns) == 2
    assert again.completion == a1.completion and again.act.trace == a1.act.trace
    assert env.total_steps == 2 + 1 + 1  # replayed turn 0, then the re-run turn
    other = await st.rerun(sampling_seed=99)
    assert other.completion != a1.completion and other.attempt == 2
    assert other.act.trace.prompt_token_ids == a1.act.trace.prompt_token_ids  # same history
    assert st.turns[0] is a0 and [t.completion for t in st.discarded] == [a1.completion, again.completion]
    assert env.actions[-1] == other.step.parsed_action


async def test_rerun_with_another_sampling_config_drops_later_turns():
    st, env, client = make_stepper()
    for _ in range(3):
        await st.step()
    t = await st.rerun(turn=1, sampling=SamplingConfig(temperature=0.2, max_tokens=8))
    assert len(st.turns) == 2 and t.index == 1 and t.sampling.temperature == 0.2
    assert client.requests[-1].sampling.temperature == 0.2 and client.requests[-1].sampling.max_tokens == 8
    assert t.completion.endswith("t0.2")
    nxt = await st.step()
    assert nxt.index == 2 and nxt.sampling.temperature == 0.2  # later turns keep the new config
    r = st.to_rollout()
    assert [s.index for s in r.steps] == [0, 1, 2] and r.meta["end"] == "stopped"
    assert r.steps[-1].truncated and r.steps[-1].info["truncation_reason"] == "stopped"
    assert r.meta["stepper"] == {"reruns": 1, "discarded_turns": 2}


async def test_a_new_system_prompt_restarts_from_the_first_turn():
    st, env, client = make_stepper()
    await st.step()
    await st.step()
    t = await st.rerun(system_prompt="Be brief.")
    assert t.index == 0 and len(st.turns) == 1 and st.system_prompt == "Be brief."
    assert t.prompt_messages[0] == {"role": "system", "content": "Be brief."}
    expected = chatml_template().render_ids(list(t.prompt_messages))
    assert list(t.act.trace.prompt_token_ids) == expected and t.act.trace.prompt_source == "fresh"
    # the same prompt again is not a change: only the last turn is re-run
    await st.step()
    t2 = await st.rerun(system_prompt="Be brief.")
    assert t2.index == 1


async def test_errors_are_clear():
    st, env, _ = make_stepper()
    with pytest.raises(RuntimeError, match="call step"):
        await st.rerun()
    with pytest.raises(RuntimeError, match="call step"):
        st.to_rollout()
    await st.step()
    with pytest.raises(ValueError, match="turn must be in 0..0"):
        await st.rerun(turn=3)
    with pytest.raises(TypeError, match="SamplingConfig"):
        await st.rerun(sampling={"temperature": 0.1})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly one agent"):
        from helpers import TurnGameEnv

        RolloutStepper(TurnGameEnv(), st.agent)


class DriftingEnv(CountingEnv):
    """Its first observation changes on every reset: it cannot be replayed."""

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        obs, info = super().env_reset(seed=seed)
        self._obs = f"{obs} #{len(self.reset_seeds)}"
        return self._obs, info


async def test_rewinding_a_non_deterministic_env_fails_loudly_and_reset_recovers():
    client = ScriptedChatClient(seeded_reply, chat_template=chatml_template())
    st = RolloutStepper(
        DriftingEnv(), Agent(client, FullDialog(), lambda t: ParseResult(t, 0.0, None)), env_seed=1, sampling_seed=1
    )
    await st.step()
    await st.step()
    with pytest.raises(RuntimeError, match="not deterministic"):
        await st.rerun()
    assert len(st.turns) == 2  # nothing lost
    with pytest.raises(RuntimeError, match="call reset"):
        await st.step()
    await st.reset()
    assert (await st.step()).index == 0
    # CountingEnv numbers its replies across episodes: the replayed turn 0 answers differently
    st = RolloutStepper(
        CountingEnv(), Agent(client, FullDialog(), lambda t: ParseResult(t, 0.0, None)), env_seed=1, sampling_seed=2
    )
    await st.step()
    await st.step()
    with pytest.raises(RuntimeError, match=r"diverged \(turn 0 gave another observation or reward\)"):
        await st.rerun()


def test_sync_twins_work_without_a_loop():
    st, _env, _ = make_stepper(max_steps=2)
    assert st.reset_sync().startswith("Guess the secret word (seed=5)")
    assert st.step_sync().index == 0
    assert st.rerun_sync(sampling_seed=3).index == 0
    r = st.run_to_end_sync()
    assert len(r.steps) == 2 and r.meta["end"] == "max_steps"


# -- the widget, headless -----------------------------------------------------------------------------
def test_widget_buttons_drive_the_stepper():
    pytest.importorskip("ipywidgets")
    st, env, client = make_stepper(max_steps=3)
    ui = st.widget()
    assert "not started" in ui.view.value
    ui.step_button.click()
    ui.wait(30)
    assert ui.last_error is None and len(st.turns) == 1
    assert "turn 0" in ui.view.value and st.turns[0].completion in ui.view.value
    ui.temperature.value = 0.3
    ui.seed.value = "77"
    ui.rerun_button.click()
    ui.wait(30)
    assert ui.last_error is None and st.turns[0].sampling.temperature == 0.3 and st.sampling_seed == 77
    assert st.turns[0].completion.endswith("t0.3")
    ui.system_prompt.value = "New rules."
    ui.step_button.click()  # a changed system prompt needs a re-run or a reset
    ui.wait(30)
    assert isinstance(ui.last_error, ValueError) and "system prompt changed" in ui.status.value
    ui.rerun_button.click()
    ui.wait(30)
    assert st.turns[0].prompt_messages[0]["content"] == "New rules." and len(st.turns) == 1
    ui.run_button.click()
    ui.wait(30)
    assert st.done and ui.step_button.disabled and "episode over" in ui.status.value
    ui.seed.value = "x"
    ui.reset_button.click()
    ui.wait(30)
    assert isinstance(ui.last_error, ValueError) and "seed must be an integer" in ui.status.value
    ui.seed.value = ""
    ui.reset_button.click()
    ui.wait(30)
    assert ui.last_error is None and st.turns == [] and st.sampling_seed is None
    assert "application/vnd.jupyter.widget-view+json" in ui._repr_mimebundle_()
