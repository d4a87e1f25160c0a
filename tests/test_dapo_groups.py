"""DAPO drops zero-variance *groups*, not zero-weight items: the preset's loss and gradients
equal DAPO's objective written out by hand, with a zero-advantage member of an informative
group still counted in the token mean."""

from __future__ import annotations

import math

import pytest
import torch
from trainer_helpers import load_model

from ludic_lab.rollouts.group_signal import drop_zero_variance_groups, group_key, informative_groups
from ludic_lab.rollouts.saw import SAWBatch, SAWItem, saw_items_from_rollouts
from ludic_lab.training.algorithm import RLAlgorithm, drop_zero_weight_items, make_dapo
from ludic_lab.training.logprobs import model_token_logprobs
from ludic_lab.training.packing import pack_items
from ludic_lab.types import Rollout, Step, TokenTrace

# group "a": rewards differ, and the 0.5 member scores the group mean -> advantage exactly 0;
# group "b": every member scored 1 -> no signal (DAPO drops all three).
GROUPS = {"a": [1.0, 0.0, 0.5], "b": [1.0, 1.0, 1.0]}
LENGTHS = {"a": [3, 4, 5], "b": [2, 6, 3]}
EPS_LOW, EPS_HIGH = 0.2, 0.28


def _rollouts(behaviour_shift: float = 0.0) -> list[Rollout]:
    out = []
    for gid, rewards in GROUPS.items():
        for i, (r, n) in enumerate(zip(rewards, LENGTHS[gid], strict=True)):
            comp = tuple(7 + (3 * i + k) % 50 for k in range(n))
            lps = tuple(-3.0 + behaviour_shift * ((k % 3) - 1) for k in range(n))
            trace = TokenTrace((1, 2 + i, 4), comp, lps, policy_version=0)
            step = Step(index=0, prev_obs="q", action="x", parsed_action="x", next_obs=None, reward=r, trace=trace)
            out.append(Rollout(steps=(step,), id=f"{gid}{i}", group_id=gid, policy_version=0))
    return out


def _items(model: torch.nn.Module) -> list[SAWItem]:
    """Items with the preset's own credit; behaviour logprobs = the model's own logprobs
    moved by +-0.4 (so some ratios leave [1 - eps_low, 1 + eps_high] and clip)."""
    rollouts = _rollouts()
    weights = make_dapo().credit_assigner.compute(rollouts)
    items, _ = saw_items_from_rollouts(rollouts, weights)
    out = []
    for it in items:
        with torch.no_grad():
            lp = _token_logprobs(model, it)
        shifted = [
            0.0 if not m else float(x) + 0.4 * ((t % 3) - 1)
            for t, (m, x) in enumerate(zip(it.action_mask, lp, strict=True))
        ]
        out.append(SAWItem(**{**it.__dict__, "behaviour_logprobs": tuple(shifted)}))
    return out


def _token_logprobs(model: torch.nn.Module, item: SAWItem) -> torch.Tensor:
    """log pi(token_t | tokens_<t) of one item, computed on its own (no packing)."""
    ids = torch.tensor([item.input_ids])
    logits = model(input_ids=ids).logits[0, :-1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
    return torch.cat([torch.zeros(1), lp])


def _reference_loss(model: torch.nn.Module, items: list[SAWItem]) -> torch.Tensor:
    """DAPO's objective by hand: keep groups whose rewards differ (std > 0), advantage
    (R - mean) / (std + 1e-6), token-level clipped surrogate, mean over every token of
    every kept sequence (zero-advantage members included)."""
    by_group: dict[str, list[SAWItem]] = {}
    for it in items:
        by_group.setdefault(it.group_id or "", []).append(it)
    num = torch.zeros(())
    tokens = 0
    for members in by_group.values():
        rewards = [it.reward for it in members]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        if std == 0.0:
            continue
        for it in members:
            adv = (it.reward - mean) / (std + 1e-6)
            lp = _token_logprobs(model, it)
            mask = torch.tensor(it.action_mask, dtype=torch.bool)
            ratio = torch.exp(lp[mask] - torch.tensor(it.behaviour_logprobs)[mask])
            surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
            num = num - surrogate.sum()
            tokens += int(mask.sum())
    return num / tokens


def _preset_loss(model: torch.nn.Module, algo: RLAlgorithm, items: list[SAWItem]) -> torch.Tensor:
    assert algo.preprocess is not None
    kept = algo.preprocess(SAWBatch(tuple(items))).items
    mb = pack_items(kept, micro_token_budget=4096, max_seq_len=64)[0]
    logprobs = model_token_logprobs(model, mb, only_at_RT=mb.action_mask)
    loss, _ = algo.loss.compute(logprobs, mb)
    return loss


def _value_and_grads(model: torch.nn.Module, loss_fn) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = loss_fn()
    loss.backward()
    grads = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]
    return float(loss.detach()), grads


