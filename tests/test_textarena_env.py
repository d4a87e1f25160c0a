"""TextArena games as ludic_lab envs and tasks, against the textarena package itself.

Every reward is checked against TextArena played directly: the moves an episode recorded are
replayed on a fresh ``textarena.make(env_id)`` with the same seed, and the game's own rewards
must equal what the rollout got. Invalid moves go to the game, which warns once and then ends
the game (``error_allowance``). Games that cannot run offline are refused with the reason.
Episodes run with the tiny model: a single-player game, a two-player game against a fixed
opponent (a random-move bot, a ChatClient) and in self-play; one training step; evaluation.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import pytest

pytest.importorskip("textarena")

import textarena as ta

from ludic_lab.aio import run_sync
from ludic_lab.envs import check_env
from ludic_lab.inference import InferenceSpec, LocalChatClient, ReturnSpec, SamplingConfig
from ludic_lab.integrations.textarena_env import (
    TextArenaEnv,
    TextArenaGameError,
    TextArenaMultiEnv,
    chat_opponent,
    game_players,
    game_unavailable_reason,
    legal_moves,
)
from ludic_lab.task.external.textarena import (
    HELD_OUT_BASE,
    TRAIN_SEEDS,
    evaluate_textarena,
    game_reward,
    textarena_task,
)
from ludic_lab.types import Rollout

pytestmark = pytest.mark.timeout(240)


def textarena_rewards(env_id: str, num_players: int, seed: int, moves: list[list[Any]]) -> dict[int, float]:
    """TextArena's own rewards for ``moves`` ([player, action] in order) from ``seed``."""
    env = ta.make(env_id)
    env.reset(num_players=num_players, seed=seed)
    for player, action in moves:
        assert env.state.current_player_id == player
        done, _ = env.step(action)
    assert done, "the recorded moves end the game"
    rewards, _ = env.close()
    return {int(p): float(r) for p, r in rewards.items()}


def end_info(rollout: Rollout) -> dict[str, Any] | None:
    """The game-over info of a rollout: on its last step, or in an outcome folded into it."""
    for s in reversed(rollout.steps):
        if "moves" in s.info:
            return s.info
        for d in reversed(s.info.get("delivered", [])):
            if "moves" in d["info"]:
                return d["info"]
    return None


def assert_textarena_scored(env_id: str, num_players: int, rollouts: list[Rollout]) -> int:
    """Each finished rollout's reward is TextArena's for its player; returns how many finished."""
    finished = 0
    for r in rollouts:
        assert not r.failed, r.error
        info = end_info(r)
        if info is None:  # cut by the turn limit: TextArena gave no reward
            assert game_reward(r) == 0.0
            continue
        finished += 1
        own = textarena_rewards(env_id, num_players, r.env_seed, info["moves"])
        assert game_reward(r) == r.total_reward == own[info["player"]]
        assert {int(p): v for p, v in info["rewards"].items()} == own
    return finished


def episodes(task: Any, client: Any, n: int, max_tokens: int = 8, seed: int = 0) -> list[Rollout]:
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=max_tokens), ReturnSpec.for_training())
    return run_sync(task.engine(client).generate_rollouts(task.requests(per_step=n, seed=seed, inference=spec)()))


# -- which games run here -------------------------------------------------------------------------


def test_games_that_cannot_run_offline_are_refused_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    if game_unavailable_reason("Wordle-v0") is not None:  # nltk's words corpus is not installed here
        with pytest.raises(TextArenaGameError, match=r"'Wordle-v0' cannot run here: it needs the nltk data .*'words'"):
            TextArenaEnv("Wordle-v0")
        assert "textarena.envs.Wordle.env" not in sys.modules  # refused before its import could try the network
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    with pytest.raises(TextArenaGameError, match=r"'GuessWho-v0' .*OpenRouter.*OPENROUTER_API_KEY"):
        TextArenaEnv("GuessWho-v0")
    if sys.version_info < (3, 12):  # an f-string only Python 3.12 parses
        with pytest.raises(TextArenaGameError, match=r"'Chess-v0' .*does not compile on Python 3\.1"):
            TextArenaMultiEnv("Chess-v0", num_players=2)
    with pytest.raises(TextArenaGameError, match=r"'UsedCarNegotiation-v0' .*FileNotFoundError"):
        TextArenaMultiEnv("UsedCarNegotiation-v0", num_players=2)
    with pytest.raises(ValueError, match=r"unknown TextArena game 'TicTacToe-v9'; did you mean 'TicTacToe-v0'"):
        textarena_task("TicTacToe-v9")
    with pytest.raises(TextArenaGameError, match=r"not a 1-player game .*TextArenaMultiEnv"):
        TextArenaEnv("TicTacToe-v0").reset(seed=0)
    with pytest.raises(TextArenaGameError, match="single-player game: use TextArenaEnv"):
        TextArenaMultiEnv("GuessTheNumber-v0")
    assert (game_players("GuessTheNumber-v0"), game_players("TicTacToe-v0")) == (1, 2)


