"""A launched OpenEnv server killed (SIGKILL) mid-batch, against openenv-core itself.

The word server (``tests/openenv_servers/word_env``) is launched with ``max_sessions=4`` and
eight episodes are started: four hold a session, each waiting in its step (``hold_while``: the
step answers once a flag file is gone), four queue for a session. The server is killed under
them. Only the four it was serving fail, naming its death (exit code -9, the log's tail); the
server is started again at once, and the four queued episodes run on it and succeed. A server
that cannot be started again (an app that refuses a second start, or ``max_restarts=0``) fails
the queued episodes, within the restart's bound, with an error that says why.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("openenv")
import psutil

from ludic_lab.integrations.openenv_env import OpenEnvEnvFactory
from ludic_lab.integrations.openenv_server import OpenEnvServer
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.types import Rollout

pytestmark = pytest.mark.timeout(240)

SERVERS = str(Path(__file__).parent / "openenv_servers")
APP = "word_env.server.app:app"
WORDS = ("apple", "river", "cloud", "stone", "tiger", "music", "bread", "light")  # the server's own list


@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir: str) -> Any:
    from ludic_lab.inference import LocalChatClient

    return LocalChatClient(tiny_model_dir, max_batch_size=8)


def _engine(client: Any, factory: OpenEnvEnvFactory) -> RolloutEngine:
    from ludic_lab.agents import Agent
    from ludic_lab.context import FullDialog
    from ludic_lab.interaction import SingleAgentSyncProtocol
    from ludic_lab.parsers import identity_parser

    def protocol() -> SingleAgentSyncProtocol:
        return SingleAgentSyncProtocol(
            Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
        )

    return RolloutEngine({"word": factory}, {"agent": protocol})


def _requests(n: int) -> list[RolloutRequest]:
    from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig

    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=4), ReturnSpec.for_training())
    return [RolloutRequest(EnvSpec("word"), ProtocolSpec("agent"), env_seed=s, inference=spec, max_steps=1)
            for s in range(n)]  # fmt: skip


async def _kill_mid_batch(
    server: OpenEnvServer, client: Any, hold: Path
) -> tuple[dict[int, Rollout], set[int], float, int]:
    """Eight episodes on ``server`` (``max_sessions=4``); SIGKILL the server once four of them
    wait in their step. -> (rollouts by seed, the seeds that failed in their step, seconds from
    the kill to the batch's end, the killed pid)."""
    stepping: list[str] = []

    def to_action(reply: str) -> dict[str, str]:
        stepping.append(reply)
        return {"message": reply}

    hold.touch()
    factory = OpenEnvEnvFactory(server, {"action_from_text": to_action, "reset_kwargs": {"hold_while": str(hold)}})
    batch = asyncio.ensure_future(_engine(client, factory).generate_rollouts(_requests(8)))
    deadline = time.monotonic() + 120
    while len(list(hold.parent.glob(f"{hold.name}.held-*"))) < 4:  # the server holds four steps
        assert time.monotonic() < deadline and not batch.done(), "four episodes never reached their step"
        await asyncio.sleep(0.02)
    assert len(stepping) == 4  # the other four queue for one of the four sessions
    pid = server.pid
    assert pid is not None
    psutil.Process(pid).kill()  # SIGKILL
    t0 = time.monotonic()
    hold.unlink()  # the restarted server's steps answer at once
    rollouts = await asyncio.wait_for(batch, 150)
    took = time.monotonic() - t0
    by_seed = {r.env_seed: r for r in rollouts}
    assert len(by_seed) == 8
    served = {s for s, r in by_seed.items() if r.failed and "OpenEnv step" in (r.error or "")}
    return by_seed, served, took, pid


def _assert_killed_under(r: Rollout) -> None:
    """``r`` was on the killed server: it failed naming the server's death and log."""
    assert r.failed and r.meta["failure_cause"] == "env_error", r.error
    assert "OpenEnv step" in (r.error or "") and "the server process exited with code -9" in (r.error or ""), r.error
    assert "uvicorn word_env.server.app:app" in (r.error or ""), r.error  # the log's tail (its command line)


async def test_a_server_killed_mid_batch_fails_only_the_episodes_it_was_serving(
    tiny_client: Any, tmp_path: Path
) -> None:
    # the sandboxed server sees the hold file through `writable` (the host's tmp_path, bound in)
    with OpenEnvServer.launch(APP, cwd=SERVERS, max_sessions=4, writable=[tmp_path]) as server:
        by_seed, served, took, pid = await _kill_mid_batch(server, tiny_client, tmp_path / "hold")
        failed = {s for s, r in by_seed.items() if r.failed}
        assert failed == served and len(served) == 4, {s: r.error for s, r in by_seed.items()}
        for s in served:
            _assert_killed_under(by_seed[s])
        for s in set(by_seed) - served:  # queued when it died: they ran on the restarted server
            r = by_seed[s]
            assert not r.failed and r.steps[0].prev_obs.endswith(f"Repeat the word: {WORDS[s]}"), r.error
            assert r.steps[0].info["openenv_observation"]["attempts_left"] == 1
        assert server.restarts == 1 and server.generation == 2 and server.pid not in (None, pid)
        assert server.exit_code() is None
        assert took < 60, took


@pytest.mark.parametrize("why", ["app refuses a second start", "max_restarts=0"])
async def test_a_server_that_cannot_start_again_fails_the_queued_episodes_saying_why(
    tiny_client: Any, tmp_path: Path, why: str
) -> None:
    options: dict[str, Any] = {"cwd": SERVERS, "max_sessions": 4, "startup_timeout_s": 30.0, "writable": [tmp_path]}
    if why == "max_restarts=0":
        options["max_restarts"] = 0
    else:
        options["env"] = {"WORD_ENV_START_ONCE": str(tmp_path / "started")}
    with OpenEnvServer.launch(APP, **options) as server:
        by_seed, served, took, _ = await _kill_mid_batch(server, tiny_client, tmp_path / "hold")
        assert len(served) == 4 and all(r.failed for r in by_seed.values())
        for s in served:
            _assert_killed_under(by_seed[s])
        for s in set(by_seed) - served:
            r = by_seed[s]
            assert r.meta["failure_cause"] == "env_error" and not r.steps, r.error
            assert "the OpenEnv server 'word_env.server.app:app' exited with code -9" in (r.error or ""), r.error
            if why == "max_restarts=0":
                assert "restarted 0 time(s) already (max_restarts=0)" in (r.error or ""), r.error
            else:
                assert "could not be started again" in (r.error or ""), r.error
                assert "refuses to start again" in (r.error or ""), r.error  # the failed start's own log
        assert server.restarts == (0 if why == "max_restarts=0" else 1)
        assert took < server.restart_wait_s + 30, took
