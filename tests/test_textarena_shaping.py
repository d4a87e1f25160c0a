"""What gives a small model a learning signal in TextArena games (worked openings written as the
game writes them, a format penalty for a reply without a bracketed move), against the textarena package itself:
the reward trained on is still the game's own (replayed on a fresh ``textarena.make``), the
format reward is kept apart in ``Step.format_reward``, and the evaluation counts the game alone."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

pytest.importorskip("textarena")

import textarena as ta

from ludic_lab.aio import run_sync
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.integrations.textarena_env import TextArenaMultiEnv, legal_moves, player_id
from ludic_lab.integrations.textarena_shaping import EXAMPLE_SEED, move_format_parser, worked_openings
from ludic_lab.rollouts.credit import GroupNormalizedReturn
from ludic_lab.task.external.textarena import HELD_OUT_BASE, game_reward, textarena_task
from tests.helpers import ScriptedChatClient, chatml_template

pytestmark = pytest.mark.timeout(240)
STANDARD = "You are a competitive game player."


def _own_rewards(env_id: str, seed: int, moves: list[list[Any]]) -> dict[int, float]:
    """TextArena's own rewards for ``moves`` ([player, action] in order) from ``seed``."""
    env = ta.make(env_id)
    env.reset(num_players=2, seed=seed)
    for _, action in moves:
        done, _ = env.step(action)
    assert done
    rewards, _ = env.close()
    return {int(p): float(r) for p, r in rewards.items()}


def _first_legal(request: Any) -> str:
    return legal_moves(str(request.messages[-1]["content"]))[0]


def test_worked_openings_are_legal_moves_on_the_games_own_text() -> None:
    turns = worked_openings("TicTacToe-v0", 3, num_players=2)
    assert sum(m["role"] == "assistant" for m in turns) == 3 and turns[-1]["role"] == "assistant"
    # replaying the shown moves in a fresh game at the example seed shows the same text, and each
    # move was one the game listed just before it
    env = TextArenaMultiEnv("TicTacToe-v0", opponents={1: "random"})
    shown = [run_sync(env.reset(EXAMPLE_SEED))["player_0"][0]]
    user = []
    for m in turns:
        if m["role"] == "user":
            user.append(m["content"])
            continue
        assert user == shown and m["content"] in legal_moves(user[-1])
        shown, user = [], []
        out = run_sync(env.step({"player_0": m["content"]}))
        shown.append(out["player_0"].obs)
        while not env.game.done and env.active_agents != ["player_0"]:  # the random opponent moves
            out = run_sync(env.step({}))
            if "player_0" in out:
                shown.append(out["player_0"].obs)
    assert "Available Moves" in turns[0]["content"] and "Tic Tac Toe" in turns[0]["content"]
    with pytest.raises(ValueError, match="few_shot must be an int >= 0"):
        textarena_task("TicTacToe-v0", opponent="random", few_shot=-2)


def test_the_move_format_parser_passes_the_whole_reply_and_costs_a_reply_without_a_move() -> None:
    parse = move_format_parser(0.3)
    assert parse(" [4] ") == parse(" [4] ")
    assert (parse(" [4] ").action, parse(" [4] ").reward) == ("[4]", 0.0)
    prose = parse("I would put my mark in the middle of the board.")
    assert prose.action == "I would put my mark in the middle of the board." and prose.reward == -0.3
    assert move_format_parser()("[4]").reward == 0.0 and move_format_parser()("the middle").reward == 0.0


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), True, "0.1", None])
def test_a_format_reward_that_is_not_a_finite_number_at_least_0_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="format_reward must be a finite number >= 0"):
        textarena_task("TicTacToe-v0", opponent="random", format_reward=bad)
    with pytest.raises(ValueError, match="format_reward must be a finite number >= 0"):
        move_format_parser(bad)