def test_a_missing_package_is_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    from ludic_lab.extras import MissingExtraError

    monkeypatch.setitem(sys.modules, "textarena", None)  # what Python sees when it is not installed
    with pytest.raises(MissingExtraError, match=r"'textarena' extra .*pip install"):
        TextArenaEnv("TicTacToe-v0")


# -- the game's own rules, rewards and invalid moves -----------------------------------------------


def test_the_envs_pass_check_env() -> None:
    check_env(TextArenaEnv("GuessTheNumber-v0"))
    check_env(TextArenaEnv("TowerOfHanoi-v0"))
    check_env(TextArenaMultiEnv("TicTacToe-v0"))
    check_env(TextArenaMultiEnv("TicTacToe-v0", opponents={0: "random"}))


def test_single_player_moves_and_invalid_moves_are_the_games_own() -> None:
    env = TextArenaEnv("GuessTheNumber-v0")
    obs, _ = env.reset(seed=7)["agent_0"]
    assert obs.startswith("[GAME] You are Player 0. You are playing Guess The Number.")
    out = env.step({"agent_0": "[10]"})["agent_0"]
    assert out.obs in ("[GAME] The target number is higher.", "[GAME] The target number is lower.")
    assert (out.reward, out.terminated, out.info["invalid_move"]) == (0.0, False, False)
    out = env.step({"agent_0": "ten"})["agent_0"]  # invalid: TextArena warns once ...
    assert not out.terminated and out.info["invalid_move"] and "You attempted an invalid move" in out.obs
    out = env.step({"agent_0": "eleven"})["agent_0"]  # ... then ends the game, with its partial credit
    assert out.terminated and out.info["invalid_move"] and out.info["reason"].startswith("Invalid Move")
    own = textarena_rewards("GuessTheNumber-v0", 1, 7, [[0, "[10]"], [0, "ten"], [0, "eleven"]])
    assert out.reward == own[0] == pytest.approx(1 - abs(10 - env.game.state.game_state["game_number"]) / 19)


def test_two_player_moves_invalid_moves_and_the_end_are_the_games_own() -> None:
    async def play() -> None:
        env = TextArenaMultiEnv("TicTacToe-v0")
        first = await env.reset(seed=1)
        assert "You are Player 1 in Tic Tac Toe" in first["player_1"][0] and env.active_agents == ["player_0"]
        out = await env.step({"player_0": "4"})  # the id's ActionFormattingWrapper reads it as [4]
        assert set(out) == {"player_0", "player_1"} and env.active_agents == ["player_1"]
        assert "[Player 0] 4" not in out["player_0"].obs  # its own move is its reply already
        assert out["player_1"].obs.startswith("[Player 0] [4]\n[GAME] Player 0 placed their symbol (O) in cell 4.")
        out = await env.step({"player_1": "[4]"})  # occupied: warned, and player 1 moves again
        assert set(out) == {"player_1"} and out["player_1"].info["invalid_move"] and not out["player_1"].terminated
        assert "cell 4 is already occupied" in out["player_1"].obs and env.active_agents == ["player_1"]
        out = await env.step({"player_1": "[4]"})  # again: TextArena ends the game against it
        assert all(o.terminated for o in out.values()) and env.active_agents == []
        assert (out["player_0"].reward, out["player_1"].reward) == (1.0, -1.0)
        assert (out["player_0"].info["result"], out["player_1"].info["result"]) == ("win", "loss")
        own = textarena_rewards("TicTacToe-v0", 2, 1, out["player_0"].info["moves"])
        assert own == {0: 1.0, 1: -1.0} and out["player_1"].info["game_info"]["invalid_move"] is True

    run_sync(play())


def test_a_game_keeps_its_own_random_stream_and_leaves_the_process_one_alone() -> None:
    outer = random.getstate()
    a, b = TextArenaEnv("GuessTheNumber-v0"), TextArenaEnv("GuessTheNumber-v0")
    a.reset(seed=3)
    random.random()  # draws elsewhere between the games' calls change nothing
    b.reset(seed=3)
    target = a.game.state.game_state["game_number"]
    assert b.game.state.game_state["game_number"] == target
    raw = ta.make("GuessTheNumber-v0")
    raw.reset(num_players=1, seed=3)
    assert raw.state.game_state["game_number"] == target  # TextArena's own game for that seed
    random.setstate(outer)
    a.reset(seed=4)
    assert random.getstate() == outer


def test_the_random_opponent_plays_listed_moves_and_a_held_out_seed_changes_it() -> None:
    assert legal_moves("[GAME] Current Board:\n 0 | 1\nAvailable Moves: '[0]', '[1]'\n[Player 1] [5]") == ["[0]", "[1]"]
    assert legal_moves("[GAME] respond with one of: '[rock]', '[paper]', or '[scissors]'.") == [
        "[rock]", "[paper]", "[scissors]",
    ]  # fmt: skip

    async def opening(seed: int) -> str:
        env = TextArenaMultiEnv("TicTacToe-v0", opponents={0: "random"})
        await env.reset(seed=seed)
        out = await env.step({})
        return out["player_1"].obs.splitlines()[0]

    seen = {run_sync(opening(s)) for s in range(HELD_OUT_BASE, HELD_OUT_BASE + 8)}
    assert run_sync(opening(5)) == run_sync(opening(5)) and len(seen) > 1
    assert all(line.startswith("[Player 0] [") for line in seen)


