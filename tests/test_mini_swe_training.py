"""One GRPO step on mini-swe-agent episodes of the tiny model (``bugfix_program_task`` with
``mini_swe_agent()`` through ``build_env_training``, the parts ``train_env`` runs): the batch
trains exactly the tokens the model sampled through the endpoint, with the hidden tests'
rewards. The tiny model writes no tool call, so mini-swe-agent answers each reply with its
format error (dropping the reply from its history: a new segment per call) and stops after
three. Its own module: the step takes ~40 s on the shared machine.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

from ludic_lab.task.workspace_program import bugfix_program_task
from tests.workspace_helpers import needs_bwrap, sandbox_processes, sandbox_processes_left, workspace_dirs

if importlib.util.find_spec("minisweagent") is None:  # not imported here: mini_swe_agent imports it quietly
    pytest.skip("the swe extra: pip install -e '.[swe]'", allow_module_level=True)
pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
pytestmark = [needs_bwrap, pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def machine_as_before(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LUDIC_LAB_CACHE", str(tmp_path / "cache"))  # mini-swe-agent's config folder too
    dirs, running = workspace_dirs(), set(sandbox_processes())
    yield
    assert sandbox_processes_left(running) == [], "a sandboxed process outlived its command"  # exits awaited
    assert workspace_dirs() - dirs == set(), "a workspace or pool directory was left behind"


def test_one_grpo_step_on_mini_swe_agent_episodes_trains_the_sampled_tokens(tiny_model_dir: str) -> None:
    """train_env's parts over mini-swe-agent episodes of the tiny model (it writes no tool call,
    so mini-swe-agent answers each reply with its format error and stops after three)."""
    from ludic_lab.agents.mini_swe import mini_swe_agent
    from ludic_lab.env_training import build_env_training
    from ludic_lab.inference import LocalChatClient
    from ludic_lab.task.external.verifiers import endpoint_for

    sampler = LocalChatClient(tiny_model_dir, max_batch_size=4)
    sampled: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    complete = sampler.complete

    async def recording(request: Any) -> Any:
        out = await complete(request)
        sampled.append((tuple(out[0].prompt_token_ids), tuple(out[0].completion_token_ids)))
        return out

    sampler.complete = recording  # type: ignore[method-assign]
    task = bugfix_program_task(mini_swe_agent(step_limit=4), "heldout", limit=1)
    run = build_env_training(task, model=sampler, group_size=2, prompts_per_step=1, max_tokens=8, out=None,
                             config={"lr": 1e-2, "max_seq_len": 8192})  # fmt: skip
    try:
        run.train_sync(1, progress=False)
    finally:
        endpoint_for(sampler).stop()
        run.trainer.close()
    (metrics,) = run.history
    rollouts = run.rollouts
    assert len(rollouts) == 2 and not any(r.failed for r in rollouts), [r.error for r in rollouts]
    action_tokens = 0
    for r in rollouts:
        assert r.meta["agent_program"]["calls"] == 3  # three format errors in a row end mini-swe-agent's run
        assert r.total_reward == 0.0 and r.steps[-1].info["resolved"] is False  # the hidden tests' verdict
        assert json.loads(r.steps[-1].parsed_action)["exit_status"] == "RepeatedFormatError"
        for step in r.steps:  # a format error drops the reply from mini-swe-agent's history: a new segment
            ids = step.trace.completion_token_ids
            mask = step.trace.completion_mask or (1,) * len(ids)  # None: every token sampled
            own = tuple(t for t, m in zip(ids, mask, strict=True) if m)
            turns = step.trace.model_turns()
            assert own == tuple(t for turn in turns for t in turn.completion_token_ids)
            for turn in turns:
                assert (tuple(turn.prompt_token_ids), tuple(turn.completion_token_ids)) in sampled
            action_tokens += len(own)
    assert sampler.policy_version == 1 and metrics["action_tokens"] == action_tokens, metrics
