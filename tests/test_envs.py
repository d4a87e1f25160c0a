"""Shipped environments: verifiers, DatasetQAEnv and the Tic-Tac-Toe game and envs."""

from __future__ import annotations

import json
import random

import pytest

from ludic_lab.envs import (
    DatasetQAEnv,
    LudicEnv,
    SingleAgentEnv,
    TicTacToeEnv,
    TicTacToeGame,
    TicTacToeMultiAgentEnv,
    TicTacToeRewards,
)
from ludic_lab.envs.tic_tac_toe import coord_to_index, index_to_coord, minimax_moves
from ludic_lab.envs.verifiers import exact_match, normalize_answer, numeric_match, parse_number
from ludic_lab.types import StepOutcome

A = "agent_0"

# -- verifiers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pred,target",
    [
        ("42", "42"),
        (" 42 ", "42"),
        ("42.", "42"),
        ("42.0", "42"),
        ("$42", "42"),
        ("\\$42", "42"),
        ("1,234", "1234"),
        ("$1,234.50", "1234.5"),
        ("-3", "-3"),
        ("+3", "3"),
        ("0.1", "0.1000000001"),
        ("1/2", "0.5"),
        ("1e3", "1000"),
        ("$5$", "5"),
        ("Paris", "paris"),
        ("New   York.", "new york"),
    ],
)
def test_numeric_match_accepts(pred: str, target: str) -> None:
    assert numeric_match(pred, target)


@pytest.mark.parametrize(
    "pred,target",
    [
        ("41", "42"),
        ("-42", "42"),
        ("4.2", "42"),
        ("5 apples", "5"),
        ("1,2", "12"),
        ("", "0"),
        ("nan", "nan1"),
        ("inf", "1e999"),
        ("1/0", "0"),
        ("x" * 10_000, "1"),
        ("\U0001f600", "1"),
    ],
)
def test_numeric_match_rejects(pred: str, target: str) -> None:
    assert not numeric_match(pred, target)


def test_verifier_helpers() -> None:
    assert parse_number("1,000,000") == 1_000_000
    assert parse_number("12 34") == 1234  # inner spaces dropped like separators
    assert parse_number("three") is None and parse_number("nan") is None and parse_number("1.2.3") is None
    assert normalize_answer("  $Hello   World.$ ") == "hello world"
    assert exact_match(" a ", "a") and not exact_match("A", "a")
    assert not numeric_match(None, "1")  # type: ignore[arg-type]
    assert numeric_match("7", 7)  # type: ignore[arg-type]


# -- DatasetQAEnv ---------------------------------------------------------------------------