# -- episodes with the tiny model, one training step, evaluation -----------------------------------


@pytest.fixture(scope="module")
def client(tiny_model_dir: str) -> LocalChatClient:
    return LocalChatClient(tiny_model_dir, max_batch_size=16)


def test_single_player_episodes_are_scored_by_textarena(client: LocalChatClient) -> None:
    task = textarena_task("GuessTheNumber-v0", max_turns=6)
    rollouts = episodes(task, client, 4)
    assert len(rollouts) == 4 and all(r.env_seed < TRAIN_SEEDS for r in rollouts)
    assert assert_textarena_scored("GuessTheNumber-v0", 1, rollouts) >= 1
    step = rollouts[0].steps[0]
    assert step.trace is not None and step.prev_obs.startswith("[GAME] You are Player 0")


def test_episodes_against_a_fixed_opponent(client: LocalChatClient) -> None:
    # the agent in seat 1: the random bot opens, and its move is in the agent's first prompt
    task = textarena_task("TicTacToe-v0", opponent="random", seat=1)
    # a game's turns repeat the game: small micro-batches, recomputed activations
    assert task.trainer_defaults == {"micro_token_budget": 1024, "gradient_checkpointing": True}
    rollouts = episodes(task, client, 3)
    assert {r.agent_id for r in rollouts} == {"player_1"} and all(
        r.meta["env_driven_agents"] == ["player_0"] for r in rollouts
    )
    assert all(r.steps[0].prev_obs.count("[Player 0] [") == 1 for r in rollouts)
    assert assert_textarena_scored("TicTacToe-v0", 2, rollouts) == 3
    # a ChatClient as the opponent: a model that is not trained (here the same tiny one)
    task = textarena_task("TruthAndDeception-v0", opponent=chat_opponent(client, max_tokens=8))
    rollouts = episodes(task, client, 2)
    assert {r.agent_id for r in rollouts} == {"player_0"}
    assert assert_textarena_scored("TruthAndDeception-v0", 2, rollouts) == 2


def test_self_play_gives_one_rollout_per_seat_scored_by_textarena(client: LocalChatClient) -> None:
    task = textarena_task("TruthAndDeception-v0", self_play=True)  # a talk game: both seats act
    rollouts = episodes(task, client, 2)
    assert sorted(r.agent_id for r in rollouts) == ["player_0", "player_0", "player_1", "player_1"]
    assert len({r.meta["episode_id"] for r in rollouts}) == 2
    assert assert_textarena_scored("TruthAndDeception-v0", 2, rollouts) == 4
    for episode in {r.meta["episode_id"] for r in rollouts}:
        pair = [r for r in rollouts if r.meta["episode_id"] == episode]
        assert sum(game_reward(r) for r in pair) == 0.0  # TextArena's zero-sum +1 / -1 (or a 0 / 0 draw)


def test_one_training_step_on_textarena_rewards(tiny_model_dir: str) -> None:
    from ludic_lab.env_training import build_env_training

    task = textarena_task("TruthAndDeception-v0", self_play=True)
    run = build_env_training(task, model=tiny_model_dir, max_tokens=8, group_size=2, prompts_per_step=1,
                             config={"lr": 1e-2})  # fmt: skip
    history = run.train_sync(1, progress=False)
    assert len(history) == 1 and run.client.policy_version == 1
    trained = run.source.last_rollouts
    assert {r.agent_id for r in trained} == {"player_0", "player_1"}
    assert assert_textarena_scored("TruthAndDeception-v0", 2, list(trained)) == len(trained)


def test_held_out_evaluation_win_rate_and_pass_at_k(client: LocalChatClient) -> None:
    result = run_sync(evaluate_textarena(client, "TicTacToe-v0", games=3, k=2, temperature=1.0, max_tokens=8))
    assert sorted({r.env_seed for r in result.rollouts}) == [HELD_OUT_BASE, HELD_OUT_BASE + 1, HELD_OUT_BASE + 2]
    assert len(result.rollouts) == 6 and result.success_rule == "textarena reward >= 1"
    assert_textarena_scored("TicTacToe-v0", 2, list(result.rollouts))
    wins = sum(game_reward(r) >= 1 for r in result.rollouts)
    assert result.summary()["accuracy"] == wins / 6
    metrics = run_sync(textarena_task("GuessTheNumber-v0", max_turns=4).evaluate(client, games=2, max_tokens=8))
    assert metrics["num_samples"] == 2 and 0.0 <= metrics["win_rate_ci_low"] <= metrics["win_rate"]
    assert metrics["win_rate"] <= metrics["win_rate_ci_high"] <= 1.0 and "pass@1" in metrics
