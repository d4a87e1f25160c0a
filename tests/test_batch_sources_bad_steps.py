"""One bad step never loses a batch: steps with token ids but no behaviour logprobs (or a
trace that cannot become an item) are skipped and counted, the rest of the batch trains."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from ludic_lab.rollouts import RolloutBatchSource
from ludic_lab.rollouts.saw import SAWItem, saw_items_from_rollouts
from ludic_lab.training.credit_assignment import EpisodicReturn
from ludic_lab.types import Rollout, Step, TokenTrace
from tests.helpers import ScriptedChatClient, chatml_template
from tests.test_batch_sources import make_engine, seeds_fn


def _rollout(rid: str, logprobs: Any = (-0.5, -0.25)) -> Rollout:
    trace = TokenTrace(prompt_token_ids=(1, 2, 3), completion_token_ids=(4, 5), completion_logprobs=logprobs)
    step = Step(
        index=0, prev_obs="q", action="a", parsed_action="a", next_obs="", reward=1.0, terminated=True, trace=trace
    )
    return Rollout(steps=(step,), id=rid)


def test_step_without_logprobs_is_skipped_counted_and_warned():
    good, bare = _rollout("good"), _rollout("bare", logprobs=None)
    weights = {("good", 0): 1.0, ("bare", 0): 1.0}
    with pytest.warns(UserWarning, match="1 step.*no behaviour logprobs.*ReturnSpec.for_training"):
        items, counts = saw_items_from_rollouts([good, bare], weights)
    assert [it.rollout_id for it in items] == ["good"]
    assert counts["steps_without_logprobs"] == 1 and counts["invalid_steps"] == 0


def test_step_whose_item_cannot_be_built_is_skipped_and_counted(monkeypatch: pytest.MonkeyPatch):
    real = SAWItem.from_step.__func__

    def picky(cls: Any, rollout: Rollout, step: Step, weight: float, **kw: Any) -> SAWItem:
        if rollout.id == "odd":
            raise ValueError("trace is inconsistent")
        return real(cls, rollout, step, weight, **kw)

    monkeypatch.setattr(SAWItem, "from_step", classmethod(picky))
    with pytest.warns(UserWarning, match="first: rollout odd step 0: trace is inconsistent"):
        items, counts = saw_items_from_rollouts([_rollout("a"), _rollout("odd")], {("a", 0): 1.0, ("odd", 0): 1.0})
    assert [it.rollout_id for it in items] == ["a"] and counts["invalid_steps"] == 1


class _NoLogprobsFor(ScriptedChatClient):
    """Returns token ids for every call but no logprobs for the question of env seed ``seed``."""

    def __init__(self, seed: int) -> None:
        super().__init__(lambda req: "an answer", chat_template=chatml_template())
        self.question = f"Question {seed}?"

    async def complete(self, request: Any) -> Any:
        resp, info = await super().complete(request)
        if any(self.question in str(m.get("content")) for m in request.messages or ()):
            resp = replace(resp, completion_logprobs=None)
        return resp, info


async def test_rollout_batch_source_keeps_the_batch_when_one_step_has_no_logprobs():
    client = _NoLogprobsFor(1)
    source = RolloutBatchSource(make_engine(client, lambda a, s: float(s)), seeds_fn(3), EpisodicReturn())
    with pytest.warns(UserWarning, match="no behaviour logprobs"):
        batch = await source.next_batch()
    assert len(batch.items) == 2 and sorted(it.weight for it in batch.items) == [0.0, 2.0]
    assert batch.meta["skipped/steps_without_logprobs"] == 1 and batch.meta["skipped/invalid_steps"] == 0
    assert len(source.last_rollouts) == 3 and not any(r.failed for r in source.last_rollouts)
