"""RolloutRequest (pure data, JSON round trip, episode seeds) and the request strategies."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest

from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig, ToolRequest
from ludic_lab.interaction.base import InteractionProtocol
from ludic_lab.rollouts import (
    EnvSpec,
    GRPORequestStrategy,
    IdentityStrategy,
    ProtocolSpec,
    RequestStrategy,
    RolloutEngine,
    RolloutRequest,
)
from ludic_lab.types import Info, Rollout, Step, StepOutcome


def req(**kw: Any) -> RolloutRequest:
    return RolloutRequest(EnvSpec("qa", {"split": "train"}), ProtocolSpec("single_agent"), **kw)


# -- RolloutRequest ----------------------------------------------------------------------------
def test_request_json_round_trip_with_inference_spec():
    spec = InferenceSpec(
        sampling=SamplingConfig(temperature=0.7, max_tokens=32, stop=("</answer>",), seed=3),
        return_=ReturnSpec.for_training(top_logprobs_k=2),
        extensions={"tools": ToolRequest(tools=[{"type": "function", "function": {"name": "f"}}]), "x": 1},
    )
    r = req(
        num_episodes=4, env_seed=1, sampling_seed=2, inference=spec, group_id="g", max_steps=5,
        share_env_seed=False, meta={"problem": "p", "n": [1, 2]},
    )  # fmt: skip
    back = RolloutRequest.from_json(r.to_json())
    assert back == r
    assert isinstance(back.inference.extensions["tools"], ToolRequest)
    assert back.inference.sampling.stop == ("</answer>",)
    json.loads(r.to_json())  # plain JSON
    assert RolloutRequest.from_dict(req().to_dict()) == req()


def test_request_validation_errors():
    with pytest.raises(ValueError, match="num_episodes"):
        req(num_episodes=0)
    with pytest.raises(ValueError, match="num_episodes"):
        req(num_episodes=True)
    with pytest.raises(ValueError, match="env_seed"):
        req(env_seed=-1)
    with pytest.raises(TypeError, match="sampling_seed"):
        req(sampling_seed=1.5)
    with pytest.raises(ValueError, match="max_steps"):
        req(max_steps=0)
    with pytest.raises(TypeError, match="EnvSpec"):
        RolloutRequest("qa", ProtocolSpec("p"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ProtocolSpec"):
        RolloutRequest(EnvSpec("qa"), {"kind": "p"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="InferenceSpec"):
        req(inference={"temperature": 1})
    with pytest.raises(ValueError, match="group_id"):
        req(group_id="")
    with pytest.raises(ValueError, match="disagrees"):
        req(group_id="a", meta={"group_id": "b"})
    with pytest.raises(ValueError, match="kind"):
        EnvSpec("")
    with pytest.raises(TypeError, match="kwargs"):
        ProtocolSpec("p", kwargs=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown fields"):
        RolloutRequest.from_dict({**req().to_dict(), "seed": 3})
    with pytest.raises(TypeError):
        RolloutRequest(EnvSpec("qa"), ProtocolSpec("p"), 3)  # type: ignore[misc]  # keyword-only after the specs
    with pytest.raises(TypeError, match="not JSON serializable"):
        req(meta={"x": object()}).to_json()


def test_request_copies_mutable_inputs():
    kwargs = {"a": 1}
    meta = {"m": 1}
    r = RolloutRequest(EnvSpec("qa", kwargs), ProtocolSpec("p"), meta=meta)
    kwargs["a"] = 2
    meta["m"] = 2
    assert r.env.kwargs == {"a": 1} and r.meta == {"m": 1}


def test_request_group_id_from_meta_and_episode_seeds():
    r = req(meta={"group_id": 17}, num_episodes=3, env_seed=5, sampling_seed=50)
    assert r.group_id == "17" and r.shares_env_seed
    assert [r.episode_seeds(e) for e in range(3)] == [(5, 50), (5, 51), (5, 52)]
    r2 = req(num_episodes=3, env_seed=5)
    assert not r2.shares_env_seed
    assert [r2.episode_seeds(e) for e in range(3)] == [(5, None), (6, None), (7, None)]
    r3 = req(num_episodes=2, env_seed=5, group_id="g", share_env_seed=False)  # explicit override
    assert [r3.episode_seeds(e)[0] for e in range(2)] == [5, 6]
    with pytest.raises(IndexError):
        r3.episode_seeds(2)


# -- IdentityStrategy --------------------------------------------------------------------------
def test_identity_strategy_returns_requests_unchanged():
    rs = [req(env_seed=1), req(num_episodes=3)]
    out = IdentityStrategy().expand(rs)
    assert out == rs and out is not rs
    assert isinstance(IdentityStrategy(), RequestStrategy)


# -- GRPORequestStrategy -----------------------------------------------------------------------
def _groups(expanded: list[RolloutRequest]) -> dict[str, list[RolloutRequest]]:
    g: dict[str, list[RolloutRequest]] = defaultdict(list)
    for r in expanded:
        g[r.group_id].append(r)
    return dict(g)


def test_grpo_groups_share_env_seed_vary_sampling_seed_and_have_distinct_ids():
    strat = GRPORequestStrategy(4, seed=0)
    assert isinstance(strat, RequestStrategy)
    base = [req(env_seed=11), req(), req(sampling_seed=1000), req(meta={"problem": "p4"})]
    out = strat.expand(base)
    assert len(out) == 16
    assert all(r.num_episodes == 1 for r in out)
    groups = _groups(out)
    assert len(groups) == 4  # one id per group, never shared across groups
    assert list(groups) == list(dict.fromkeys(r.group_id for r in out))  # contiguous, in request order
    for members in groups.values():
        assert len(members) == 4
        assert len({m.env_seed for m in members}) == 1
        assert None not in {m.env_seed for m in members}
        seeds = [m.sampling_seed for m in members]
        assert len(set(seeds)) == 4 and seeds == list(range(seeds[0], seeds[0] + 4))
    g = list(groups.values())
    assert g[0][0].env_seed == 11  # a given env seed is kept
    assert [m.sampling_seed for m in g[2]] == [1000, 1001, 1002, 1003]
    assert g[3][0].meta == {"problem": "p4"}  # meta and specs carried over
    assert all(m.env == base[0].env and m.protocol == base[0].protocol for m in out)


def test_grpo_is_deterministic_given_a_seed_but_group_ids_stay_unique():
    base = [req(), req(), req(env_seed=3)]
    a = GRPORequestStrategy(3, seed=123).expand(base)
    b = GRPORequestStrategy(3, seed=123).expand(base)
    assert [(r.env_seed, r.sampling_seed) for r in a] == [(r.env_seed, r.sampling_seed) for r in b]
    assert not {r.group_id for r in a} & {r.group_id for r in b}  # two actors never merge groups
    c = GRPORequestStrategy(3, seed=124).expand(base)
    assert [r.env_seed for r in c[:6]] != [r.env_seed for r in a[:6]]
    # successive calls keep drawing new problems and fresh group ids
    strat = GRPORequestStrategy(2, seed=0)
    first, second = strat.expand([req()]), strat.expand([req()])
    assert first[0].env_seed != second[0].env_seed
    assert first[0].group_id != second[0].group_id


def test_grpo_keeps_a_request_group_id_and_splits_multi_episode_requests():
    strat = GRPORequestStrategy(2, seed=0)
    out = strat.expand([req(group_id="q1"), req(meta={"group_id": "q2"}), req(num_episodes=3, env_seed=40)])
    assert [r.group_id for r in out[:4]] == ["q1", "q1", "q2", "q2"]
    assert out[2].meta == {"group_id": "q2"}
    rest = _groups(out[4:])
    assert len(rest) == 3  # one group per episode of the 3-episode request
    assert [m[0].env_seed for m in rest.values()] == [40, 41, 42]
    # a grouped multi-episode request: its episodes share the env seed, groups get suffixed ids
    out2 = strat.expand([req(num_episodes=2, group_id="g", meta={"group_id": "g"})])
    assert [r.group_id for r in out2] == ["g/0", "g/0", "g/1", "g/1"]
    assert [r.meta["group_id"] for r in out2] == ["g/0", "g/0", "g/1", "g/1"]
    assert len({r.env_seed for r in out2}) == 1  # drawn once: episodes of a grouped request share it


def test_grpo_group_size_validation_and_size_one():
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(ValueError, match="group_size"):
            GRPORequestStrategy(bad)  # type: ignore[arg-type]
    out = GRPORequestStrategy(1, seed=0).expand([req(), req()])
    assert len(out) == 2 and out[0].group_id != out[1].group_id
    assert all(r.env_seed is not None and r.sampling_seed is not None for r in out)
    with pytest.raises(TypeError, match="RolloutRequest"):
        GRPORequestStrategy(2).expand([{"env": "qa"}])  # type: ignore[list-item]
    assert GRPORequestStrategy(2).expand([]) == []


def test_grpo_unseeded_strategy_still_groups_correctly():
    out = GRPORequestStrategy(3).expand([req()])
    assert len({r.env_seed for r in out}) == 1 and len({r.sampling_seed for r in out}) == 3


# -- GRPO through the engine ------------------------------------------------------------------
class EchoSeedEnv(SingleAgentEnv):
    """Shows the reset seed as the observation: the rollout proves which problem it got."""

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self.seed = seed
        return f"problem {seed}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=float(len(action) % 3), truncated=False, terminated=True)

    def env_current_obs(self) -> str:
        return f"problem {self.seed}"


class SeedEchoProtocol(InteractionProtocol):
    """One turn whose action is derived from the sampling seed."""

    async def run(self, *, env, max_steps, env_seed=None, sampling_seed=None, inference=None) -> list[Rollout]:
        ((aid, (obs, _)),) = env.reset(seed=env_seed).items()
        action = "x" * (sampling_seed % 7)
        out = env.step({aid: action})[aid]
        step = Step(index=0, prev_obs=obs, action=action, parsed_action=action, next_obs=out.obs,
                    reward=out.reward, terminated=True)  # fmt: skip
        return [Rollout(steps=(step,), agent_id=aid)]


def test_grpo_through_the_engine_gives_groups_of_siblings():
    engine = RolloutEngine({"echo": EchoSeedEnv}, {"one_turn": SeedEchoProtocol})
    base = [RolloutRequest(EnvSpec("echo"), ProtocolSpec("one_turn"), meta={"i": i}) for i in range(3)]
    expanded = GRPORequestStrategy(4, seed=7).expand(base)
    out = engine.generate_rollouts_sync(expanded, max_steps=1)
    assert len(out) == 12
    groups: dict[str, list[Rollout]] = defaultdict(list)
    for r in out:
        groups[r.group_id].append(r)
    assert len(groups) == 3
    for i, members in enumerate(groups.values()):
        assert len({m.steps[0].prev_obs for m in members}) == 1  # same problem
        assert members[0].steps[0].prev_obs == f"problem {members[0].env_seed}"
        assert len({m.sampling_seed for m in members}) == 4
        assert all(m.meta["i"] == i for m in members)