@pytest.mark.parametrize("style", ["moves", "prose"])
def test_game_rewards_stay_textarenas_and_the_format_reward_is_apart(style: str) -> None:
    task = textarena_task("TicTacToe-v0", opponent="random", few_shot=2, format_reward=0.5, max_turns=9)
    examples = worked_openings("TicTacToe-v0", 2, num_players=2)

    def reply(req: Any) -> str:
        return _first_legal(req) if style == "moves" else "I will take the center, it is the best square."

    client = ScriptedChatClient(reply, chat_template=chatml_template())
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=8), ReturnSpec.for_training())
    rollouts = run_sync(task.engine(client).generate_rollouts(task.requests(per_step=3, inference=spec)(), max_steps=9))
    assert len(rollouts) == 3 and not any(r.failed for r in rollouts)
    for req in client.requests:  # every game starts after the worked openings
        assert req.messages[0]["content"].startswith(STANDARD)
        assert [dict(m) for m in req.messages[1 : 1 + len(examples)]] == examples
    for r in rollouts:
        acted = [s for s in r.steps if not s.info.get("observation_only")]
        assert all(s.format_reward == (0.0 if style == "moves" else -0.5) for s in acted)
        last = r.steps[-1].info
        own = _own_rewards("TicTacToe-v0", r.env_seed, last["moves"])
        assert game_reward(r) == sum(s.env_reward for s in r.steps) == own[0]
        assert r.total_reward == pytest.approx(own[0] + sum(s.format_reward for s in acted))
    stats = task.stats(rollouts)
    assert stats["textarena/move_format_rate"] == (1.0 if style == "moves" else 0.0)
    if style == "prose":  # the game judged the prose: invalid moves, lost
        assert stats["textarena/win_rate"] == 0.0 and stats["textarena/invalid_move_rate"] == 1.0
        assert stats["textarena/format_reward_mean"] == pytest.approx(-1.0)  # two replies in prose a game
    else:
        assert stats["textarena/format_reward_mean"] == 0.0

    # the held-out evaluation: the same worked openings, the game's reward alone
    held = ScriptedChatClient(reply, chat_template=chatml_template())
    metrics = run_sync(task.evaluate(held, games=3, max_tokens=8))
    assert all([dict(m) for m in q.messages[1 : 1 + len(examples)]] == examples for q in held.requests)
    env = TextArenaMultiEnv("TicTacToe-v0", opponents={1: "random"})  # the held-out games, replayed
    own_rewards = []
    for seed in range(HELD_OUT_BASE, HELD_OUT_BASE + 3):
        obs = run_sync(env.reset(seed))[player_id(0)][0]
        while not env.game.done:
            if env.active_agents == [player_id(0)]:
                move = legal_moves(obs)[0] if style == "moves" else "I will take the center, it is the best square."
                out = run_sync(env.step({player_id(0): move}))
            else:
                out = run_sync(env.step({}))
            if player_id(0) in out:
                obs = out[player_id(0)].obs
        own_rewards.append(env.game.reward(0))
    assert metrics["mean_reward"] == pytest.approx(sum(own_rewards) / 3)
    assert metrics["win_rate"] == sum(x >= 1 for x in own_rewards) / 3


def _preferring(cells: list[int]) -> Any:
    """An opponent taking the first free cell of ``cells``."""

    def opponent(obs: str) -> str:
        free = legal_moves(obs)
        return next(f"[{c}]" for c in cells if f"[{c}]" in free)

    return opponent


def _game(replies: list[str], format_reward: float) -> Any:
    """One real TicTacToe game from seat 0 with ``replies`` in order, against :func:`_preferring`."""
    task = textarena_task("TicTacToe-v0", opponent=_preferring([8, 6, 5, 7, 3]), format_reward=format_reward)
    client = ScriptedChatClient(list(replies), chat_template=chatml_template())
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=8), ReturnSpec.for_training())
    (rollout,) = run_sync(task.engine(client).generate_rollouts(task.requests(per_step=1, inference=spec)()))
    return rollout


def test_the_format_term_grows_with_malformed_replies_not_with_a_games_length() -> None:
    fast = _game(["[0]", "[1]", "[2]"], 0.1)  # the top row in 3 moves (the opponent takes 8, 6)
    slow = _game(["[0]", "[3]", "[1]", "[2]"], 0.1)  # the same row in 4 moves (8, 6, 5)
    slip = _game(["the corner", "[0]", "[1]", "[2]"], 0.1)  # the fast win after one reply in prose
    slips = _game(["the corner", "[0]", "top middle", "[1]", "[2]"], 0.1)
    lost = _game(["[3]", "[4]", "[0]", "[2]"], 0.1)  # the opponent takes 8, 6, 5, 7: the bottom row
    for r, moves, won in ((fast, 3, 1.0), (slow, 4, 1.0), (slip, 3, 1.0), (slips, 3, 1.0), (lost, 4, -1.0)):
        last = r.steps[-1].info  # the game ended on the agent's move, or on the opponent's after it
        own = _own_rewards("TicTacToe-v0", r.env_seed, last.get("moves") or last["delivered"][-1]["info"]["moves"])
        assert game_reward(r) == own[0] == won  # the game's own reward, replayed on textarena itself
        assert sum(s.info.get("mover") == 0 and not s.info.get("invalid_move") for s in r.steps) == moves
    terms = [sum(s.format_reward for s in r.steps) for r in (fast, slow, slip, slips, lost)]
    assert terms == pytest.approx([0.0, 0.0, -0.1, -0.2, 0.0])  # length does not count; each slip does
    assert fast.total_reward == slow.total_reward == 1.0 > slip.total_reward > slips.total_reward > lost.total_reward
    # group-normalised credit (GRPO's) now weighs the fast and the slow win alike
    group = [replace(r, group_id="g") for r in (fast, slow, slip, lost)]
    credit = GroupNormalizedReturn(normalize_adv=True).compute(group)
    weight = {r.id: credit[(r.id, r.steps[0].index)] for r in group}
    assert weight[fast.id] == pytest.approx(weight[slow.id]) and weight[fast.id] > weight[slip.id] > 0
    assert weight[lost.id] < 0
    # the task's per-batch metric is the mean format term per game
    assert textarena_task("TicTacToe-v0", opponent="random").stats([fast, slow, slip, slips])[
        "textarena/format_reward_mean"
    ] == pytest.approx(-0.3 / 4)