def test_the_groups_are_what_the_test_claims() -> None:
    rollouts = _rollouts()
    items, _ = saw_items_from_rollouts(rollouts, make_dapo().credit_assigner.compute(rollouts))
    by_id = {it.rollout_id: it for it in items}
    assert by_id["a2"].weight == 0.0 and by_id["a0"].weight > 0 > by_id["a1"].weight  # a zero-advantage member
    assert all(by_id[f"b{i}"].weight == 0.0 for i in range(3))
    kept, dropped = informative_groups(items)
    assert list(kept) == [("a", "agent_0")] and dropped == 1


def test_dapo_preset_equals_group_filtering_reference(tiny_model_dir: str) -> None:
    model = load_model(tiny_model_dir)
    items = _items(model)
    algo = make_dapo(clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH)
    ref_value, ref_grads = _value_and_grads(model, lambda: _reference_loss(model, items))
    value, grads = _value_and_grads(model, lambda: _preset_loss(model, algo, items))
    assert value == pytest.approx(ref_value, rel=1e-5, abs=1e-7)
    assert any(g.abs().max() > 0 for g in ref_grads)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-6)
    # the zero-advantage member's 5 tokens are in the denominator: 3 + 4 + 5 = 12 tokens
    kept = algo.preprocess(SAWBatch(tuple(items)))  # type: ignore[misc]
    assert kept.num_action_tokens == 12 and {it.rollout_id for it in kept.items} == {"a0", "a1", "a2"}
    assert kept.meta["zero_variance_groups_dropped"] == 1 and kept.meta["zero_variance_items_dropped"] == 3


def test_item_filter_is_not_dapo(tiny_model_dir: str) -> None:
    """The earlier preset (drop zero-weight items) divides by 7 tokens, not 12: it fails the reference."""
    model = load_model(tiny_model_dir)
    items = _items(model)
    dapo = make_dapo(clip_eps_low=EPS_LOW, clip_eps_high=EPS_HIGH)
    old = RLAlgorithm("dapo_items", dapo.credit_assigner, dapo.loss, drop_zero_weight_items)
    with torch.no_grad():
        ref, got = float(_reference_loss(model, items)), float(_preset_loss(model, old, items))
    assert got == pytest.approx(ref * 12 / 7, rel=1e-5)  # same numerator, fewer tokens
    assert got != pytest.approx(ref, rel=1e-3)


def test_group_filter_keeps_order_keys_agents_and_ungrouped_items() -> None:
    def item(gid: str | None, w: float, agent: str = "agent_0", rid: str = "r") -> SAWItem:
        return SAWItem((1, 2, 3), (0, 1, 1), (0.0, w, w), (0.0, -1.0, -1.0), rollout_id=rid, group_id=gid,
                       meta={"agent_id": agent})  # fmt: skip

    items = [
        item("g", 0.0, "X", "1"),  # g/X has no signal
        item("g", 1.0, "O", "2"),
        item(None, 0.0, rid="3"),  # ungrouped: judged alone
        item("g", 0.0, "O", "4"),  # kept: its group g/O has signal
        item("g", 0.0, "X", "5"),
        item(None, 0.5, rid="6"),
    ]
    assert group_key(items[0]) == ("g", "X") and group_key(items[2]) == ("item:3/0", "agent_0")
    out = drop_zero_variance_groups(SAWBatch(tuple(items), {"reward_mean": 0.1}))
    assert [it.rollout_id for it in out.items] == ["2", "4", "6"]
    assert out.meta == {
        "reward_mean": 0.1,
        "zero_variance_groups_dropped": 2,
        "zero_variance_items_dropped": 3,
        "informative_groups": 2,
    }
