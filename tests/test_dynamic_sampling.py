"""Dynamic sampling in RolloutBatchSource: groups with equal rewards are dropped and fresh
requests generated until the batch holds min_groups groups with signal, or the cap hits
(counted, warned once); off, the source behaves as before. Real engine, env and agent; the
client is the scripted ChatClient (the n-th reply to a question is 's<n>')."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import (
    EnvSpec,
    GRPORequestStrategy,
    ProtocolSpec,
    RolloutBatchSource,
    RolloutEngine,
    RolloutRequest,
)
from ludic_lab.rollouts.credit import EpisodicReturn, GroupNormalizedReturn
from ludic_lab.rollouts.dynamic_sampling import DynamicSampling
from ludic_lab.rollouts.group_signal import group_items, has_signal
from ludic_lab.types import Info, StepOutcome
from tests.helpers import ScriptedChatClient, chatml_template

Score = Callable[[int, int], float]
"""(env seed, n: how many replies to this question came before) -> reward."""

SPEC = InferenceSpec(sampling=SamplingConfig(temperature=1.0, max_tokens=8), return_=ReturnSpec.for_training())


class SeedEnv(SingleAgentEnv):
    """One turn; the reply is 's<n>', the reward ``score(env seed, n)``."""

    def __init__(self, score: Score) -> None:
        super().__init__()
        self.score, self.seed = score, 0

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self.seed = seed or 0
        return f"Question {seed}?", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=self.score(self.seed, int(action[1:])), truncated=False, terminated=True)

    def env_current_obs(self) -> str:
        return "done"


def counting_replies() -> ScriptedChatClient:
    """Replies 's<n>' where n counts the earlier requests with the same last message."""
    seen: dict[str, int] = {}

    def reply(req) -> str:
        question = str(req.messages[-1]["content"])
        seen[question] = seen.get(question, 0) + 1
        return f"s{seen[question] - 1}"

    return ScriptedChatClient(reply, chat_template=chatml_template())


def engine(score: Score) -> RolloutEngine:
    client = counting_replies()
    protocol = lambda: SingleAgentSyncProtocol(  # noqa: E731
        Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
    )
    return RolloutEngine({"seed": lambda: SeedEnv(score)}, {"agent": protocol})


def stream(per_call: int) -> tuple[Callable[[], list[RolloutRequest]], list[int]]:
    """Fresh env seeds 0, 1, 2, ... ``per_call`` per call; also returns the call log."""
    calls: list[int] = []

    def requests() -> list[RolloutRequest]:
        start = len(calls) * per_call
        calls.append(start)
        return [
            RolloutRequest(env=EnvSpec("seed"), protocol=ProtocolSpec("agent"), env_seed=start + i, inference=SPEC)
            for i in range(per_call)
        ]

    return requests, calls


def odd_seeds_informative(env_seed: int, n: int) -> float:
    """Even env seeds: every member scores 1 (no signal). Odd: 1, 0, 0.5, 0.5 for the group's
    four replies (mean 0.5: two members with advantage exactly 0)."""
    return 1.0 if env_seed % 2 == 0 else (1.0, 0.0, 0.5, 0.5)[n % 4]


def source(score: Score, per_call: int, **kw) -> tuple[RolloutBatchSource, list[int]]:
    requests, calls = stream(per_call)
    src = RolloutBatchSource(
        engine(score), requests, GroupNormalizedReturn(), request_strategy=GRPORequestStrategy(4, seed=1), **kw
    )
    return src, calls


async def test_fills_the_batch_with_groups_that_have_signal() -> None:
    requests, calls = stream(2)  # one informative group per round
    src = RolloutBatchSource(
        engine(odd_seeds_informative),
        requests,
        GroupNormalizedReturn(),
        request_strategy=GRPORequestStrategy(4),
        dynamic_sampling=DynamicSampling(min_groups=3, max_rounds=5),
    )
    batch = await src.next_batch()
    assert len(calls) == 3 and len(src.last_rollouts) == 24  # three rounds of 2 groups of 4
    groups = group_items(batch.items)
    assert len(groups) == 3 and all(len(m) == 4 for m in groups.values())
    assert all(any(has_signal(it) for it in members) for members in groups.values())
    # every member of a kept group stays, the two zero-advantage ones included
    assert sum(1 for it in batch.items if it.weight == 0.0) == 6
    assert {it.meta["agent_id"] for it in batch.items} == {"agent_0"}
    m = batch.meta
    assert (m["dynamic/rounds"], m["dynamic/generated_groups"], m["dynamic/dropped_groups"]) == (3, 6, 3)
    assert (m["dynamic/dropped_items"], m["dynamic/informative_groups"], m["dynamic/short"]) == (12, 3, 0.0)
    assert m["dynamic/surplus_groups"] == 0 and m["attempts"] == 3
    assert m["signal_token_frac"] == pytest.approx(0.5)  # 2 of 4 members per group carry a weight
    assert m["num_rollouts"] == 24 and m["credit/zero_std_groups"] == 3


async def test_off_keeps_groups_without_signal() -> None:
    requests, calls = stream(2)
    src = RolloutBatchSource(engine(odd_seeds_informative), requests, GroupNormalizedReturn(),
                             request_strategy=GRPORequestStrategy(4))  # fmt: skip
    batch = await src.next_batch()
    assert len(calls) == 1 and len(batch) == 8 and not any(k.startswith("dynamic/") for k in batch.meta)
    assert batch.meta["signal_token_frac"] == pytest.approx(0.25)


async def test_surplus_groups_are_trimmed_unless_kept() -> None:
    always_mixed = lambda e, s: float(s % 2)  # noqa: E731
    src, calls = source(always_mixed, 4, dynamic_sampling=DynamicSampling(min_groups=2))
    batch = await src.next_batch()
    assert len(calls) == 1 and len(group_items(batch.items)) == 2 and len(batch) == 8
    assert batch.meta["dynamic/surplus_groups"] == 2 and batch.meta["dynamic/informative_groups"] == 2
    src, _ = source(always_mixed, 4, dynamic_sampling=DynamicSampling(min_groups=2, keep_surplus=True))
    batch = await src.next_batch()
    assert len(group_items(batch.items)) == 4 and batch.meta["dynamic/surplus_groups"] == 0


async def test_stops_at_the_cap_says_so_once_and_returns_what_it_has() -> None:
    src, calls = source(lambda e, s: 1.0, 2, dynamic_sampling=DynamicSampling(min_groups=2, max_rounds=3))
    with pytest.warns(UserWarning, match=r"0 of min_groups=2 groups with signal after max_rounds=3"):
        batch = await src.next_batch()
    assert len(calls) == 3 and len(batch) == 0
    assert batch.meta["dynamic/short"] == 1.0 and batch.meta["dynamic/dropped_groups"] == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second short batch is only counted
        batch = await src.next_batch()
    assert batch.meta["dynamic/short"] == 1.0 and len(calls) == 6


async def test_needs_groups() -> None:
    requests, _ = stream(2)
    src = RolloutBatchSource(
        engine(lambda e, s: float(s % 2)), requests, EpisodicReturn(), dynamic_sampling=DynamicSampling(min_groups=1)
    )
    with pytest.raises(ValueError, match="GRPORequestStrategy"):
        await src.next_batch()


def test_config_errors_say_what_to_do() -> None:
    with pytest.raises(ValueError, match="min_groups must be an int >= 1"):
        DynamicSampling(min_groups=0)
    with pytest.raises(ValueError, match="max_rounds must be an int >= 1"):
        DynamicSampling(min_groups=2, max_rounds=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="keep_surplus"):
        DynamicSampling(min_groups=2, keep_surplus=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="take the place of min_items / max_attempts"):
        source(lambda e, s: 1.0, 2, dynamic_sampling=DynamicSampling(min_groups=2), max_attempts=3)
    with pytest.raises(TypeError, match=r"DynamicSampling\(min_groups"):
        source(lambda e, s: 1.0, 2, dynamic_sampling={"min_groups": 2})


def test_trains_with_make_dapo_on_the_tiny_model(tiny_model_dir: str) -> None:
    """End to end: the tiny model samples digits, DAPO trains on a dynamically filled batch."""
    from trainer_helpers import digits_source, load_model

    from ludic_lab.inference.local.client import LocalChatClient
    from ludic_lab.training.algorithm import make_dapo
    from ludic_lab.training.config import TrainerConfig
    from ludic_lab.training.trainer import Trainer

    algo = make_dapo()
    client = LocalChatClient(tiny_model_dir)
    odd_length = lambda text: float(len(text) % 2)  # noqa: E731 - rewards that differ within most groups
    plain = digits_source(client, algo.credit_assigner, prompts=2, group_size=4, max_tokens=6, reward_fn=odd_length)
    src = RolloutBatchSource(
        plain.engine,
        plain.requests_fn,
        algo.credit_assigner,
        request_strategy=plain.request_strategy,
        dynamic_sampling=DynamicSampling(min_groups=3, max_rounds=4),
    )
    trainer = Trainer(load_model(tiny_model_dir), algo, src, config=TrainerConfig(lr=1e-3, max_seq_len=128))
    m = trainer.train_sync(1, progress=False)[0]
    assert m["source/dynamic/rounds"] >= 2  # 2 groups per round, 3 wanted
    assert m["source/dynamic/informative_groups"] == 3 and m["source/dynamic/short"] == 0.0
    assert not m.get("skipped") and m["source/signal_token_frac"] > 0 and m["grad_norm"] > 0
    assert m["source/zero_variance_groups_dropped"] == 0  # the source already dropped them
