"""Credit assigners against hand-computed values, a reference formula, and every error path."""

from __future__ import annotations

import math
import random

import pytest
import torch

from ludic_lab.training.credit_assignment import (
    ConstantCredit,
    CreditAssigner,
    CreditAssignmentError,
    CreditStats,
    EpisodicReturn,
    GroupNormalizedReturn,
    HybridNormalizedReturn,
    LeaveOneOutReturn,
    MonteCarloReturn,
    NonFiniteRewardError,
    PerStepReturn,
    RLOOReturn,
)
from ludic_lab.types import Rollout, Step


def ro(rewards, *, gid=None, agent="agent_0", error=None, rid=None) -> Rollout:
    """A rollout whose steps carry ``rewards`` (no traces needed for credit)."""
    steps = tuple(
        Step(index=i, prev_obs="o", action="a", parsed_action="a", next_obs="o", reward=r)
        for i, r in enumerate(rewards)
    )
    kw = {} if rid is None else {"id": rid}
    return Rollout(steps=steps, group_id=gid, agent_id=agent, error=error, **kw)


def per_rollout(weights, rollouts):
    """``[[w of step 0, w of step 1, ...] per rollout]`` (None where a step got no weight)."""
    return [[weights.get((r.id, s.index)) for s in r.steps] for r in rollouts]


def close(got, expected, tol=1e-12) -> bool:
    """Nested lists equal in shape, numbers within ``tol`` (``None`` only where ``None``)."""
    if len(got) != len(expected) or any(len(a) != len(b) for a, b in zip(got, expected, strict=True)):
        return False
    pairs = [(x, y) for a, b in zip(got, expected, strict=True) for x, y in zip(a, b, strict=True)]
    return all((x is None) == (y is None) and (x is None or abs(x - y) <= tol * max(1.0, abs(y))) for x, y in pairs)


ALL = [
    MonteCarloReturn(),
    PerStepReturn(),
    EpisodicReturn(),
    ConstantCredit(),
    GroupNormalizedReturn(),
    HybridNormalizedReturn(),
    LeaveOneOutReturn(),
]


@pytest.mark.parametrize("assigner", ALL, ids=lambda a: type(a).__name__)
def test_every_assigner_satisfies_the_protocol(assigner):
    assert isinstance(assigner, CreditAssigner)
    assert assigner.last_stats == CreditStats()
    with pytest.raises(TypeError, match="single Rollout"):
        assigner.compute(ro([1.0], gid="g"))
    assert assigner.compute([]) == {}


# -- per-rollout assigners -----------------------------------------------------------------
def test_monte_carlo_return_hand_computed():
    r, s = ro([1.0, 0.0, 2.0]), ro([-1.0])
    # gamma=0.5: G2 = 2, G1 = 0 + .5*2 = 1, G0 = 1 + .5*1 = 1.5
    assert per_rollout(MonteCarloReturn(gamma=0.5).compute([r, s]), [r, s]) == [[1.5, 1.0, 2.0], [-1.0]]
    assert per_rollout(MonteCarloReturn().compute([r]), [r]) == [[3.0, 2.0, 2.0]]
    assert per_rollout(MonteCarloReturn(gamma=0.0).compute([r]), [r]) == [[1.0, 0.0, 2.0]]
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="gamma"):
            MonteCarloReturn(gamma=bad)


def test_per_step_episodic_and_constant_hand_computed():
    r, s = ro([1.0, 0.0, 2.0]), ro([0.5, -0.25])
    assert per_rollout(PerStepReturn().compute([r, s]), [r, s]) == [[1.0, 0.0, 2.0], [0.5, -0.25]]
    assert per_rollout(EpisodicReturn().compute([r, s]), [r, s]) == [[3.0, 3.0, 3.0], [0.25, 0.25]]
    assert per_rollout(ConstantCredit(0.5).compute([r, s]), [r, s]) == [[0.5] * 3, [0.5] * 2]
    with pytest.raises(ValueError, match="finite"):
        ConstantCredit(float("inf"))


# -- group-relative assigners ----------------------------------------------------------------
def group(rewards, gid, **kw):
    return [ro(r if isinstance(r, list) else [r], gid=gid, **kw) for r in rewards]


def test_group_normalized_return_hand_computed():
    g = group([1.0, 0.0, 0.0, [1.0, 2.0]], "g")  # totals 1, 0, 0, 3: mean 1
    w = GroupNormalizedReturn().compute(g)
    assert per_rollout(w, g) == [[0.0], [-1.0], [-1.0], [2.0, 2.0]]  # every step gets its rollout's A
    std = math.sqrt((0 + 1 + 1 + 4) / 4)  # population std of the totals
    w = GroupNormalizedReturn(normalize_adv=True, eps=0.0).compute(g)
    assert close(per_rollout(w, g), [[0.0], [-1 / std], [-1 / std], [2 / std, 2 / std]])
    w = GroupNormalizedReturn(normalize_adv=True).compute(g)  # eps=1e-6
    assert w[(g[3].id, 0)] == pytest.approx(2 / (std + 1e-6), rel=1e-12)
    w = GroupNormalizedReturn(positive_only=True).compute(g)
    assert per_rollout(w, g) == [[0.0], [0.0], [0.0], [2.0, 2.0]]
    w = GroupNormalizedReturn(normalize_adv=True, positive_only=True, eps=0.0).compute(g)
    assert close(per_rollout(w, g), [[0.0], [0.0], [0.0], [2 / std, 2 / std]])


