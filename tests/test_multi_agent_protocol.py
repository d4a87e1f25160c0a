"""MultiAgentProtocol: roles the env drives itself (bots), and what a rejected reply's
synthetic step records when the other players' moves reach that agent in the same round."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import pytest

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs import TicTacToeMultiAgentEnv, TicTacToeRewards, check_env
from ludic_lab.envs.env import LudicEnv
from ludic_lab.envs.tic_tac_toe import coord_to_index
from ludic_lab.interaction import MultiAgentProtocol
from ludic_lab.parsers import ParseResult
from ludic_lab.rollouts.saw import saw_items_from_rollouts
from ludic_lab.types import Info, StepOutcome
from tests.helpers import ScriptedChatClient, chatml_template

FEEDBACK = "Use a single word."


def strict_parser(text: str) -> ParseResult:
    if text == "bad":
        return ParseResult(action=None, reward=-0.5, obs=FEEDBACK)
    return ParseResult(action=text, reward=0.0)


def agent(script, name: str = "p") -> Agent:
    return Agent(ScriptedChatClient(script, chat_template=chatml_template()), FullDialog(), strict_parser, name=name)


class DuelEnv(LudicEnv[str, str, str]):
    """Simultaneous moves; every round every player hears every move ("round k: A=x, B=y").

    A move ``"win"`` ends the game: its maker gets +1 ("you won"), the others -1 ("you
    lost"). ``bots`` maps a role to ``round -> move``: the env plays those roles itself, and
    ``step`` takes actions for the roles it does not drive (a player whose reply was
    rejected may be missing: it sits the round out).
    """

    def __init__(self, bots: Mapping[str, Callable[[int], str]] | None = None) -> None:
        self.bots = dict(bots or {})
        self.received: list[dict[str, str]] = []
        self.round = 0
        self._done = True

    @property
    def agent_ids(self) -> list[str]:
        return ["A", "B"]

    @property
    def env_driven_agents(self) -> list[str]:
        return [a for a in self.agent_ids if a in self.bots]

    @property
    def active_agents(self) -> list[str]:
        return [] if self._done else list(self.agent_ids)

    def reset(self, seed: int | None = None) -> dict[str, tuple[str, Info]]:
        self.round, self._done, self.received = 0, False, []
        return {a: (f"duel (seed={seed}), you are {a}", {}) for a in self.agent_ids}

    def sample_action(self, agent_id: str, rng) -> str:
        return "win" if self.round >= 2 else "wait"

    def step(self, actions: Mapping[str, str]) -> dict[str, StepOutcome]:
        expected = {a for a in self.active_agents if a not in self.bots}
        if self._done or not set(actions) <= expected or (expected and not actions):
            raise ValueError(f"step expects actions for (some of) {sorted(expected)}, got {sorted(actions)}")
        self.received.append(dict(actions))
        moves = {**actions, **{b: fn(self.round) for b, fn in self.bots.items()}}
        self.round += 1
        winners = [a for a, m in moves.items() if m == "win"]
        if winners:
            self._done = True
            return {
                a: StepOutcome("you won" if a in winners else "you lost", 1.0 if a in winners else -1.0, False, True)
                for a in self.agent_ids
            }
        seen = f"round {self.round}: " + ", ".join(f"{a}={m}" for a, m in sorted(moves.items()))
        return {a: StepOutcome(seen, 0.0, False, False) for a in self.agent_ids}


# -- a rejected reply's synthetic step stays what the agent saw -------------------------------------


async def test_rejected_reply_keeps_its_feedback_and_the_rounds_outcome_follows_it():
    agents = {"A": agent(["bad", "win"]), "B": agent(["b1", "b2"])}
    env = DuelEnv()
    ra, rb = await MultiAgentProtocol(agents).run(env=env, max_steps=4)
    assert env.received == [{"B": "b1"}, {"A": "win", "B": "b2"}]
    rejected, seen, won = ra.steps
    # the synthetic step: the parser's feedback, the parser's reward, nothing from the env
    assert rejected.info["parse_error"] and rejected.next_obs == FEEDBACK
    assert rejected.reward == -0.5 and rejected.env_reward == 0.0 and not rejected.done
    assert "delivered" not in rejected.info
    # what B's move showed A that round: its own step, no action, no tokens
    assert seen.info["observation_only"] and seen.action == "" and seen.trace is None
    assert (seen.prev_obs, seen.next_obs, seen.reward) == (FEEDBACK, "round 1: B=b1", 0.0)
    assert won.prev_obs == "round 1: B=b1" and won.terminated and won.reward == 1.0
    assert [s.index for s in ra.steps] == [0, 1, 2] and ra.meta["num_parse_errors"] == 1
    # A's context got the feedback, then the round's news, before its second reply
    msgs = agents["A"].client.requests[1].messages
    assert [m["content"] for m in msgs[-3:]] == ["bad", FEEDBACK, "round 1: B=b1"]
    assert [s.next_obs for s in rb.steps] == ["round 1: B=b1", None]  # the episode ended: no next obs
    assert rb.steps[-1].info["final_obs"] == "you lost"
    json.dumps(ra.to_dict())


async def test_a_terminal_outcome_after_a_rejected_reply_is_its_own_step():
    agents = {"A": agent(["bad"]), "B": agent(["win"])}
    ra, rb = await MultiAgentProtocol(agents).run(env=DuelEnv(), max_steps=4)
    rejected, lost = ra.steps
    assert rejected.next_obs == FEEDBACK and rejected.reward == -0.5 and not rejected.done
    assert lost.info["observation_only"] and lost.terminated and lost.next_obs is None
    assert lost.info["final_obs"] == "you lost"
    assert lost.reward == lost.env_reward == -1.0 and lost.format_reward == 0.0
    assert ra.total_reward == -1.5  # the loss still counts for A's credit
    assert rb.steps[-1].terminated and rb.total_reward == 1.0
    items, counts = saw_items_from_rollouts([ra], {(ra.id, 0): 1.0, (ra.id, 1): 1.0})
    assert len(items) == 1 and items[0].step_index == 0  # the observation step is never trained on
    assert counts["steps_without_trace"] == 1  # ... and its absence is counted, not silent
    from ludic_lab.rollouts.batch_stats import rollout_stats

    assert rollout_stats([ra])["parse_error_rate"] == 1.0  # a rate over A's turns: it had one, rejected


# -- roles the env drives itself ------------------------------------------------------------------


def scripted_bot(*moves: str):
    def bot(game, rng) -> int:
        return next(i for i in map(coord_to_index, moves) if game.is_legal(i))

    return bot


async def test_one_agent_against_the_envs_own_bot():
    env = TicTacToeMultiAgentEnv(bots={"O": scripted_bot("A2", "B2", "C2")})
    assert env.env_driven_agents == ["O"]
    x = agent(["A1", "B1", "C1"], name="x")
    [rx] = await MultiAgentProtocol({"X": x}).run(env=env, max_steps=9, env_seed=3)
    assert [s.parsed_action for s in rx.steps] == ["A1", "B1", "C1"]
    assert rx.steps[-1].terminated and rx.steps[-1].info["result"] == "win" and rx.total_reward == 1.0
    assert "Opponent (O) played A2." in rx.steps[0].next_obs  # the bot's move reached the agent
    assert rx.steps[1].prev_obs == rx.steps[0].next_obs
    assert rx.meta["env_driven_agents"] == ["O"] and rx.meta["agents"] == ["X"]
    assert "bot playing O" in x.client.requests[0].messages[0]["content"]


async def test_the_bot_moving_first_and_winning_ends_the_agents_rollout():
    env = TicTacToeMultiAgentEnv(bots={"X": scripted_bot("A1", "B1", "C1")}, rewards=TicTacToeRewards(loss=-1.0))
    [ro] = await MultiAgentProtocol({"O": agent(["A3", "B3"])}).run(env=env, max_steps=9)
    assert len(ro.steps) == 2 and ro.steps[-1].terminated and ro.steps[-1].env_reward == -1.0
    assert ro.steps[0].prev_obs.startswith("Opponent (X) played A1.")
    assert ro.steps[-1].info["delivered"][-1]["info"]["result"] == "loss"


async def test_bot_rounds_count_toward_max_steps():
    env = TicTacToeMultiAgentEnv(bots={"O": "random"})
    [rx] = await MultiAgentProtocol({"X": agent(["A1", "B1"])}).run(env=env, max_steps=2, env_seed=0)
    assert len(rx.steps) == 1 and rx.steps[0].truncated and rx.steps[0].info["max_steps_reached"]


async def test_simultaneous_env_gets_only_the_agents_actions_and_moves_its_bot_itself():
    env = DuelEnv(bots={"B": lambda r: "win" if r == 2 else f"bot{r}"})
    [ra] = await MultiAgentProtocol({"A": agent(["a0", "a1", "a2"])}).run(env=env, max_steps=5)
    assert env.received == [{"A": "a0"}, {"A": "a1"}, {"A": "a2"}]
    assert [s.next_obs for s in ra.steps] == ["round 1: A=a0, B=bot0", "round 2: A=a1, B=bot1", None]
    assert ra.steps[-1].info["final_obs"] == "you lost"


async def test_a_rejected_reply_against_a_bot_does_not_step_the_env():
    env = DuelEnv(bots={"B": lambda r: "wait"})
    [ra] = await MultiAgentProtocol({"A": agent(["bad", "win"])}).run(env=env, max_steps=4)
    assert env.received == [{"A": "win"}] and ra.steps[0].info["parse_error"] and ra.steps[1].terminated


async def test_roles_must_be_split_between_agents_and_the_env():
    bot_env = TicTacToeMultiAgentEnv(bots={"O": "random"})
    with pytest.raises(ValueError, match="not expected \\['O'\\]"):  # the env drives O itself
        await MultiAgentProtocol({"X": agent([]), "O": agent([])}).run(env=bot_env, max_steps=2)
    with pytest.raises(ValueError, match="missing \\['X'\\]"):
        await MultiAgentProtocol({"O": agent([])}).run(env=bot_env, max_steps=2)
    with pytest.raises(ValueError, match="missing \\['O'\\]"):  # without bots every role needs an Agent
        await MultiAgentProtocol({"X": agent([])}).run(env=TicTacToeMultiAgentEnv(), max_steps=2)


def test_check_env_knows_env_driven_roles():
    assert check_env(DuelEnv(bots={"B": lambda r: "wait"})).num_steps == 3
    assert check_env(TicTacToeMultiAgentEnv(bots={"X": "minimax"})).num_steps > 0
    with pytest.raises(ValueError, match="one of 'X' or 'O'"):
        TicTacToeMultiAgentEnv(bots={"X": "random", "O": "random"})


async def test_external_tool_calls_reach_the_env_with_the_callers_role():
    from ludic_lab.agents import ToolAgent

    def peek(what: str) -> str:
        """Ask the referee.

        Args:
            what: The question.
        """
        raise AssertionError("external tools run in the env")

    class RefereeDuel(DuelEnv):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, str]] = []

        async def handle_tool_call(self, agent_id: str, name: str, arguments: dict) -> str:
            self.calls.append((agent_id, arguments["what"]))
            return f"{agent_id} may win now"

    call = '<tool_call>{"name": "peek", "arguments": {"what": "score"}}</tool_call>'
    a = ToolAgent(
        ScriptedChatClient([call, "win"], chat_template=chatml_template()),
        FullDialog(),
        strict_parser,
        external_tools=[peek],
    )
    env = RefereeDuel()
    ra, rb = await MultiAgentProtocol({"A": a, "B": agent(["b1"])}).run(env=env, max_steps=3)
    assert env.calls == [("A", "score")] and env.received == [{"A": "win", "B": "b1"}]
    rec = ra.steps[0].info["agent"]["tool_calls"][0]
    assert rec["content"] == "A may win now" and rec["error"] is None and ra.steps[0].terminated


def test_trace_collector_never_folds_into_a_rejected_step():
    from ludic_lab.interaction import TraceCollector
    from ludic_lab.types import Step

    c = TraceCollector(["A"])
    c.add(
        "A",
        Step(
            index=0,
            prev_obs="o",
            action="bad",
            parsed_action=None,
            next_obs=FEEDBACK,
            reward=-0.5,
            info={"parse_error": True},
            format_reward=-0.5,
        ),
    )
    assert c.deliver("A", StepOutcome(obs="B moved", reward=0.0, truncated=False, terminated=False))
    assert c.deliver("A", StepOutcome(obs="you lost", reward=-1.0, truncated=False, terminated=True))
    rejected, seen = c.steps("A")
    assert rejected.next_obs == FEEDBACK and rejected.reward == -0.5 and not rejected.done
    # a second outcome folds into the observation step, as into any step the agent did not act in since
    assert seen.index == 1 and seen.prev_obs == FEEDBACK and seen.next_obs is None and seen.terminated
    assert seen.info["final_obs"] == "you lost"
    assert seen.reward == -1.0 and [d["obs"] for d in seen.info["delivered"]] == ["B moved", "you lost"]


async def test_rollout_view_labels_an_observation_step_as_such():
    ra, _ = await MultiAgentProtocol({"A": agent(["bad"]), "B": agent(["win"])}).run(env=DuelEnv(), max_steps=3)
    h = ra._repr_html_()
    assert h.count("parse error") == 2  # step 0: its flag and its parsed action; step 1 is not one
    assert "observation only" in h and "(no action: not trained)" in h and "you lost" in h


async def test_env_driven_agents_may_be_a_plain_attribute():
    class Plain(DuelEnv):
        env_driven_agents = ()  # the base's default, shadowing DuelEnv's property

        def __init__(self) -> None:
            super().__init__(bots={"B": lambda r: "win"})
            self.env_driven_agents = ["B"]

    [ra] = await MultiAgentProtocol({"A": agent(["a0"])}).run(env=Plain(), max_steps=2)
    assert ra.steps[-1].next_obs is None and ra.steps[-1].info["final_obs"] == "you lost"
