"""The credit view of a judged batch shows each card's reward lines, and a judge's counters in
``batch.meta`` count that batch's calls only.

Real parts: the tiny model samples the answers (``LocalChatClient``) and judges them
(``RubricJudge(ask="logprob")`` reads its top-20 next-token distribution), the explain task's
engine and a GRPO ``RolloutBatchSource`` make the batch.
"""

from __future__ import annotations

import html
import re

import pytest

from ludic_lab.data import load_explain_concepts
from ludic_lab.demos.explain_task import explain_engine, explain_judge
from ludic_lab.inference import InferenceSpec, LocalChatClient, SamplingConfig
from ludic_lab.lab import credit_view
from ludic_lab.lab.rollout_html import rewards_html
from ludic_lab.rewards import apply_rewards
from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource, RolloutRequest
from ludic_lab.training import make_grpo
from ludic_lab.types import Rollout, Step


@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir: str) -> LocalChatClient:
    return LocalChatClient(tiny_model_dir, max_batch_size=8)


def _source(client: LocalChatClient, judge: object, rows: list[dict]) -> RolloutBatchSource:
    engine, env, protocol = explain_engine(client, rows)
    sampling = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=8))
    request = RolloutRequest(env=env, protocol=protocol, inference=sampling, num_episodes=2, max_steps=1)
    return RolloutBatchSource(
        engine, lambda: [request], make_grpo().credit_assigner, request_strategy=GRPORequestStrategy(3, seed=0),
        rewards=[judge],
    )  # fmt: skip


def _cards(page: str) -> dict[str, str]:
    """Each card's HTML by the rollout id it shows."""
    parts = re.split(r"<div class='ll-card' data-rollout-id='", page)[1:]
    return {html.unescape(p.split("'", 1)[0]): p for p in parts}


async def test_saw_batch_cards_show_the_judge_line_of_their_rollout(tiny_client: LocalChatClient) -> None:
    rows = load_explain_concepts("train")[:4]
    judge = explain_judge(tiny_client, model_weight=0.0)  # code checks: every answer gets a verdict
    source = _source(tiny_client, judge, rows)
    batch = await source.next_batch()
    by_id = {r.id: r for r in source.last_rollouts}
    page = credit_view(batch, tokenizer=tiny_client, rollouts=source.last_rollouts).html
    cards = _cards(page)
    assert set(cards) == {it.rollout_id for it in batch.items}
    for it in batch.items:
        step = by_id[it.rollout_id].steps[it.step_index]
        info = step.info["reward_info"]["explain"]
        line = rewards_html(step.info)
        assert line and line in cards[it.rollout_id]  # the per-rollout view's line, under this card
        assert f"explain: <b>{step.info['rewards']['explain']:+.3f}</b>" in line
        verdicts = ", ".join(f"{k}: {v}" for k, v in info["verdicts"].items())
        assert html.escape(verdicts) in line
        assert set(info["verdicts"]) == {c.name for c in judge.rubric.criteria}
    plain = credit_view(batch, tokenizer=tiny_client).html  # without rollouts: no reward lines
    assert "explain: <b>" not in plain


async def test_rollouts_of_another_batch_are_refused(tiny_client: LocalChatClient) -> None:
    rows = load_explain_concepts("train")[:4]
    source = _source(tiny_client, explain_judge(tiny_client, model_weight=0.0), rows)
    batch = await source.next_batch()
    other = [Rollout(id="elsewhere", steps=(Step(0, "q", "a", "a", None, 0.0),))]
    with pytest.raises(ValueError, match="rollouts=source.last_rollouts"):
        credit_view(batch, tokenizer=tiny_client, rollouts=other)
    with pytest.raises(ValueError, match="applies to SAW items"):
        credit_view(source.last_rollouts, rollouts=source.last_rollouts)


async def test_judge_counters_of_a_batch_count_its_own_calls(tiny_client: LocalChatClient) -> None:
    """``apply_rewards`` (what a batch source runs) reports the calls made for its rollouts only,
    not those the judge made before (by hand, or for an evaluation)."""
    question = load_explain_concepts("train")[0]["question"]

    def rollouts(prefix: str, answers: list[str]) -> list[Rollout]:
        return [Rollout(id=f"{prefix}{i}", steps=(Step(0, question, a, a, None, 0.0),)) for i, a in enumerate(answers)]

    judge = explain_judge(tiny_client, model_weight=1.0)  # one model call per distinct answer
    await judge.score(rollouts("h", ["A magnet pulls iron.", "I like sunny days.", "Spins align."]))
    batch = rollouts("b", ["Rain falls.", "Rain is water.", "Rain falls.", "Clouds cry."])
    _, stats = await apply_rewards(batch, [judge])
    assert stats["rewards/explain/judge_calls"] == 3 and stats["rewards/explain/cache_hits"] == 1, stats
    _, again = await apply_rewards(batch, [judge])  # nothing new asked: the same answers again
    assert again["rewards/explain/judge_calls"] + again["rewards/explain/cache_hits"] == 4, again
