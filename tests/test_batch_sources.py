"""Batch sources: RolloutBatchSource end to end (tiny model), its bad-input paths,
OfflineBatchSource (rollouts JSONL, SAWItems, chat SFT via datasets), rejection sampling."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, GRPORequestStrategy, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic_lab.rollouts.batch_source import BatchSource, DataExhaustedError, EmptyBatchError
from ludic_lab.rollouts.filters import with_sample_meta
from ludic_lab.rollouts.rejection_sampling import (
    RejectionSamplingFilter,
    keep_if_final_info,
    keep_if_reward_at_least,
    rejection_sample,
)
from ludic_lab.rollouts.rollout_source import RolloutBatchSource
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.training.batching.chat_sft import sft_item_from_messages
from ludic_lab.training.batching.offline_source import OfflineBatchSource
from ludic_lab.training.credit_assignment import (
    ConstantCredit,
    EpisodicReturn,
    GroupNormalizedReturn,
    NonFiniteRewardError,
)
from ludic_lab.types import Info, Rollout, Step, StepOutcome, TokenTrace, load_rollouts, save_rollouts
from tests.helpers import ScriptedChatClient, chatml_template

Score = Callable[[str, int | None], float]


class ScoreEnv(SingleAgentEnv):
    """One turn: reward ``score(action, seed)``; ``env_step`` raises for seeds in ``fail_seeds``."""

    def __init__(self, score: Score, fail_seeds: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.score, self.fail_seeds, self.seed = score, fail_seeds, None

    @property
    def suggested_sysprompt(self) -> str | None:
        return "Say something."

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self.seed = seed
        return f"Question {seed}?", {}

    def env_step(self, action: str) -> StepOutcome:
        if self.seed in self.fail_seeds:
            raise ValueError(f"env broke on seed {self.seed}")
        return StepOutcome(
            obs="done",
            reward=self.score(action, self.seed),
            truncated=False,
            terminated=True,
            info={"result": "win" if self.score(action, self.seed) > 0 else "loss"},
        )

    def env_current_obs(self) -> str:
        return "done"


SPEC = InferenceSpec(sampling=SamplingConfig(temperature=1.0, max_tokens=8), return_=ReturnSpec.for_training())


def make_engine(client, score: Score, fail_seeds=()) -> RolloutEngine:
    return RolloutEngine(
        {"score": lambda: ScoreEnv(score, frozenset(fail_seeds))},
        {
            "agent": lambda: SingleAgentSyncProtocol(
                Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
            )
        },
    )


def seeds_fn(per_call: int = 2) -> Callable[[], list[RolloutRequest]]:
    """Fresh requests each call: env seeds 0..per_call-1, then per_call.., ..."""
    state = {"next": 0}

    def requests() -> list[RolloutRequest]:
        s = state["next"]
        state["next"] += per_call
        return [
            RolloutRequest(
                env=EnvSpec("score"),
                protocol=ProtocolSpec("agent"),
                env_seed=s + i,
                sampling_seed=100 * (s + i),
                inference=SPEC,
            )
            for i in range(per_call)
        ]

    return requests


def scripted(text_of_seed: Callable[[int | None], str]) -> ScriptedChatClient:
    return ScriptedChatClient(lambda req: text_of_seed(req.sampling.seed), chat_template=chatml_template())


@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir):
    from ludic_lab.inference.local.client import LocalChatClient

    return LocalChatClient(tiny_model_dir)


# -- RolloutBatchSource end to end with the tiny model --------------------------------------
async def test_rollout_batch_source_end_to_end_items_align_with_traces(tiny_client):
    import torch

    score = lambda action, seed: float(len(action) % 3)  # noqa: E731 - varied rewards within a group
    source = RolloutBatchSource(
        make_engine(tiny_client, score),
        seeds_fn(2),
        GroupNormalizedReturn(),
        request_strategy=GRPORequestStrategy(4, seed=0),
        max_steps=1,
    )
    assert isinstance(source, BatchSource)
    batch = await source.next_batch()
    rollouts = source.last_rollouts
    assert len(rollouts) == 8 and len(batch) == 8 and not any(r.failed for r in rollouts)
    expected = GroupNormalizedReturn().compute(rollouts)
    assert len(set(expected.values())) > 1  # the check below sees real, differing advantages
    by_id = {r.id: r for r in rollouts}
    model = tiny_client.model
    for it in batch.items:
        tr = by_id[it.rollout_id].steps[it.step_index].trace
        P, C = len(tr.prompt_token_ids), len(tr.completion_token_ids)
        assert it.input_ids == tr.prompt_token_ids + tr.completion_token_ids
        assert it.action_mask == (0,) * P + (1,) * C
        assert it.weights == (0.0,) * P + (expected[(it.rollout_id, it.step_index)],) * C
        assert it.behaviour_logprobs[P:] == tr.completion_logprobs and set(it.behaviour_logprobs[:P]) == {0.0}
        assert it.policy_version == tiny_client.policy_version and it.group_id == by_id[it.rollout_id].group_id
        # the behaviour logprobs are the model's own at the action positions (no off-by-one)
        with torch.no_grad():
            logits = model(torch.tensor([it.input_ids])).logits[0].float()
        lp = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(it.input_ids[1:])[:, None])[:, 0]
        torch.testing.assert_close(lp[P - 1 :], torch.tensor(tr.completion_logprobs), atol=2e-3, rtol=0)
    for gid in {r.group_id for r in rollouts}:  # GRPO advantages sum to zero within a group
        assert abs(sum(it.weight for it in batch.items if it.group_id == gid)) < 1e-9
    totals = [r.total_reward for r in rollouts]
    m = batch.meta
    assert m["num_rollouts"] == 8 and m["num_failed_rollouts"] == 0 and m["num_items"] == 8
    assert m["reward_mean"] == pytest.approx(sum(totals) / 8)
    assert m["reward_std"] == pytest.approx(math.sqrt(sum((x - sum(totals) / 8) ** 2 for x in totals) / 8))
    assert (m["reward_min"], m["reward_max"]) == (min(totals), max(totals))
    assert m["parse_error_rate"] == 0.0
    assert m["completion_len_mean"] == pytest.approx(sum(r.num_completion_tokens for r in rollouts) / 8)
    assert m["zero_weight_frac"] == sum(it.weight == 0.0 for it in batch.items) / 8
    assert m["credit/num_groups"] == 2 and m["attempts"] == 1 and m["generation_s"] > 0
    assert {k: v for k, v in m.items() if k.startswith("skipped/")} == {
        "skipped/failed_rollouts": 0,
        "skipped/steps_without_trace": 0,
        "skipped/steps_without_weight": 0,
        "skipped/empty_completions": 0,
        "skipped/steps_without_logprobs": 0,
        "skipped/invalid_steps": 0,
        "skipped/filtered_rollouts": 0,
        "skipped/filtered_samples": 0,
    }
    assert source.last_stats is m
    json.dumps(m)  # loggable
    nxt = await source.next_batch()  # fresh requests: new questions
    assert {r.env_seed for r in source.last_rollouts} == {2, 3}
    assert nxt.meta["num_rollouts"] == 8 and source.batches_served == 2


# -- bad input ----------------------------------------------------------------------------------
async def test_failed_episodes_are_excluded_and_counted():
    client = scripted(lambda seed: f"answer {seed}")
    source = RolloutBatchSource(
        make_engine(client, lambda a, s: float(s), fail_seeds={1}), seeds_fn(3), EpisodicReturn()
    )
    batch = await source.next_batch()
    assert [it.weight for it in batch.items] == [0.0, 2.0]
    assert batch.meta["num_failed_rollouts"] == 1 and batch.meta["skipped/failed_rollouts"] == 1
    assert batch.meta["credit/failed_rollouts"] == 1 and len(source.last_rollouts) == 3
    assert batch.meta["reward_mean"] == 1.0  # over the rollouts that did not fail


async def test_every_episode_failing_is_an_empty_batch_error_with_reasons():
    client = scripted(lambda seed: "x")
    source = RolloutBatchSource(
        make_engine(client, lambda a, s: 1.0, fail_seeds={0, 1}),
        seeds_fn(2),
        GroupNormalizedReturn(),
        request_strategy=GRPORequestStrategy(2, seed=0),
    )
    with pytest.raises(EmptyBatchError, match="0 item\\(s\\) after 1 attempt.*4 failed.*failed_rollouts") as ei:
        await source.next_batch()
    assert ei.value.reasons == {"failed_rollouts": 4}
    assert ei.value.stats["num_failed_rollouts"] == 4 and math.isnan(ei.value.stats["reward_mean"])
    assert len(source.last_rollouts) == 4


async def test_all_zero_advantages_still_give_a_flagged_batch():
    client = scripted(lambda seed: "same")
    source = RolloutBatchSource(
        make_engine(client, lambda a, s: 1.0),
        seeds_fn(2),
        GroupNormalizedReturn(),
        request_strategy=GRPORequestStrategy(3, seed=0),
    )
    batch = await source.next_batch()
    assert len(batch) == 6 and batch.meta["all_zero_weight"] is True and batch.meta["zero_weight_frac"] == 1.0
    assert batch.meta["credit/zero_std_groups"] == 2


async def test_nan_reward_is_a_clear_error_or_a_counted_skip():
    client = scripted(lambda seed: "x")
    score = lambda a, s: float("nan") if s == 1 else float(s)  # noqa: E731
    source = RolloutBatchSource(make_engine(client, score), seeds_fn(3), EpisodicReturn())
    with pytest.raises(NonFiniteRewardError, match="on_nonfinite='skip'"):
        await source.next_batch()
    source = RolloutBatchSource(make_engine(client, score), seeds_fn(3), EpisodicReturn(on_nonfinite="skip"))
    batch = await source.next_batch()
    assert [it.weight for it in batch.items] == [0.0, 2.0]
    assert batch.meta["credit/nonfinite_reward_rollouts"] == 1 and batch.meta["skipped/steps_without_weight"] == 1
    assert batch.meta["num_nonfinite_reward_rollouts"] == 1 and batch.meta["reward_mean"] == 1.0


async def test_rejection_filter_keeps_exactly_the_passing_rollouts_and_retries(tmp_path):
    client = scripted(lambda seed: "x")
    out = tmp_path / "kept.jsonl"
    keep = RejectionSamplingFilter(keep_if_reward_at_least(3.0), out_path=out)
    source = RolloutBatchSource(
        make_engine(client, lambda a, s: float(s)),
        seeds_fn(2),
        ConstantCredit(),
        filter_fn=keep,
        min_items=1,
        max_attempts=3,
    )
    batch = await source.next_batch()  # seeds 0,1 rejected; seeds 2,3 -> 3 kept
    assert batch.meta["attempts"] == 2 and batch.meta["skipped/filtered_rollouts"] == 3
    assert [it.reward for it in batch.items] == [3.0]
    assert (keep.kept, keep.rejected, keep.acceptance_rate) == (1, 3, 0.25)
    assert [r.env_seed for r in load_rollouts(out)] == [3]
    never = RolloutBatchSource(
        make_engine(client, lambda a, s: 0.0), seeds_fn(2), ConstantCredit(), filter_fn=lambda r: False, max_attempts=2
    )
    with pytest.raises(EmptyBatchError, match="after 2 attempt") as ei:
        await never.next_batch()
    assert ei.value.reasons == {"filtered_rollouts": 4}


def test_rollout_batch_source_checks_its_arguments():
    client = scripted(lambda seed: "x")
    engine = make_engine(client, lambda a, s: 0.0)
    with pytest.raises(TypeError, match="callable returning fresh"):
        RolloutBatchSource(
            engine, [RolloutRequest(env=EnvSpec("score"), protocol=ProtocolSpec("agent"))], ConstantCredit()
        )
    with pytest.raises(ValueError, match="min_items"):
        RolloutBatchSource(engine, seeds_fn(), ConstantCredit(), min_items=0)
    bad = RolloutBatchSource(
        engine, lambda: RolloutRequest(env=EnvSpec("score"), protocol=ProtocolSpec("agent")), ConstantCredit()
    )
    with pytest.raises(TypeError, match="must return a list"):
        bad.next_batch_sync()
    assert len(RolloutBatchSource(engine, seeds_fn(2), ConstantCredit()).next_batch_sync()) == 2


async def test_rejection_sample_writes_only_kept_rollouts(tmp_path):
    client = scripted(lambda seed: "x")
    engine = make_engine(client, lambda a, s: float(s % 2), fail_seeds={3})
    reqs = seeds_fn(6)()
    kept = await rejection_sample(
        engine, reqs, keep_if_final_info("result", "win"), max_steps=1, out_path=tmp_path / "d" / "wins.jsonl"
    )
    assert [r.env_seed for r in kept] == [1, 5]  # seed 3 would win but failed
    assert load_rollouts(tmp_path / "d" / "wins.jsonl") == kept
    src = OfflineBatchSource(tmp_path / "d" / "wins.jsonl", batch_size=2, shuffle=False)
    assert [it.rollout_id for it in (await src.next_batch()).items] == [r.id for r in kept]


# -- OfflineBatchSource -----------------------------------------------------------------------------
def traced(rewards, gid=None, logprobs=True, rid=None, error=None) -> Rollout:
    steps = []
    for i, r in enumerate(rewards):
        comp = (10 + i, 11 + i, 2)
        steps.append(
            Step(
                index=i,
                prev_obs="o",
                action="a",
                parsed_action="a",
                next_obs="o",
                reward=r,
                trace=TokenTrace((1, 5, 6 + i), comp, (-0.1, -0.2, -0.3) if logprobs else None, policy_version=3),
            )
        )
    return Rollout(steps=tuple(steps), group_id=gid, error=error, **({"id": rid} if rid else {}))


def test_offline_source_from_rollouts_jsonl(tmp_path):
    rs = [
        traced([1.0, 0.0], gid="g", rid="a"),
        traced([0.0], gid="g", rid="b"),
        traced([2.0], gid="h", rid="c"),
        traced([0.0], gid="h", rid="d"),
        traced([5.0], gid="h", error="boom"),
    ]
    save_rollouts(rs, tmp_path / "r.jsonl")
    src = OfflineBatchSource(tmp_path / "r.jsonl", batch_size=10, shuffle=False)
    batch = src.next_batch_sync()
    assert [(it.rollout_id, it.step_index) for it in batch.items] == [("a", 0), ("a", 1), ("b", 0), ("c", 0), ("d", 0)]
    assert all(
        it == with_sample_meta([SAWItem.from_step(r, s, 1.0)], [r])[0]
        for it, (r, s) in zip(
            batch.items,
            [
                (rs[0], rs[0].steps[0]),
                (rs[0], rs[0].steps[1]),
                (rs[1], rs[1].steps[0]),
                (rs[2], rs[2].steps[0]),
                (rs[3], rs[3].steps[0]),
            ],
            strict=True,
        )
    )
    assert batch.meta["skipped/failed_rollouts"] == 1 and batch.meta["epoch"] == 0
    # offline RL: the group assigner sees whole groups at once ("h" also holds the failed rollout)
    rl = OfflineBatchSource(rs, GroupNormalizedReturn(allow_uneven=True), batch_size=10, shuffle=False)
    assert [it.weight for it in rl.items] == [0.5, 0.5, -0.5, 1.0, -1.0]
    assert list(rl.items[0].behaviour_logprobs[3:]) == [-0.1, -0.2, -0.3]


def test_offline_rollouts_without_logprobs_or_traces():
    no_lp = traced([1.0], logprobs=False)
    no_trace = Rollout(steps=(Step(index=0, prev_obs="o", action="a", parsed_action="a", next_obs=None, reward=1.0),))
    src = OfflineBatchSource([no_lp, no_trace], batch_size=4)
    [it] = src.items
    assert it.meta["has_behaviour_logprobs"] is False and set(it.behaviour_logprobs) == {0.0}
    assert {k: v for k, v in src.skipped.items() if v} == {
        "steps_without_trace": 1,
        "credit/num_rollouts": 2,
        "credit/weighted_rollouts": 2,
        "credit/weighted_steps": 2,
    }
    with pytest.raises(EmptyBatchError, match="no trainable items.*failed_rollouts"):
        OfflineBatchSource([traced([1.0], error="boom")], batch_size=1)


def test_offline_epochs_shuffle_determinism_and_resume():
    rs = [traced([float(i)], rid=f"r{i}") for i in range(10)]

    def run(src, n):
        return [[it.rollout_id for it in src.next_batch_sync().items] for _ in range(n)]

    a = run(OfflineBatchSource(rs, batch_size=4, seed=7), 9)
    assert a == run(OfflineBatchSource(rs, batch_size=4, seed=7), 9)  # deterministic
    assert [len(b) for b in a] == [4, 4, 2] * 3  # batches never straddle epochs
    epochs = [sum(a[3 * e : 3 * e + 3], []) for e in range(3)]
    assert all(sorted(e) == sorted(f"r{i}" for i in range(10)) for e in epochs)  # each item once per epoch
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled per epoch
    assert run(OfflineBatchSource(rs, batch_size=4, seed=8), 3) != a[:3]
    assert sum(run(OfflineBatchSource(rs, batch_size=4, shuffle=False), 3), []) == [f"r{i}" for i in range(10)]
    src = OfflineBatchSource(rs, batch_size=4, seed=7)
    run(src, 4)
    state = src.state_dict()
    resumed = OfflineBatchSource(rs, batch_size=4, seed=7)
    resumed.load_state_dict(state)
    assert run(resumed, 5) == a[4:]
    dl = OfflineBatchSource(rs, batch_size=4, seed=7, drop_last=True)
    assert [len(b) for b in run(dl, 4)] == [4, 4, 4, 4] and dl.num_batches_per_epoch == 2 and dl.epoch == 1
    with pytest.raises(ValueError, match="batch_size"):
        OfflineBatchSource(rs, batch_size=0)


async def test_offline_single_epoch_ends_async_iteration():
    rs = [traced([1.0]) for _ in range(5)]
    src = OfflineBatchSource(rs, batch_size=2, loop=False)
    sizes = [len(b) async for b in src]
    assert sizes == [2, 2, 1]
    with pytest.raises(DataExhaustedError, match="loop=True"):
        await src.next_batch()


def test_offline_sawitem_jsonl_round_trip(tmp_path):
    items = [SAWItem.from_step(r, r.steps[0], w) for r, w in ((traced([1.0]), 0.5), (traced([0.0]), -1.0))]
    (tmp_path / "items.jsonl").write_text("".join(it.to_json() + "\n" for it in items))
    src = OfflineBatchSource(tmp_path / "items.jsonl", batch_size=2, shuffle=False)
    assert list(src.next_batch_sync().items) == items


CHATS = [
    {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2+3?"},
            {"role": "assistant", "content": "5"},
        ],
        "weight": None,
    },
    {
        "messages": [
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue, like the sea."},
            {"role": "user", "content": "Another?"},
            {"role": "assistant", "content": " Red!\nDone."},
            {"role": "user", "content": "thanks"},
        ],
        "weight": 2.0,
    },
]


def spans(mask):
    out, start = [], None
    for t, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            out.append((start, t))
            start = None
    return out


def test_offline_sft_from_chat_dataset_masks_exactly_the_assistant_tokens(tiny_tokenizer):
    import datasets

    ds = datasets.Dataset.from_list(CHATS)  # messages: absent keys become None (no tool_calls), as datasets does
    src = OfflineBatchSource(ds, batch_size=2, shuffle=False, tokenizer=tiny_tokenizer)
    tpl = ChatTemplate(tiny_tokenizer)
    items = src.next_batch_sync().items
    for it, chat in zip(items, CHATS, strict=True):
        msgs = chat["messages"]
        assistant = [m["content"] for m in msgs if m["role"] == "assistant"]
        decoded = [
            tiny_tokenizer.decode(it.input_ids[a:b], skip_special_tokens=False) for a, b in spans(it.action_mask)
        ]
        assert decoded == [c + "<|im_end|>" for c in assistant]
        first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        assert list(it.input_ids[: spans(it.action_mask)[0][0]]) == tpl.render_ids(msgs[:first])
        last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
        full = tpl.render_text(msgs[: last + 1], add_generation_prompt=False)
        assert tiny_tokenizer.decode(it.input_ids, skip_special_tokens=False) == full.rstrip("\n")
        w = chat.get("weight") or 1.0
        assert it.weights == tuple(w if m else 0.0 for m in it.action_mask)
        assert it.meta["has_behaviour_logprobs"] is False and set(it.behaviour_logprobs) == {0.0}
    halved = OfflineBatchSource(CHATS, ConstantCredit(0.5), batch_size=1, tokenizer=tpl)  # a ChatTemplate works too
    assert [it.weight for it in halved.items] == [0.5, 1.0]  # ConstantCredit.value x the example's weight


def test_offline_sft_errors_say_what_to_do(tiny_tokenizer):
    with pytest.raises(ValueError, match="need a tokenizer"):
        OfflineBatchSource(CHATS, batch_size=1)
    with pytest.raises(ValueError, match="use ConstantCredit"):
        OfflineBatchSource(CHATS, EpisodicReturn(), batch_size=1, tokenizer=tiny_tokenizer)
    with pytest.raises(ValueError, match="no assistant message"):
        sft_item_from_messages([{"role": "user", "content": "hi"}], tiny_tokenizer)
    with pytest.raises(ValueError, match="record 0 is not a rollout"):
        OfflineBatchSource([{"text": "hello"}], batch_size=1)
    with pytest.raises(TypeError, match="wrap a single record"):
        OfflineBatchSource(traced([1.0]), batch_size=1)