def test_group_normalized_matches_torch_reference_on_random_groups():
    rng = random.Random(0)
    rollouts = [ro([rng.uniform(-2, 2)], gid=f"g{k}") for k in range(5) for _ in range(6)]
    w = GroupNormalizedReturn(normalize_adv=True).compute(rollouts)
    R = torch.tensor([r.total_reward for r in rollouts], dtype=torch.float64).view(5, 6)
    ref = (R - R.mean(1, keepdim=True)) / (R.std(1, unbiased=False, keepdim=True) + 1e-6)
    got = torch.tensor([w[(r.id, 0)] for r in rollouts], dtype=torch.float64).view(5, 6)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    w = LeaveOneOutReturn().compute(rollouts)
    loo = R - (R.sum(1, keepdim=True) - R) / 5
    got = torch.tensor([w[(r.id, 0)] for r in rollouts], dtype=torch.float64).view(5, 6)
    torch.testing.assert_close(got, loo, rtol=1e-12, atol=1e-12)


def test_leave_one_out_hand_computed():
    g = group([1.0, 0.0, 0.0, 3.0], "g")
    w = LeaveOneOutReturn().compute(g)
    # A_i = R_i - mean of the others: 1 - 3/3, 0 - 4/3, 0 - 4/3, 3 - 1/3
    assert close(per_rollout(w, g), [[0.0], [-4 / 3], [-4 / 3], [8 / 3]])
    assert RLOOReturn is LeaveOneOutReturn


def test_hybrid_normalized_hand_computed():
    g1 = group([1.0, 0.0, 0.0, 3.0], "g1")  # centred 0, -1, -1, 2
    g2 = group([2.0, 2.0, 4.0, 0.0], "g2")  # centred 0, 0, 2, -2
    h = HybridNormalizedReturn(eps=0.0)
    w = h.compute(g1 + g2)
    std = math.sqrt((0 + 1 + 1 + 4 + 0 + 0 + 4 + 4) / 8)  # batch std of the centred advantages
    assert h.last_batch_std == pytest.approx(std)
    assert close(per_rollout(w, g1 + g2), [[a / std] for a in [0, -1, -1, 2, 0, 0, 2, -2]])
    w = HybridNormalizedReturn(eps=0.0, positive_only=True).compute(g1 + g2)
    assert close(per_rollout(w, g1 + g2), [[max(a, 0) / std] for a in [0, -1, -1, 2, 0, 0, 2, -2]])
    # all groups flat: std 0 -> every advantage 0, no NaN
    flat = group([1.0, 1.0], "a") + group([0.0, 0.0], "b")
    assert set(HybridNormalizedReturn(eps=0.0).compute(flat).values()) == {0.0}


def test_groups_are_keyed_by_group_id_and_agent():
    rs = [
        ro([1.0], gid="g", agent="X"),
        ro([0.0], gid="g", agent="X"),
        ro([-1.0], gid="g", agent="O"),
        ro([0.0], gid="g", agent="O"),
    ]
    w = GroupNormalizedReturn().compute(rs)
    assert per_rollout(w, rs) == [[0.5], [-0.5], [-0.5], [0.5]]  # mixed, it would be 1, 0, -1, 0
    assert GroupNormalizedReturn().last_stats.num_groups == 0
    a = GroupNormalizedReturn()
    a.compute(rs)
    assert a.last_stats.num_groups == 2


@pytest.mark.parametrize("cls", [GroupNormalizedReturn, HybridNormalizedReturn, LeaveOneOutReturn])
def test_a_role_that_sat_out_plays_is_not_a_lonely_group(cls):
    """Self-play: in 3 of 4 plays of game g, X ended the game before O moved, so O has one
    rollout in g. The group was sampled 4 times: O's lone rollout gets advantage 0 (counted as
    a singleton), X's four are normalised as usual; nothing raises."""
    rs = [ro([r], gid="g", agent="X") for r in (1.0, -1.0, -1.0, 0.0)] + [ro([0.5], gid="g", agent="O")]
    rs += [ro([r], gid="h", agent=a) for a in "XO" for r in (1.0, 0.0, 0.0, 1.0)]
    a = cls()
    w = a.compute(rs)
    assert w[(rs[4].id, 0)] == 0.0
    assert a.last_stats.singleton_groups == 1 and a.last_stats.num_groups == 4
    assert all(w[(r.id, 0)] != 0.0 for r in rs[:4])  # X's group has spread


