"""The Redis actor applies rewards (a judge) before credit: scores reach the pushed items'
weights and a judge failure's rollout is not pushed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("redis", reason="the pipeline extra: pip install 'ludic_lab[pipeline]'")
pytest.importorskip("msgpack", reason="the pipeline extra: pip install 'ludic_lab[pipeline]'")

from redis_helpers import RedisServer, redis_server_fixture

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.judges import Criterion, Rubric, RubricJudge
from ludic_lab.parsers import identity_parser
from ludic_lab.pipeline import PipelineBatchSource, run_pipeline_actor
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.training.credit_assignment import EpisodicReturn
from ludic_lab.types import StepOutcome
from tests.helpers import ScriptedChatClient, chatml_template

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    yield from redis_server_fixture(tmp_path_factory)


class Echo(SingleAgentEnv):
    def env_reset(self, *, seed=None):
        return f"say something ({seed})", {}

    def env_step(self, action):
        return StepOutcome(obs="ok", reward=0.5, truncated=False, terminated=True, info={})

    def env_current_obs(self):
        return "ok"


async def test_actor_applies_rewards_before_credit(server: RedisServer) -> None:
    client = ScriptedChatClient(lambda req: "hello", chat_template=chatml_template(), policy_version=1)
    engine = RolloutEngine(
        {"echo": Echo},
        {
            "agent": lambda: SingleAgentSyncProtocol(
                Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
            )
        },
    )
    spec = InferenceSpec(SamplingConfig(max_tokens=8), ReturnSpec.for_training())

    def requests() -> list[RolloutRequest]:
        return [RolloutRequest(EnvSpec("echo"), ProtocolSpec("agent"), env_seed=s, inference=spec) for s in (1, 2)]

    def judge_script(req: Any) -> str:
        text = " ".join(m["content"] for m in req.messages)
        return '{"verdicts": {"good": "yes"}}' if "(1)" in text else "no idea"

    judge = RubricJudge(ScriptedChatClient(judge_script), Rubric((Criterion("good", "It is good."),)))
    queue = f"q-{uuid.uuid4().hex[:8]}"
    stats = await run_pipeline_actor(
        engine, requests, EpisodicReturn(), server.url, queue, max_rounds=1, rewards=[judge]
    )
    assert stats.items_pushed == 1  # the rollout whose judge failed is not pushed
    src = PipelineBatchSource(server.url, queue, 1, timeout_s=20.0, block_s=0.2)
    try:
        batch = await src.next_batch()
    finally:
        await src.aclose()
    assert [it.weight for it in batch.items] == [1.5]  # env 0.5 + judge 1.0
