"""The workspace demo's SFT warm-up (``ludic_lab.demos.workspace_warmup``): the demonstrated
reply of every shipped task is the ``edit_file`` call of its located fix; the demonstration
client's episodes, through the demo's own agent and the real workspace, resolve their tasks by
the hidden tests with exactly the ids the chat template gives the reply; one SFT step on them
trains the policy on those ids."""

from __future__ import annotations

import json

import pytest

from ludic_lab.data.bugfix import load_bugfix_tasks
from ludic_lab.demos.workspace_task import located_edit, located_instruction, workspace_edit_task
from ludic_lab.demos.workspace_warmup import CLOSING_REPLY, DemonstrationClient, located_reply
from ludic_lab.eval import evaluate
from ludic_lab.rollouts import EnvSpec, ProtocolSpec
from tests.workspace_helpers import machine_as_before, needs_bwrap  # noqa: F401 - a fixture

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_the_demonstrated_reply_is_the_located_fix_of_every_task(split: str) -> None:
    for task in load_bugfix_tasks(split):  # type: ignore[arg-type]
        messages = [{"role": "system", "content": "s"}, {"role": "user", "content": located_instruction(task)}]
        text = located_reply(messages)
        assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>"), text
        call = json.loads(text[len("<tool_call>\n") : -len("\n</tool_call>")])
        old, new = located_edit(task)
        assert call == {"name": "edit_file", "arguments": {"path": task.file, "old": old, "new": new}}, task.id
        assert located_reply([*messages, {"role": "assistant", "content": text}, {"role": "tool", "content": "ok"}]) \
            == CLOSING_REPLY  # fmt: skip
    with pytest.raises(ValueError, match="has no 'The bug is in"):
        located_reply([{"role": "user", "content": "fix it"}])


@needs_bwrap
async def test_demonstrated_episodes_resolve_their_tasks_and_train_with_sft(
    tiny_model_dir: str,
    machine_as_before: None,  # noqa: F811
) -> None:
    from transformers import AutoModelForCausalLM

    from ludic_lab.demos.backend import publisher
    from ludic_lab.inference import InferenceSpec, LocalChatClient, ReturnSpec, SamplingConfig
    from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
    from ludic_lab.training import Trainer, TrainerConfig
    from ludic_lab.training.algorithm import make_sft

    client = LocalChatClient(tiny_model_dir, max_batch_size=4)
    demo = DemonstrationClient(client)
    task = workspace_edit_task("train", limit=3)
    r = await evaluate(task.engine(demo, episode_timeout_s=300), EnvSpec(task.name), ProtocolSpec(task.protocol_kind),
                       range(3), k=1, temperature=0.0, max_tokens=96, max_steps=1, progress=False)  # fmt: skip
    assert r.summary()["accuracy"] == 1.0 and r.summary()["num_failed"] == 0, [ro.error for ro in r.rollouts]
    for ro in r.rollouts:
        trace = ro.steps[-1].trace
        calls = ro.steps[-1].info["agent"]["tool_calls"]
        assert [c["name"] for c in calls] == ["edit_file"] and calls[0]["error"] is None, calls
        turns = trace.model_turns()
        first = client.chat_template.decode(turns[0].completion_token_ids)
        assert len(turns) == 2 and client.chat_template.decode(turns[1].completion_token_ids) == CLOSING_REPLY
        assert first.startswith('<tool_call>\n{"name": "edit_file"'), first
        assert trace.num_sampled_tokens > 0 and set(trace.completion_logprobs) == {0.0}  # written, not sampled

    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sft = make_sft()
    inference = InferenceSpec(SamplingConfig(max_tokens=96), ReturnSpec.for_training())
    source = RolloutBatchSource(task.engine(demo, episode_timeout_s=300), task.requests(per_step=2, seed=0,
                                inference=inference), sft.credit_assigner, request_strategy=GRPORequestStrategy(1))  # fmt: skip
    trainer = Trainer(policy, sft, source, config=TrainerConfig(lr=1e-3, lora_r=4, max_seq_len=1024),
                      publisher=publisher(client, policy), pad_token_id=client.pad_token_id)  # fmt: skip
    try:
        (m,) = await trainer.train(1, progress=False)
    finally:
        trainer.close()
    assert m["loss"] > 0 and client.policy_version == 1, m  # cross-entropy of the demonstrated ids, then published