@pytest.mark.parametrize("cls", [GroupNormalizedReturn, HybridNormalizedReturn, LeaveOneOutReturn])
def test_group_errors_are_clear(cls):
    a = cls()
    rs = group([1.0, 0.0], "g") + [ro([1.0], rid="lonely-one"), ro([0.0], rid="lonely-two")]
    with pytest.raises(CreditAssignmentError, match="missing on rollout.*lonely-one, lonely-two"):
        a.compute(rs)
    with pytest.raises(CreditAssignmentError, match="different sizes \\[2, 3\\]"):
        a.compute(group([1.0, 0.0], "a") + group([1.0, 0.0, 2.0], "b"))
    w = cls(allow_uneven=True).compute(group([1.0, 0.0], "a") + group([1.0, 0.0, 2.0], "b"))
    assert len(w) == 5
    with pytest.raises(CreditAssignmentError, match="single rollout.*GRPORequestStrategy"):
        a.compute(group([1.0], "a") + group([1.0], "b"))
    with pytest.raises(CreditAssignmentError, match="appears twice"):
        a.compute([ro([1.0], gid="g", rid="same"), ro([0.0], gid="g", rid="same")])


def test_failed_rollouts_get_no_weight_and_are_counted():
    g1 = group([1.0, 0.0, 0.0], "g1") + [ro([5.0], gid="g1", error="ValueError: env exploded")]
    g2 = group([2.0, 0.0, 0.0, 1.0], "g2")
    a = GroupNormalizedReturn()
    w, stats = a.compute_with_stats(g1 + g2)  # nominal sizes 4 and 4: not "uneven"
    assert close(per_rollout(w, g1), [[2 / 3], [-1 / 3], [-1 / 3], [None]])
    assert stats == CreditStats(num_rollouts=8, weighted_rollouts=7, weighted_steps=7, failed_rollouts=1, num_groups=2)
    for other in (MonteCarloReturn(), EpisodicReturn(), ConstantCredit(), LeaveOneOutReturn()):
        w = other.compute(g1 + g2)
        assert (g1[3].id, 0) not in w and len(w) == 7 and other.last_stats.failed_rollouts == 1


def test_group_left_with_one_usable_member_gets_zero_and_is_counted():
    rs = group([1.0, 0.0], "a") + [ro([3.0], gid="b"), ro([9.0], gid="b", error="TimeoutError")]
    for cls in (GroupNormalizedReturn, LeaveOneOutReturn, HybridNormalizedReturn):
        a = cls()
        w = a.compute(rs)
        assert w[(rs[2].id, 0)] == 0.0
        assert a.last_stats.singleton_groups == 1 and a.last_stats.failed_rollouts == 1
    # a group made only of failed rollouts does not count as a group
    only_failed = group([1.0, 0.0], "a") + [ro([1.0], gid="c", error="boom")]
    assert len(GroupNormalizedReturn().compute(only_failed)) == 2


def test_zero_std_groups_give_zero_advantage_without_nan():
    rs = group([1.0, 1.0, 1.0], "flat") + group([1.0, 0.0, 2.0], "ok")
    a = GroupNormalizedReturn(normalize_adv=True)
    w = a.compute(rs)
    assert [w[(r.id, 0)] for r in rs[:3]] == [0.0, 0.0, 0.0]
    assert all(math.isfinite(v) for v in w.values())
    assert a.last_stats.zero_std_groups == 1


@pytest.mark.parametrize(
    "assigner", [a for a in ALL if not isinstance(a, ConstantCredit)], ids=lambda a: type(a).__name__
)
def test_nan_reward_is_a_clear_error_or_a_counted_skip(assigner):
    bad = ro([0.0, float("nan")], gid="g", rid="nan-rollout")
    rs = [bad, ro([1.0], gid="g"), ro([0.0], gid="g")]
    with pytest.raises(NonFiniteRewardError, match=r"nan-rollout \(steps \[1\]\).*on_nonfinite='skip'"):
        assigner.compute(rs)
    skipping = type(assigner)(on_nonfinite="skip")
    w = skipping.compute(rs + [ro([float("inf")], gid="g")])
    assert not any(k[0] == "nan-rollout" for k in w)
    assert skipping.last_stats.nonfinite_reward_rollouts == 2 and len(w) == 2
    with pytest.raises(ValueError, match="on_nonfinite"):
        type(assigner)(on_nonfinite="ignore")


def test_constant_credit_does_not_read_rewards_unless_asked():
    rs = [ro([float("nan")]), ro([1.0])]
    assert list(ConstantCredit().compute(rs).values()) == [1.0, 1.0]
    with pytest.raises(NonFiniteRewardError):
        ConstantCredit(on_nonfinite="error").compute(rs)
    assert len(ConstantCredit(on_nonfinite="skip").compute(rs)) == 1


def test_non_rollout_input_is_rejected():
    with pytest.raises(TypeError, match=r"rollouts\[1\] is a dict"):
        EpisodicReturn().compute([ro([1.0]), {"steps": []}])
