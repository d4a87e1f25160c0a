"""The conformance table of ``tests/test_conformance.py``: one row per environment source.

Each row builds its source's :class:`~ludic_lab.task.Task` with the source's own builder on an
environment of the real package that the tests already ship (a verifiers taskset under
``tests/verifiers_envs``, the OpenEnv server under ``tests/openenv_servers``, TextArena's and
reasoning-gym's own games and generators, the Gymnasium / PettingZoo envs of
``tests/gym_text_envs.py``, ludic_lab's bundled tasks), and says how that package scores an
episode on its own (``own_scores``). A check a source cannot support is an :class:`NA` cell
with its reason and a check of the reason (the refusal it gets, the field it lacks).

Adding a source is adding a row: a builder, a CLI ``--task`` spec, ``task.evaluate``'s
keywords, and the package's own scorer.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic_lab.parsers import ParseResult, identity_parser
from ludic_lab.task import Task
from ludic_lab.types import Rollout

HERE = Path(__file__).resolve().parent
OPENENV_APP = "openenv_servers.word_env.server.app:app"
"""The OpenEnv test server (``tests/openenv_servers/word_env``): repeat a word, two attempts."""

Pairs = list[tuple[float, float]]
"""``(reward ludic_lab trained on, the package's own score of the same completion)`` per step or episode."""


@dataclass(frozen=True)
class NA:
    """A check the source cannot support: ``reason`` (printed in the table) and ``check``, which
    asserts the reason holds (``check(task, client)``: the refusal, the missing field)."""

    reason: str
    check: Callable[[Task, Any], None]


@dataclass(frozen=True)
class Source:
    """One row: how to build the source's task and what each check needs."""

    id: str
    build: Callable[[], Task]
    """The builder call (no arguments; ``conformance_sources:<its name>`` is also the CLI's ``--task``)."""
    needs: tuple[str, ...]
    """Modules the row needs (the test is skipped with the install hint without them)."""
    own_scores: Callable[[Task, Sequence[Rollout]], Pairs]
    """The package's own score of what each rollout sampled, next to the reward it got."""
    cli: str
    """``ludic-lab eval --task`` spec: the source's documented one where it has one."""
    evaluate: dict[str, Any] | NA
    """``task.evaluate`` keywords (a small held-out sample) -> a summary."""
    stepper: bool | NA = True
    """One episode through the notebook stepper (``ludic_lab.lab.RolloutStepper``)."""
    failure: Callable[[Task], tuple[Task, int, int, str, str]] | None = None
    """``task -> (task, bad seed, good seed, cause, text)``: an episode that fails on its own;
    default: the row's env raising in ``step`` for one seed (``test_conformance.failing_at``)."""
    max_tokens: int = 6
    eval_seed: int = 0
    """The env seed ``ludic-lab eval --seeds`` evaluates."""
    release: Callable[[Any], None] | None = None
    """``release(client)``: stop what the source's episodes started for a sampler (verifiers: its endpoint)."""


# -- verifiers ------------------------------------------------------------------------------------
def verifiers_row() -> Task:
    from ludic_lab.task.external.verifiers import verifiers_task

    return verifiers_task("vf_digits", heldout=10, timeout_s=120, max_concurrent=2)


def verifiers_scores(task: Task, rollouts: Sequence[Rollout]) -> Pairs:
    """verifiers' own ``Task.score`` of each recorded trace, by the task loaded afresh; the
    trace's sampled message is the completion the rollout trained on."""
    from verifiers_helpers import rescore

    from ludic_lab.aio import run_sync

    pairs = []
    for r in rollouts:
        sampled = [n["message"]["content"] for n in r.meta["verifiers"]["trace"]["nodes"] if n["sampled"]]
        assert [s.strip() for s in sampled] == [s.action.strip() for s in r.steps]
        pairs.append((r.total_reward, float(run_sync(rescore("vf_digits", r)).reward)))
    return pairs


def stop_endpoint(client: Any) -> None:
    """Stop the OpenAI-compatible endpoint verifiers' episodes call over ``client``."""
    from ludic_lab.task.external.verifiers import endpoint_for

    endpoint_for(client).stop()


def verifiers_faulty(task: Task) -> tuple[Task, int, int, str, str]:
    """vf_faulty's own misbehaving reward: task 0's raises, task 3's scores normally."""
    from ludic_lab.task.external.verifiers import verifiers_task

    faulty = verifiers_task("vf_faulty", timeout_s=60)
    return faulty, 0, 3, "judge_failure", "the reference answer file is missing"


def _refused_by_the_stepper(error: type[Exception], match: str) -> Callable[[Task, Any], None]:
    def check(task: Task, client: Any) -> None:
        import pytest

        from ludic_lab.agents import Agent
        from ludic_lab.context import FullDialog
        from ludic_lab.lab.stepper import RolloutStepper

        with pytest.raises(error, match=match):
            RolloutStepper(task.env(), Agent(client, FullDialog(), task.parser), env_seed=0)

    return check


# -- OpenEnv --------------------------------------------------------------------------------------
@functools.cache
def word_server() -> Any:
    """The word server, launched once per process (stopped with it, or by :func:`close`)."""
    from ludic_lab.integrations.openenv_server import OpenEnvServer

    return OpenEnvServer.launch(OPENENV_APP, cwd=str(HERE), max_sessions=8).start_sync()


def openenv_row() -> Task:
    from ludic_lab.task.external.openenv import openenv_task

    return openenv_task(word_server(), max_steps=2, eval_size=4, reject_incomplete_completions=False)


def openenv_scores(task: Task, rollouts: Sequence[Rollout]) -> Pairs:
    """The environment class the server runs, stepped here in-process with the same messages."""
    from openenv_servers.word_env.models import WordAction
    from openenv_servers.word_env.server.word_environment import WordEnvironment

    pairs = []
    for r in rollouts:
        env = WordEnvironment()
        env.reset(seed=r.env_seed)
        for s in r.steps:
            pairs.append((s.env_reward, float(env.step(WordAction(message=s.parsed_action)).reward)))
    return pairs


# -- TextArena ------------------------------------------------------------------------------------
def textarena_row() -> Task:
    from ludic_lab.task.external.textarena import textarena_task

    return textarena_task("TicTacToe-v0", opponent="random", max_turns=8)


def textarena_solo_row() -> Task:
    from ludic_lab.task.external.textarena import textarena_task

    return textarena_task("GuessTheNumber-v0", max_turns=4)


def textarena_scores(task: Task, rollouts: Sequence[Rollout]) -> Pairs:
    """The recorded moves replayed on a fresh ``textarena.make`` from the same seed: its rewards."""
    import textarena as ta

    pairs = []
    for r in rollouts:
        info = next((s.info for s in reversed(r.steps) if "moves" in s.info), None)
        if info is None:  # cut by the turn limit: TextArena gave no reward
            pairs.append((r.total_reward, 0.0))
            continue
        env = ta.make(task.name)
        players = len(info["rewards"])
        env.reset(num_players=players, seed=r.env_seed)
        for _player, action in info["moves"]:
            env.step(action)
        rewards, _ = env.close()
        pairs.append((r.total_reward, float(rewards[info["player"]])))
    return pairs


# -- reasoning-gym --------------------------------------------------------------------------------
RG_NAME, RG_SIZE = "countdown", 8


def reasoning_gym_row() -> Task:
    from ludic_lab.task.external.reasoning_gym import reasoning_gym_task

    # the whole reply is the answer, so every step reaches reasoning-gym's scorer
    return reasoning_gym_task(RG_NAME, size=RG_SIZE, heldout_size=2, parser=identity_parser,
                              reject_incomplete_completions=False)  # fmt: skip


def reasoning_gym_scores(task: Task, rollouts: Sequence[Rollout]) -> Pairs:
    """``dataset.score_answer`` on a dataset built here, independently of the adapter."""
    import reasoning_gym

    ds = reasoning_gym.create_dataset(RG_NAME, size=RG_SIZE, seed=0)
    return [(s.env_reward, float(ds.score_answer(s.parsed_action, ds[s.info["index"]])))
            for r in rollouts for s in r.steps]  # fmt: skip


# -- Gymnasium and PettingZoo ---------------------------------------------------------------------
def _letters(limit: int, keep: str = "") -> Callable[[str], ParseResult]:
    """The reply's letters (and ``keep``) as the action, so every reply is inside the Text space."""

    def parse(text: str) -> ParseResult:
        return ParseResult(re.sub(f"[^a-z{keep}]", "", text.lower()).strip()[:limit] or "x", 0.0)

    return parse


def gym_row() -> Task:
    from gym_text_envs import LETTER_GAME_ID

    from ludic_lab.task.external.gym import gym_task

    return gym_task(LETTER_GAME_ID, max_steps=2, parser=_letters(24, keep=" "), reject_incomplete_completions=False)


def gym_scores(task: Task, rollouts: Sequence[Rollout]) -> Pairs:
    """The registered env made by gymnasium, reset with the seed and stepped with the same actions."""
    import gymnasium
    from gym_text_envs import LETTER_GAME_ID

    pairs = []
    for r in rollouts:
        env = gymnasium.make(LETTER_GAME_ID)
        env.reset(seed=r.env_seed)
        for s in r.steps:
            pairs.append((s.env_reward, float(env.step(s.parsed_action)[1])))
    return pairs


def _rps_move(text: str) -> ParseResult:
    """A move read off the reply (its characters' sum picks one), so replies play real rounds."""
    from gym_text_envs import MOVES

    return ParseResult(MOVES[sum(map(ord, text)) % len(MOVES)], 0.0)


def pettingzoo_row() -> Task:
    from gym_text_envs import RockPaperScissorsAEC

    from ludic_lab.task.external.gym import pettingzoo_task

    return pettingzoo_task(RockPaperScissorsAEC, max_steps=6, parser=_rps_move, reject_incomplete_completions=False)


def pettingzoo_scores(task: Task, rollouts: Sequence[Rollout]) -> Pairs:
    """PettingZoo's own loop (``agent_iter`` / ``last``) replaying each episode's moves: every
    player's return next to its rollout's."""
    from gym_text_envs import RockPaperScissorsAEC

    episodes: dict[str, list[Rollout]] = {}
    for r in rollouts:
        episodes.setdefault(r.meta["episode_id"], []).append(r)
    pairs = []
    for seats in episodes.values():
        moves = {r.agent_id: [s.parsed_action for s in r.steps] for r in seats}
        env = RockPaperScissorsAEC()
        env.reset(seed=seats[0].env_seed)
        returns = dict.fromkeys(moves, 0.0)
        for agent in env.agent_iter():
            _obs, reward, term, trunc, _info = env.last()
            returns[agent] += float(reward)
            env.step(None if term or trunc else moves[agent].pop(0))
        pairs += [(r.total_reward, returns[r.agent_id]) for r in seats]
    return pairs


# -- the bundled tasks ----------------------------------------------------------------------------
def capitals_row() -> Task:
    from ludic_lab.task.capitals import capitals_task

    # judged even when cut at the token budget (the tiny model's replies always are)
    return dataclasses.replace(capitals_task(), reject_incomplete_completions=False)


def capitals_scores(task: Task, rollouts: Sequence[Rollout]) -> Pairs:
    from ludic_lab.data import capital_verifier, load_capitals

    rows, verify = load_capitals("train"), capital_verifier()
    return [(s.env_reward, float(verify(s.action, rows[r.env_seed]["answer"]))) for r in rollouts for s in r.steps]


def digits_row() -> Task:
    from ludic_lab.task.digits import digits_task

    return digits_task()


def digits_scores(task: Task, rollouts: Sequence[Rollout]) -> Pairs:
    from ludic_lab.task.digits import digit_fraction

    return [(s.env_reward, digit_fraction(s.action)) for r in rollouts for s in r.steps]


def tools_row() -> Task:
    from ludic_lab.data import load_multiplication
    from ludic_lab.demos.tool_task import multiplication_task

    return multiplication_task(load_multiplication("train"))


def tools_scores(task: Task, rollouts: Sequence[Rollout]) -> Pairs:
    from ludic_lab.data import load_multiplication
    from ludic_lab.demos.tool_task import final_number_match

    rows = load_multiplication("train")
    return [(s.env_reward, float(final_number_match(s.action, rows[r.env_seed]["answer"])))
            for r in rollouts for s in r.steps]  # fmt: skip


# -- repository tasks in a workspace --------------------------------------------------------------
def bugfix_row() -> Task:
    from ludic_lab.task.bugfix import bugfix_task

    # bash-only (mini-swe-agent's set-up): with the tiny model's tokenizer the prompt is 671 tokens
    # and fits the trainer's default max_seq_len (1024); with all five tools' schemas it is 1,607.
    # The tiny model writes no tool call: each episode is one reply, then the hidden tests.
    return bugfix_task("train", limit=4, max_turns=2, tools=("shell",))


def bugfix_scores(task: Task, rollouts: Sequence[Rollout]) -> Pairs:
    """The task set's own test runner (``ludic_lab/data/bugfix/runner.py``: pytest in forked
    children, what made and validated the tasks) on the buggy repository: every hidden test
    passing is 1.0. No tool call of the episodes changed a file (checked), so the workspace the
    hidden tests judged is that repository."""
    import json
    import subprocess
    import sys
    import tempfile

    from ludic_lab.data.bugfix import load_bugfix_tasks, materialize, runner as bugfix_runner

    tasks = load_bugfix_tasks("train")[:4]
    pairs = []
    for r in rollouts:
        (step,) = r.steps
        calls = step.info["agent"]["tool_calls"]
        assert not [c for c in calls if c["name"] in ("shell", "write_file", "edit_file") and c["error"] is None]
        t = tasks[r.env_seed % len(tasks)]
        assert step.info["task_id"] == t.id
        with tempfile.TemporaryDirectory() as folder:
            materialize(t, folder)
            out = subprocess.run([sys.executable, bugfix_runner.__file__, folder], capture_output=True, text=True,
                                 check=True, timeout=300)  # fmt: skip
        outcomes = json.loads(out.stdout)[0]["outcomes"]
        assert {k: v == "passed" for k, v in outcomes.items() if k in t.hidden_tests} == {
            k: v == "passed" for k, v in step.info["tests"].items()
        }
        pairs.append((r.total_reward, float(all(outcomes.get(i) == "passed" for i in t.hidden_tests))))
    return pairs


def _no_evaluate(task: Task, client: Any) -> None:
    assert task.evaluate is None


_MULTI = "two seats (an env-driven opponent or self-play): the stepper steps one Agent's turns"

ROWS: list[Source] = [
    Source("verifiers", verifiers_row, ("verifiers", "openai", "httpx"), verifiers_scores,
           "conformance_sources:verifiers_row", {"seeds": [45], "max_tokens": 6},
           stepper=NA("VerifiersTaskEnv is played by VerifiersProtocol (verifiers' harness runs its turns)",
                      _refused_by_the_stepper(TypeError, "played by VerifiersProtocol")),
           failure=verifiers_faulty, eval_seed=40, release=stop_endpoint),
    Source("openenv", openenv_row, ("openenv",), openenv_scores, "conformance_sources:openenv_row",
           {"seeds": [100_000], "max_tokens": 6}),
    Source("textarena", textarena_row, ("textarena",), textarena_scores, "conformance_sources:textarena_row",
           {"games": 1, "max_tokens": 6},
           stepper=NA(_MULTI, _refused_by_the_stepper(ValueError, "exactly one agent"))),
    Source("textarena_solo", textarena_solo_row, ("textarena",), textarena_scores,
           "conformance_sources:textarena_solo_row", {"games": 1, "max_tokens": 6}),
    Source("reasoning_gym", reasoning_gym_row, ("reasoning_gym",), reasoning_gym_scores,
           f"reasoning_gym:{RG_NAME}", {"k": 1, "max_tokens": 6}),
    Source("gym", gym_row, ("gymnasium",), gym_scores, "conformance_sources:gym_row",
           {"seeds": [10**9], "max_tokens": 6}),
    Source("pettingzoo", pettingzoo_row, ("gymnasium", "pettingzoo"), pettingzoo_scores,
           "conformance_sources:pettingzoo_row", {"seeds": [10**9], "max_tokens": 4},
           stepper=NA(_MULTI, _refused_by_the_stepper(ValueError, "exactly one agent")), max_tokens=4),
    Source("capitals", capitals_row, (), capitals_scores, "capitals",
           {"rows": [{"question": "What is the capital of France?", "answer": "Paris"}], "max_tokens": 6}),
    Source("tools", tools_row, (), tools_scores, "tools",
           {"rows": [{"question": "What is 12 * 3?", "answer": "36"}], "max_tokens": 6}),
    Source("bugfix", bugfix_row, (), bugfix_scores, "conformance_sources:bugfix_row",
           {"limit": 1, "max_tokens": 6}),
    Source("digits", digits_row, (), digits_scores, "digits",
           NA("digits_task has no held-out evaluation (Task.evaluate is None); `ludic-lab eval --task digits` "
              "evaluates 32 fresh prompts (the CLI column)", _no_evaluate)),
]  # fmt: skip
"""The table: every Task builder of ``ludic_lab.task`` (``builtin_task``'s names and
``task.external``'s builders) has a row, and so has the CLI's other bundled task (``tools``:
``multiplication_task``, a ToolAgent with a calculator), and the repository tasks in a workspace
(``bugfix``: ``bugfix_task``, a ToolAgent with the workspace tools, scored by hidden tests)."""

SOURCE_IDS = [row.id for row in ROWS]


def close() -> None:
    """Stop the word server if this process started it."""
    if word_server.cache_info().currsize:
        word_server().close_sync()
        word_server.cache_clear()