ROWS = [{"id": f"q{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]


def test_qa_seed_picks_sample_deterministically() -> None:
    env = DatasetQAEnv(ROWS)
    obs0, info0 = env.reset(seed=7)[A]
    assert obs0 == "What is 2 + 1?" and info0 == {"index": 2, "id": "q2"}
    assert env.reset(seed=7)[A] == (obs0, info0)
    assert [env.reset(seed=s)[A][1]["index"] for s in range(5)] == [0, 1, 2, 3, 4]
    assert env.env_current_obs() == "What is 4 + 1?"


def test_qa_seed_none_walks_the_dataset_in_order_and_wraps() -> None:
    env = DatasetQAEnv(ROWS)
    assert [env.reset()[A][1]["index"] for _ in range(7)] == [0, 1, 2, 3, 4, 0, 1]


def test_qa_step_grades_and_ends() -> None:
    env = DatasetQAEnv(ROWS, correct_reward=2.0, incorrect_reward=-0.5)
    env.reset(seed=3)
    out = env.step({A: "$4."})[A]
    assert isinstance(out, StepOutcome)
    assert (out.reward, out.terminated, out.truncated) == (2.0, True, False)
    assert out.info["correct"] is True and out.info["target"] == "4" and out.info["id"] == "q3"
    assert env.active_agents == [] and env.env_current_obs() == out.obs
    with pytest.raises(RuntimeError, match="reset"):
        env.step({A: "4"})
    env.reset(seed=3)
    wrong = env.step({A: "5"})[A]
    assert wrong.reward == -0.5 and wrong.info["correct"] is False and "4" in wrong.obs
    json.dumps(wrong.info)


def test_qa_custom_keys_verifier_and_prompt_builder() -> None:
    rows = [{"q": "Capital of France?", "a": "Paris"}]
    env = DatasetQAEnv(rows, question_key="q", answer_key="a", verifier=exact_match)
    assert env.reset(seed=0)[A][0] == "Capital of France?"
    assert env.step({A: "paris"})[A].info["correct"] is False  # exact_match is case-sensitive
    env2 = DatasetQAEnv(rows, answer_key="a", prompt_builder=lambda r: f"Q: {r['q']}\nA:")
    assert env2.reset(seed=0)[A][0] == "Q: Capital of France?\nA:"


def test_qa_single_sample_mapping_like_ludic() -> None:
    env = DatasetQAEnv({"question": "2*3?", "answer": 6})
    assert len(env) == 1 and env.reset(seed=123)[A][0] == "2*3?"
    assert env.step({A: "6"})[A].info["correct"] is True


def test_qa_verifier_exception_is_an_incorrect_answer_not_a_crash() -> None:
    def boom(pred: str, target: str) -> bool:
        raise ZeroDivisionError("bad verifier")

    env = DatasetQAEnv(ROWS, verifier=boom)
    env.reset(seed=0)
    out = env.step({A: "1"})[A]
    assert out.reward == 0.0 and out.info["correct"] is False and "ZeroDivisionError" in out.info["verifier_error"]


def test_qa_from_jsonl_and_hf_dataset(tmp_path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n\n", encoding="utf-8")
    from_path = DatasetQAEnv(path)
    from_str = DatasetQAEnv(str(path))
    assert len(from_path) == len(from_str) == 5
    assert from_path.reset(seed=4)[A] == DatasetQAEnv(ROWS).reset(seed=4)[A]

    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(ROWS)
    env = DatasetQAEnv(ds)
    assert len(env) == 5 and env.reset(seed=2)[A][0] == "What is 2 + 1?"
    assert env.step({A: "3"})[A].info["correct"] is True
    with pytest.raises(KeyError, match="'solution'.*columns"):
        DatasetQAEnv(ds, answer_key="solution")
    with pytest.raises(TypeError, match="pick one"):
        DatasetQAEnv(datasets.DatasetDict({"train": ds}))


def test_qa_errors_are_clear(tmp_path) -> None:
    with pytest.raises(ValueError, match="empty"):
        DatasetQAEnv([])
    with pytest.raises(KeyError, match="'answer'"):
        DatasetQAEnv([{"question": "q"}])
    with pytest.raises(KeyError, match="sample 1 has no key 'question'"):
        DatasetQAEnv([{"question": "q", "answer": "1"}, {"prompt": "q", "answer": "1"}])
    with pytest.raises(TypeError, match="expected a dict"):
        DatasetQAEnv(["just a string"])
    with pytest.raises(TypeError, match="unsupported"):
        DatasetQAEnv(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="verifier"):
        DatasetQAEnv(ROWS, verifier="numeric")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="not found"):
        DatasetQAEnv(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "1"}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        DatasetQAEnv(bad)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        DatasetQAEnv(empty)
    env = DatasetQAEnv(ROWS)
    with pytest.raises(RuntimeError, match="reset"):
        env.env_step("1")


def test_qa_sysprompt_and_recommended_parser_agree() -> None:
    env = DatasetQAEnv(ROWS)
    assert "<answer>" in env.suggested_sysprompt
    parser = DatasetQAEnv.recommended_parser(success_reward=0.1)
    res = parser("I think... <answer>3</answer>")
    assert res.action == "3" and res.reward == 0.1
    env.reset(seed=2)
    assert env.step({A: res.action})[A].info["correct"]
    assert DatasetQAEnv(ROWS, system_prompt=None).suggested_sysprompt is None


# -- Tic-Tac-Toe game -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,index",
    [("A1", 0), ("b2", 4), (" C3 ", 8), ("c1", 2), ("A3", 6), ("B2.", 4), ("2b", 4), ("b 2", 4), ("B-2", 4)],
)
def test_coords_lenient(text: str, index: int) -> None:
    assert coord_to_index(text) == index


@pytest.mark.parametrize("text", ["", "D1", "A4", "A0", "B22", "middle", "<move>B2</move>", "AB", "x" * 100, None])
def test_coords_reject(text) -> None:
    assert coord_to_index(text) is None


def test_coords_roundtrip() -> None:
    assert [coord_to_index(index_to_coord(i)) for i in range(9)] == list(range(9))
    with pytest.raises(ValueError):
        index_to_coord(9)


def test_game_win_draw_detection() -> None:
    g = TicTacToeGame()
    for i in (0, 3, 1, 4):  # X: A1, B1; O: A2, B2
        g = g.play(i)
    assert not g.is_over and g.to_move == "X"
    g = g.play(2)  # X completes the top row
    assert g.winner == "X" and g.is_over and not g.is_draw and g.legal_moves() == []
    with pytest.raises(ValueError):
        g.play(5)
    diag = TicTacToeGame(board="O.X.OX..O", to_move="X")
    assert diag.winner == "O"
    draw = TicTacToeGame(board="XOXXOOOXX")
    assert draw.winner is None and draw.is_draw and draw.is_over
    with pytest.raises(ValueError):
        TicTacToeGame().play(0).play(0)
    with pytest.raises(ValueError):
        TicTacToeGame(board="XX")
    with pytest.raises(ValueError):
        TicTacToeGame(to_move="Z")


def test_minimax_takes_wins_and_blocks() -> None:
    win = TicTacToeGame(board="XX.OO....", to_move="X")
    assert minimax_moves(win) == [2]
    block = TicTacToeGame(board="XX.O.....", to_move="O")
    assert minimax_moves(block) == [2]


def test_minimax_vs_minimax_always_draws() -> None:
    rng = random.Random(0)
    from ludic_lab.envs.tic_tac_toe import minimax_opponent

    for _ in range(20):
        g = TicTacToeGame()
        while not g.is_over:
            g = g.play(minimax_opponent(g, rng))
        assert g.is_draw


# -- TicTacToeEnv -----------------------------------------------------------------------------


def _random_legal(env: TicTacToeEnv, rng: random.Random) -> str:
    return index_to_coord(rng.choice(env.game.legal_moves()))


def test_tictactoe_observation_shows_board_turn_and_legal_moves() -> None:
    env = TicTacToeEnv()
    obs, info = env.reset(seed=0)[A]
    assert "  A B C\n1 . . .\n2 . . .\n3 . . ." in obs
    assert "You are X. Your move." in obs
    assert "Legal moves: A1, B1, C1, A2, B2, C2, A3, B3, C3" in obs
    assert info["agent_starts"] is True and env.env_current_obs() == obs
    out = env.step({A: " b2 "})[A]
    assert out.reward == 0.0 and not out.terminated
    assert out.info["agent_move"] == "B2" and out.info["opponent_move"] in out.obs
    assert "B2" not in out.obs.split("Legal moves:")[1]


def test_tictactoe_seeded_opponent_is_deterministic() -> None:
    def play(seed: int) -> list[str]:
        env = TicTacToeEnv(opponent="random")
        env.reset(seed=seed)
        rng, seen = random.Random(1), []
        while env.active_agents:
            out = env.step({A: _random_legal(env, rng)})[A]
            seen.append(out.obs)
        return seen

    assert play(5) == play(5)
    assert any(play(s) != play(5) for s in range(6, 12))


def test_tictactoe_win_and_loss_and_rewards() -> None:
    def scripted(moves: list[int]):
        it = iter(moves)
        return lambda game, rng: next(it)

    # opponent plays B1 (3), B2 (4): X wins on the top row at its third move
    env = TicTacToeEnv(opponent=scripted([3, 4]))
    env.reset(seed=0)
    env.step({A: "A1"})
    env.step({A: "B1"})
    out = env.step({A: "C1"})[A]
    assert out.terminated and out.reward == 1.0 and out.info["result"] == "win" and "You win!" in out.obs
    assert env.active_agents == []

    # agent plays badly: opponent (starting) takes the left column
    env = TicTacToeEnv(opponent=scripted([0, 3, 6]), agent_starts=False, rewards=TicTacToeRewards(loss=-1.0))
    obs, _ = env.reset(seed=0)[A]
    assert "Opponent (O) played A1." in obs
    env.step({A: "B1"})
    out = env.step({A: "C1"})[A]
    assert out.terminated and out.reward == -1.0 and out.info["result"] == "loss"


def test_tictactoe_draw_reward() -> None:
    # X: B2, A1, C2, B3, A3... scripted O: C3, A2, B1, C1 -> a full board with no line
    env = TicTacToeEnv(opponent=lambda g, r: [i for i in (8, 3, 1, 2) if g.board[i] == "."][0],
                       rewards=TicTacToeRewards(draw=0.25))  # fmt: skip
    env.reset(seed=0)
    outs = [env.step({A: m})[A] for m in ("B2", "A1", "C2", "B3", "A3")]
    assert env.game.is_draw
    assert outs[-1].info["result"] == "draw" and outs[-1].reward == 0.25 and outs[-1].terminated


@pytest.mark.parametrize("bad", ["B2", "Z9", "", "<move>B2</move>", "x" * 5000])
def test_tictactoe_illegal_or_unreadable_move_ends_with_penalty(bad: str) -> None:
    env = TicTacToeEnv(opponent=lambda g, r: 0, rewards=TicTacToeRewards(illegal=-2.0))
    env.reset(seed=0)
    if bad == "B2":
        env.step({A: "B2"})  # now B2 is taken
    out = env.step({A: bad})[A]
    assert out.reward == -2.0 and out.terminated and out.info["illegal_move"] is True
    assert out.info["result"] == "illegal" and "Illegal move" in out.obs and len(out.obs) < 500
    assert env.active_agents == []
    json.dumps(out.info)
    with pytest.raises(RuntimeError):
        env.env_step("A1")


def test_tictactoe_minimax_never_loses_against_random() -> None:
    rng = random.Random(123)
    for seed in range(150):
        env = TicTacToeEnv(opponent="minimax", agent_starts=seed % 2 == 0)
        env.reset(seed=seed)
        while env.active_agents:
            out = env.step({A: _random_legal(env, rng)})[A]
        assert out.info["result"] in ("loss", "draw"), f"random agent beat minimax at seed {seed}"


def test_tictactoe_bad_opponent_and_prompts() -> None:
    with pytest.raises(ValueError, match="opponent"):
        TicTacToeEnv(opponent="perfect")  # type: ignore[arg-type]
    env = TicTacToeEnv()
    assert isinstance(env, SingleAgentEnv)
    assert "<move>" in env.suggested_sysprompt and "B2" in env.suggested_sysprompt
    assert TicTacToeEnv.recommended_parser()("I pick <move>B2</move>").action == "B2"
    cheat = TicTacToeEnv(opponent=lambda g, r: 4)
    cheat.reset(seed=0)
    with pytest.raises(RuntimeError, match="opponent chose illegal move"):
        cheat.step({A: "B2"})


# -- TicTacToeMultiAgentEnv -------------------------------------------------------------------


def test_multi_agent_alternates_and_rejects_wrong_player() -> None:
    env = TicTacToeMultiAgentEnv()
    assert isinstance(env, LudicEnv) and env.agent_ids == ["X", "O"]
    res = env.reset(seed=0)
    assert set(res) == {"X", "O"} and "Your move" in res["X"][0] and "Waiting for X" in res["O"][0]
    assert env.active_agents == ["X"]
    with pytest.raises(ValueError, match="'X'"):
        env.step({"O": "A1"})
    with pytest.raises(ValueError):
        env.step({"X": "A1", "O": "B1"})
    out = env.step({"X": "A1"})
    assert set(out) == {"X", "O"} and not out["X"].terminated and out["X"].info == {"move": "A1", "mover": "X"}
    assert "Waiting for O" in out["X"].obs and out["X"].reward == 0.0
    # the waiting player is told about the move and that it is its turn, with no reward
    assert out["O"].reward == 0.0 and not out["O"].terminated and out["O"].info["your_turn"] is True
    assert env.active_agents == ["O"]
    assert out["O"].obs == env.current_obs("O")
    assert "Opponent (X) played A1." in out["O"].obs and "Legal moves: B1" in out["O"].obs
    with pytest.raises(KeyError):
        env.current_obs("Z")


def test_multi_agent_terminal_outcomes_for_both() -> None:
    env = TicTacToeMultiAgentEnv(first="O")
    env.reset()
    for mover, move in [("O", "A1"), ("X", "A2"), ("O", "B1"), ("X", "B2")]:
        assert env.active_agents == [mover]
        env.step({mover: move})
    out = env.step({"O": "C1"})
    assert set(out) == {"X", "O"}
    assert out["O"].reward == 1.0 and out["O"].info["result"] == "win"
    assert out["X"].reward == 0.0 and out["X"].info["result"] == "loss"
    assert all(o.terminated for o in out.values()) and env.active_agents == []
    assert env.current_obs("X") == out["X"].obs
    with pytest.raises(RuntimeError, match="reset"):
        env.step({"X": "C3"})


def test_multi_agent_illegal_move_forfeits() -> None:
    env = TicTacToeMultiAgentEnv(rewards=TicTacToeRewards(opponent_illegal=0.3))
    env.reset()
    env.step({"X": "B2"})
    out = env.step({"O": "b2"})
    assert out["O"].reward == -1.0 and out["O"].info["result"] == "illegal" and out["O"].info["illegal_move"]
    assert out["X"].reward == 0.3 and out["X"].info["result"] == "opponent_illegal"
    assert env.active_agents == []


def test_multi_agent_self_play_to_the_end() -> None:
    rng = random.Random(0)
    results = set()
    for _ in range(40):
        env = TicTacToeMultiAgentEnv()
        env.reset()
        while env.active_agents:
            (mover,) = env.active_agents
            out = env.step({mover: index_to_coord(rng.choice(env.game.legal_moves()))})
        assert set(out) == {"X", "O"}
        rx, ro = out["X"].info["result"], out["O"].info["result"]
        assert (rx, ro) in {("win", "loss"), ("loss", "win"), ("draw", "draw")}
        results.add(rx)
    assert results == {"win", "loss", "draw"}
    with pytest.raises(ValueError):
        TicTacToeMultiAgentEnv(first="Y")  # type: ignore[arg-type]
