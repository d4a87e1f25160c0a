"""Rollout files take any text: a lone surrogate (text decoded from broken model bytes) made
``save_rollouts`` raise ``UnicodeEncodeError``; now it round-trips exactly."""

from __future__ import annotations

import json
from pathlib import Path

from ludic_lab.jsonl import json_line
from ludic_lab.types import Rollout, Step, load_rollouts, save_rollouts

LONE = "caf\u00e9 \ud800 end"  # a lone high surrogate between ordinary text


def _rollout(text: str) -> Rollout:
    step = Step(index=0, prev_obs="q", action=text, parsed_action=text, next_obs="", reward=1.0, terminated=True)
    return Rollout(steps=(step,), meta={"note": text})


def test_save_rollouts_round_trips_a_lone_surrogate(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    rs = [_rollout("plain caf\u00e9"), _rollout(LONE)]
    assert save_rollouts(rs, path) == 2
    back = load_rollouts(path)
    assert back == rs and back[1].steps[0].action == LONE and back[1].meta["note"] == LONE
    first, second = path.read_text(encoding="utf-8").splitlines()
    assert "caf\u00e9" in first  # readable UTF-8 where possible
    assert "\\ud800" in second  # escaped only where UTF-8 cannot hold it


def test_json_line() -> None:
    assert json_line({"a": "\u00e9"}) == '{"a": "\u00e9"}'
    assert json_line({"a": "\udc80"}) == '{"a": "\\udc80"}' and json.loads(json_line({"a": "\udc80"})) == {
        "a": "\udc80"
    }
    assert json_line({"x": float("nan")}) == '{"x": NaN}'


async def test_engine_jsonl_keeps_a_rollout_with_a_lone_surrogate(tmp_path: Path) -> None:
    from ludic_lab.interaction.base import InteractionProtocol
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
    from tests.helpers import CountingEnv

    class Surrogate(InteractionProtocol):
        async def run(self, *, env, max_steps, env_seed=None, sampling_seed=None, inference=None):
            return [_rollout(LONE)]

    path = tmp_path / "e.jsonl"
    engine = RolloutEngine({"e": CountingEnv}, {"p": Surrogate}, jsonl_path=path)
    (r,) = await engine.generate_rollouts([RolloutRequest(EnvSpec("e"), ProtocolSpec("p"))], max_steps=1)
    (back,) = load_rollouts(path)
    assert back.steps[0].action == LONE and back.id == r.id
