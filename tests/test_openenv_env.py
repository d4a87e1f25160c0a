"""OpenEnv environment servers as ludic_lab envs and tasks, against openenv-core itself.

``tests/openenv_servers/word_env`` is an OpenEnv environment written as ``openenv init``'s
template writes one (pydantic ``Action`` / ``Observation``, an ``Environment``, ``create_app``):
repeat a word, two attempts, reward 1 for a reply holding it. The tests start it through the
adapter (uvicorn on a free port, once per module), run episodes with the tiny model, train one
step, evaluate on held-out seeds, and break it: a server that is down or cannot start, a step
slower than the timeout, a server killed mid-episode (then started again), a server at capacity.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv")

from ludic_lab.envs import check_env_async
from ludic_lab.integrations.openenv_env import OpenEnvEnv, OpenEnvEnvFactory, OpenEnvError
from ludic_lab.integrations.openenv_server import OpenEnvServer, OpenEnvServerError
from ludic_lab.integrations.openenv_text import (
    InvalidAction,
    default_action_from_text,
    default_observation_to_text,
    text_field,
)
from ludic_lab.net import free_port
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.task.external.openenv import evaluate_openenv, openenv_task

pytestmark = pytest.mark.timeout(240)

SERVERS = str(Path(__file__).parent)
APP = "openenv_servers.word_env.server.app:app"
WORDS = ("apple", "river", "cloud", "stone", "tiger", "music", "bread", "light")  # the server's own list


@pytest.fixture(scope="module")
def word_server() -> Iterator[OpenEnvServer]:
    with OpenEnvServer.launch(APP, cwd=SERVERS, max_sessions=8) as server:
        yield server


@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir: str) -> Any:
    from ludic_lab.inference import LocalChatClient

    return LocalChatClient(tiny_model_dir, max_batch_size=8)


def _engine(client: Any, factory: OpenEnvEnvFactory, **options: Any) -> RolloutEngine:
    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.interaction import SingleAgentSyncProtocol
    from ludic_lab.parsers import identity_parser

    def protocol() -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(
            Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
        )

    return RolloutEngine({"word": factory}, {"agent": protocol}, **options)


def _requests(seeds: list[int], *, kind: str = "word", protocol: str = "agent") -> list[RolloutRequest]:
    from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig

    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=4), ReturnSpec.for_training())
    return [RolloutRequest(EnvSpec(kind), ProtocolSpec(protocol), env_seed=s, inference=spec, max_steps=1)
            for s in seeds]  # fmt: skip


# -- the env, stepped by hand ---------------------------------------------------------------------
async def test_an_episode_maps_reset_step_and_state_to_text(word_server: OpenEnvServer) -> None:
    env = OpenEnvEnv(word_server)
    try:
        (obs, info) = (await env.reset(seed=3))["agent_0"]
        assert obs == "Repeat the word: stone" and env.env_current_obs() == obs
        assert info["openenv_observation"] == {"prompt": obs, "attempts_left": 2}
        first = (await env.step({"agent_0": "a pebble"}))["agent_0"]
        assert (first.reward, first.terminated, first.obs) == (0.0, False, "Not quite. Repeat the word: stone")
        assert (await env.state())["step_count"] == 1
        second = (await env.step({"agent_0": "STONE!"}))["agent_0"]
        assert (second.reward, second.terminated, second.obs) == (1.0, True, "Correct.")
        # the same session serves the next episode
        (obs, _) = (await env.reset(seed=4))["agent_0"]
        assert obs == "Repeat the word: tiger" and (await env.state())["step_count"] == 0
    finally:
        await env.close()
        await env.close()  # twice is fine


async def test_the_env_passes_check_env(word_server: OpenEnvServer) -> None:
    env = OpenEnvEnv(word_server)
    try:
        await check_env_async(env, seed=5)
    finally:
        await env.close()


async def test_a_reply_that_is_no_action_is_a_penalised_step(word_server: OpenEnvServer) -> None:
    def strict(reply: str) -> dict[str, str]:
        if not reply.strip():
            raise InvalidAction("say something")
        return {"message": reply}

    env = OpenEnvEnv(word_server, action_from_text=strict, invalid_action_reward=-0.5)
    try:
        await env.reset(seed=0)
        bad = (await env.step({"agent_0": "  "}))["agent_0"]
        assert bad.reward == -0.5 and not bad.terminated and bad.info == {"invalid_action": "say something"}
        assert bad.obs.startswith("Invalid action: say something") and env.env_current_obs() == bad.obs
        assert (await env.state())["step_count"] == 0  # the server never saw it
        good = (await env.step({"agent_0": "apple"}))["agent_0"]
        assert good.reward == 1.0 and good.terminated
    finally:
        await env.close()
    # an action the server itself rejects (its pydantic validation) is penalised the same way
    env = OpenEnvEnv(word_server, action_from_text=lambda reply: {"message": reply, "unknown": 1})
    try:
        await env.reset(seed=0)
        out = (await env.step({"agent_0": "apple"}))["agent_0"]
        assert out.reward == -0.1 and "rejected the action" in out.info["invalid_action"]
    finally:
        await env.close()


def test_default_text_mappings_follow_the_schemas() -> None:
    message = {"properties": {"metadata": {"type": "object"}, "message": {"type": "string"}}, "required": ["message"]}
    assert text_field(message) == "message" and default_action_from_text(message)("hi") == {"message": "hi"}
    move = {"properties": {"row": {"type": "integer"}, "col": {"type": "integer"}}, "required": ["row", "col"]}
    assert text_field(move) is None
    to_move = default_action_from_text(move)
    assert to_move('I play ```json\n{"row": 1, "col": 2}\n```') == {"row": 1, "col": 2}
    for bad in ("row 1 col 2", '{"row": 1}', '{"row": 1, "col": 2, "x": 0}'):
        with pytest.raises(InvalidAction):
            to_move(bad)
    assert default_action_from_text(move, "row")("3") == {"row": "3"}
    with pytest.raises(ValueError, match="not a field"):
        default_action_from_text(move, "nope")
    with pytest.raises(ValueError, match="action_field"):
        default_action_from_text(None)
    assert default_observation_to_text({"prompt": "Q?", "feedback": "ok", "n": 1}) == "Q?"
    assert default_observation_to_text({"board": "X..", "n": 1}) == "X.."
    assert default_observation_to_text({"messages": [{"role": "user", "content": "hello"}]}) == "hello"
    assert default_observation_to_text({"a": 1, "b": [2]}) == '{"a": 1, "b": [2]}'


# -- tasks: episodes with the tiny model, one training step, evaluation ---------------------------
def test_an_openenv_task_trains_one_step_and_evaluates_on_held_out_seeds(
    word_server: OpenEnvServer, tiny_client: Any
) -> None:
    from ludic_lab import run_sync
    from ludic_lab.env_training import build_env_training

    task = openenv_task(word_server, name="word", max_steps=2, train_size=40, eval_size=6,
                        reject_incomplete_completions=False)  # fmt: skip
    assert task.env.server is word_server and task.size == 40
    run = build_env_training(task, model=tiny_client, max_tokens=6, group_size=2, prompts_per_step=2,
                             config={"lr": 1e-3, "lora_r": 4, "lora_alpha": 8})  # fmt: skip
    run.train_sync(1, progress=False)
    assert len(run.history) == 1 and tiny_client.policy_version == 1
    rollouts = run.rollouts
    assert len(rollouts) == 4 and not any(r.failed for r in rollouts)
    for r in rollouts:
        word = WORDS[r.env_seed % len(WORDS)]
        assert r.env_seed < 40 and r.steps[0].prev_obs.endswith(f"Repeat the word: {word}")
        assert 1 <= len(r.steps) <= 2
        for s in r.steps:  # the server's own score of each reply
            assert s.reward == float(word in s.action.lower())
            assert s.info["openenv_observation"]["attempts_left"] == 2 - (s.index + 1)
        assert r.steps[-1].terminated or len(r.steps) == 2
    metrics = run_sync(task.evaluate(tiny_client, k=2, temperature=1.0, max_tokens=6))
    assert metrics["num_items"] == 6 and metrics["num_samples"] == 12 and metrics["failure_rate"] == 0.0
    assert 0.0 <= metrics["accuracy"] <= metrics["pass@2"] <= 1.0 and "total_reward > 0" in metrics["success_rule"]
    result = run_sync(evaluate_openenv(task, tiny_client, seeds=[40, 41], max_tokens=4))
    assert sorted(result.table["env_seed"]) == [40, 41]


def test_a_server_given_by_url_shares_its_sessions(word_server: OpenEnvServer, tiny_client: Any) -> None:
    from ludic_lab import run_sync

    at = OpenEnvServer.at(word_server.base_url, max_sessions=2)
    task = openenv_task(at, name="word_url")
    engine = task.engine(tiny_client)
    rollouts = run_sync(
        engine.generate_rollouts(_requests(list(range(5)), kind=task.name, protocol=task.protocol_kind), max_steps=1)
    )
    assert len(rollouts) == 5 and not any(r.failed for r in rollouts)
    at.close_sync()
    assert OpenEnvServer.at(word_server.base_url).start_sync().started  # closing it left it running


# -- failures ---------------------------------------------------------------------------------------
def test_a_server_that_is_down_or_cannot_start_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(OpenEnvServerError, match="no OpenEnv server answers at .*Start it first"):
        openenv_task(url)
    t0 = time.monotonic()
    with pytest.raises(
        OpenEnvServerError, match=r"exited with code \d+ before it was healthy(.|\n)*no_such_module"
    ) as e:
        OpenEnvServer.launch("no_such_module.app:app", cwd=SERVERS).start_sync()
    assert time.monotonic() - t0 < 60
    log = re.search(r"log (\S+):\n", str(e.value))
    assert log is not None and Path(log.group(1)).is_file()  # kept for the user to read
    Path(log.group(1)).unlink()
    with pytest.raises(ValueError, match="import path"):
        OpenEnvServer.launch("not_an_import_path")


def test_a_missing_openenv_package_is_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    from ludic_lab.extras import MissingExtraError

    monkeypatch.setitem(sys.modules, "openenv", None)
    with pytest.raises(MissingExtraError, match="'openenv' extra"):
        OpenEnvServer.at("http://127.0.0.1:1").start_sync()


async def test_a_step_slower_than_the_timeout_fails_that_episode_only(
    word_server: OpenEnvServer, tiny_client: Any
) -> None:
    factory = OpenEnvEnvFactory(word_server, {"timeout_s": 1.0, "reset_kwargs": lambda s: {"delay_s": 4.0 * (s == 1)}})
    t0 = time.monotonic()
    rollouts = await _engine(tiny_client, factory).generate_rollouts(_requests([0, 1, 2]))
    assert time.monotonic() - t0 < 20
    by_seed = {r.env_seed: r for r in rollouts}
    slow = by_seed[1]
    assert slow.failed and slow.meta["failure_cause"] == "env_error"
    assert "did not answer within 1 s" in (slow.error or "")
    assert not by_seed[0].failed and not by_seed[2].failed


async def test_after_a_timeout_the_next_reset_opens_a_fresh_session(word_server: OpenEnvServer) -> None:
    env = OpenEnvEnv(word_server, timeout_s=0.5, reset_kwargs=lambda s: {"delay_s": 2.0 * (s == 1)})
    try:
        await env.reset(seed=1)
        with pytest.raises(OpenEnvError, match=r"OpenEnv step at .* did not answer within 0.5 s"):
            await env.step({"agent_0": "river"})
        (obs, _) = (await env.reset(seed=0))["agent_0"]  # not the slow step's late answer
        assert obs == "Repeat the word: apple"
        assert (await env.step({"agent_0": "apple"}))["agent_0"].reward == 1.0
    finally:
        await env.close()


async def test_a_server_at_capacity_queues_the_episode_then_says_what_to_do(word_server: OpenEnvServer) -> None:
    at = OpenEnvServer.at(word_server.base_url)  # no max_sessions: the server's refusals are retried
    held = [OpenEnvEnv(at) for _ in range(8)]  # the app's max_concurrent_envs
    try:
        with pytest.warns(UserWarning, match="max_sessions"):  # once per server
            for env in held:  # (a session of an earlier test may linger a moment: refused, retried)
                await env.reset(seed=0)
            with pytest.raises(OpenEnvError, match=r"refused this episode a session(.|\n)*max_sessions=N"):
                await OpenEnvEnv(at, session_wait_s=0.5).reset(seed=0)
        late = OpenEnvEnv(at, session_wait_s=20.0)
        waiting = asyncio.ensure_future(late.reset(seed=2))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        await held.pop().close()  # a session frees: the waiting episode gets it
        (obs, _) = (await asyncio.wait_for(waiting, 20))["agent_0"]
        assert obs == "Repeat the word: cloud"
        await late.close()
    finally:
        for env in held:
            await env.close()


async def test_a_server_killed_mid_episode_fails_that_episode_and_is_started_again(
    word_server: OpenEnvServer, tiny_client: Any, tmp_path: Path
) -> None:
    """Last in this file: the module's server is killed here (and restarted for the next episode)."""
    sent = []

    def to_action(reply: str) -> dict[str, str]:
        sent.append(reply)
        return {"message": reply}

    factory = OpenEnvEnvFactory(
        word_server, {"action_from_text": to_action, "reset_kwargs": lambda s: {"delay_s": 60.0 * (s == 1)}}
    )
    log = tmp_path / "rollouts.jsonl"
    engine = _engine(tiny_client, factory, jsonl_path=log)
    batch = asyncio.ensure_future(engine.generate_rollouts(_requests([0, 1, 2])))
    deadline = time.monotonic() + 60
    while not (len(sent) == 3 and log.exists() and len(log.read_text().splitlines()) == 2):
        assert time.monotonic() < deadline and not batch.done()
        await asyncio.sleep(0.05)
    # seeds 0 and 2 are done, seed 1 waits in its (slow) step: kill the server under it
    assert word_server.pid is not None
    os.kill(word_server.pid, signal.SIGKILL)
    rollouts = await asyncio.wait_for(batch, 30)
    by_seed = {r.env_seed: r for r in rollouts}
    dead = by_seed[1]
    assert dead.failed and dead.meta["failure_cause"] == "env_error"
    assert "OpenEnv step" in (dead.error or "") and "exited with code -9" in (dead.error or "")
    assert not by_seed[0].failed and not by_seed[2].failed and len(by_seed[0].steps) == 1
    # the next episode starts the server again
    again = await engine.generate_rollouts(_requests([3]))
    assert not again[0].failed and word_server.restarts == 1 and word_server.exit_code() is None
