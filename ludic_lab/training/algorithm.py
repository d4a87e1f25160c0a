"""``RLAlgorithm``: an RL algorithm is credit assignment + a loss (+ optional preprocessing)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ludic_lab.rollouts.saw import SAWBatch

if TYPE_CHECKING:
    from ludic_lab.training.losses.reinforce import ImportanceRatio

PreprocessFn = Callable[[SAWBatch], SAWBatch]


@dataclass(frozen=True)
class RLAlgorithm:
    """A named bundle: ``credit_assigner`` turns rollouts into per-step weights (used by the
    batch source), ``loss`` turns a micro-batch's logprobs into a scalar, ``preprocess``
    may filter or reshape each ``SAWBatch`` before the trainer packs it."""

    name: str
    credit_assigner: Any
    loss: Any
    preprocess: PreprocessFn | None = None
    scoring_temperature: float | None = None
    """When set, the trainer scores tokens at this temperature (match the sampler's)."""

    def __post_init__(self) -> None:
        from ludic_lab.validation import check_config

        check_config(self, {"scoring_temperature": "> 0"})


# -- presets ---------------------------------------------------------------------------------
# Each preset composes a credit assigner and a loss; ``kl_coeff`` adds a k3 KL penalty to the
# frozen reference policy and ``entropy_coeff`` an entropy bonus (both off by default).
# Every policy-gradient preset's loss takes the importance ratio pi / mu against the sampler's
# logprobs (REINFORCE / RLOO: stop-gradient weight; GRPO family: the clipped ratio; CISPO: the
# clipped stop-gradient weight), so off-policy batches (async_level=1, a lagging pipeline,
# bf16 autocast) are corrected; items without behaviour logprobs get ratio 1. SFT has no ratio.


def _with_regularisers(loss: Any, kl_coeff: float, entropy_coeff: float, aggregation: str) -> Any:
    from ludic_lab.training.losses import CompositeLoss, EntropyBonus, TokenKLLoss

    if not kl_coeff and not entropy_coeff:
        return loss
    terms: list[Any] = [("pg", 1.0, loss)]
    if kl_coeff:
        terms.append(("kl", 1.0, TokenKLLoss(coeff=kl_coeff, estimator="k3", aggregation=aggregation)))
    if entropy_coeff:
        terms.append(("entropy", 1.0, EntropyBonus(coeff=entropy_coeff, aggregation=aggregation)))
    return CompositeLoss(terms)


def make_reinforce(
    *,
    gamma: float = 1.0,
    kl_coeff: float = 0.0,
    entropy_coeff: float = 0.0,
    tis_cap: float | None = None,
    importance_ratio: ImportanceRatio = "token",
) -> RLAlgorithm:
    """REINFORCE: Monte-Carlo returns as weights, ``-Σ sg(π/μ) G_t log π`` per sequence, mean
    over sequences (the ratio corrects off-policy data; ``tis_cap`` caps it)."""
    from ludic_lab.rollouts.credit import MonteCarloReturn
    from ludic_lab.training.losses import ReinforceLoss

    agg = "seq_mean_token_sum"
    loss = ReinforceLoss(aggregation=agg, tis_cap=tis_cap, importance_ratio=importance_ratio)
    return RLAlgorithm(
        "reinforce", MonteCarloReturn(gamma=gamma), _with_regularisers(loss, kl_coeff, entropy_coeff, agg)
    )


def make_reinforce_baseline(
    *,
    gamma: float = 1.0,
    normalize: bool = False,
    kl_coeff: float = 0.0,
    entropy_coeff: float = 0.0,
    tis_cap: float | None = None,
    importance_ratio: ImportanceRatio = "token",
) -> RLAlgorithm:
    """REINFORCE with the batch-mean return as baseline (optionally std-normalised), ratio-corrected."""
    from ludic_lab.rollouts.credit import MonteCarloReturn
    from ludic_lab.training.losses import ReinforceBaselineLoss

    agg = "seq_mean_token_sum"
    loss = ReinforceBaselineLoss(
        aggregation=agg,
        normalize=normalize,
        tis_cap=tis_cap,
        importance_ratio=importance_ratio,
    )
    return RLAlgorithm(
        "reinforce_baseline", MonteCarloReturn(gamma=gamma), _with_regularisers(loss, kl_coeff, entropy_coeff, agg)
    )


def make_rloo(
    *,
    kl_coeff: float = 0.0,
    entropy_coeff: float = 0.0,
    tis_cap: float | None = None,
    importance_ratio: ImportanceRatio = "token",
) -> RLAlgorithm:
    """RLOO: leave-one-out group baseline, ratio-corrected REINFORCE loss (needs GRPO-style groups)."""
    from ludic_lab.rollouts.credit import LeaveOneOutReturn
    from ludic_lab.training.losses import ReinforceLoss

    agg = "seq_mean_token_sum"
    loss = ReinforceLoss(aggregation=agg, tis_cap=tis_cap, importance_ratio=importance_ratio)
    return RLAlgorithm("rloo", LeaveOneOutReturn(), _with_regularisers(loss, kl_coeff, entropy_coeff, agg))


def make_grpo(
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.28,
    normalize_adv: bool = True,
    positive_only: bool = False,
    kl_coeff: float = 0.0,
    entropy_coeff: float = 0.0,
) -> RLAlgorithm:
    """GRPO: group-normalised advantages, token-level clipped surrogate, per-sequence mean."""
    from ludic_lab.rollouts.credit import GroupNormalizedReturn
    from ludic_lab.training.losses import TokenClippedSurrogateLoss

    agg = "seq_mean_token_mean"
    loss = TokenClippedSurrogateLoss(clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, aggregation=agg)
    credit = GroupNormalizedReturn(normalize_adv=normalize_adv, positive_only=positive_only)
    return RLAlgorithm("grpo", credit, _with_regularisers(loss, kl_coeff, entropy_coeff, agg))


def make_dr_grpo(
    *, max_tokens: int, clip_eps_low: float = 0.2, clip_eps_high: float = 0.28, kl_coeff: float = 0.0
) -> RLAlgorithm:
    """Dr.GRPO: mean-centred (not std-normalised) advantages, token sums over a constant
    normaliser ``num_sequences * max_tokens`` (no length bias)."""
    from ludic_lab.rollouts.credit import GroupNormalizedReturn
    from ludic_lab.training.losses import TokenClippedSurrogateLoss

    agg = "seq_mean_token_sum_norm"
    loss = TokenClippedSurrogateLoss(
        clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, aggregation=agg, max_tokens=max_tokens
    )
    return RLAlgorithm(
        "dr_grpo", GroupNormalizedReturn(normalize_adv=False), _with_regularisers(loss, kl_coeff, 0.0, "token_mean")
    )


def drop_zero_weight_items(batch: SAWBatch) -> SAWBatch:
    """Preprocess: drop single *items* whose action weights are all zero (``zero_weight_dropped``
    counts them).

    Not DAPO's filter: in a group whose rewards differ, a member scoring exactly the group
    mean has advantage 0 and is dropped too, so a token-mean loss divides by fewer tokens.
    :func:`~ludic_lab.rollouts.group_signal.drop_zero_variance_groups` drops whole groups
    without signal and keeps such members (what :func:`make_dapo` uses)."""
    kept = tuple(
        it for it in batch.items if any(w != 0.0 for w, m in zip(it.weights, it.action_mask, strict=True) if m)
    )
    return SAWBatch(kept, {**batch.meta, "zero_weight_dropped": len(batch.items) - len(kept)})


def make_dapo(*, clip_eps_low: float = 0.2, clip_eps_high: float = 0.28, kl_coeff: float = 0.0) -> RLAlgorithm:
    """DAPO: clip-higher, token-mean over all tokens of the batch, zero-variance *groups* dropped.

    The preprocess (:func:`~ludic_lab.rollouts.group_signal.drop_zero_variance_groups`)
    drops every item of a group whose rewards were all equal and keeps every member of the
    other groups, zero-advantage ones included (their tokens count in the mean). DAPO then
    samples more groups to refill the batch: pair this preset with
    ``RolloutBatchSource(..., dynamic_sampling=DynamicSampling(min_groups=N))``
    (:mod:`ludic_lab.rollouts.dynamic_sampling`); without it a batch shrinks by
    the groups dropped. DAPO's soft overlong penalty is a reward:
    ``rewards=[SoftOverlongPenalty(max_tokens=..., buffer_tokens=...)]``
    (:mod:`ludic_lab.rewards.overlong`)."""
    from ludic_lab.rollouts.credit import GroupNormalizedReturn
    from ludic_lab.rollouts.group_signal import drop_zero_variance_groups
    from ludic_lab.training.losses import TokenClippedSurrogateLoss

    agg = "token_mean"
    loss = TokenClippedSurrogateLoss(clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, aggregation=agg)
    return RLAlgorithm(
        "dapo",
        GroupNormalizedReturn(normalize_adv=True),
        _with_regularisers(loss, kl_coeff, 0.0, agg),
        drop_zero_variance_groups,
    )


def make_gspo(*, clip_eps_low: float = 3e-4, clip_eps_high: float = 4e-4, kl_coeff: float = 0.0) -> RLAlgorithm:
    """GSPO: group-normalised advantages, sequence-level clipped importance ratio."""
    from ludic_lab.rollouts.credit import GroupNormalizedReturn
    from ludic_lab.training.losses import SequenceClippedSurrogateLoss

    agg = "seq_mean_token_mean"
    loss = SequenceClippedSurrogateLoss(clip_eps_low=clip_eps_low, clip_eps_high=clip_eps_high, aggregation=agg)
    return RLAlgorithm("gspo", GroupNormalizedReturn(normalize_adv=True), _with_regularisers(loss, kl_coeff, 0.0, agg))


def make_cispo(*, clip_eps_high: float = 0.2, kl_coeff: float = 0.0) -> RLAlgorithm:
    """CISPO: group-normalised advantages, clipped stop-gradient IS weight x log π, token mean."""
    from ludic_lab.rollouts.credit import GroupNormalizedReturn
    from ludic_lab.training.losses import CISPOLoss

    agg = "token_mean"
    loss = CISPOLoss(clip_eps_high=clip_eps_high, aggregation=agg)
    return RLAlgorithm("cispo", GroupNormalizedReturn(normalize_adv=True), _with_regularisers(loss, kl_coeff, 0.0, agg))


def make_scalerl(*, clip_eps_high: float = 0.2) -> RLAlgorithm:
    """ScaleRL: group-mean-centred, batch-std-scaled advantages (HybridNormalizedReturn) + CISPO."""
    from ludic_lab.rollouts.credit import HybridNormalizedReturn
    from ludic_lab.training.losses import CISPOLoss

    return RLAlgorithm(
        "scalerl", HybridNormalizedReturn(), CISPOLoss(clip_eps_high=clip_eps_high, aggregation="token_mean")
    )


def make_sft() -> RLAlgorithm:
    """SFT: constant credit 1, masked cross-entropy on action (assistant) tokens, token mean."""
    from ludic_lab.rollouts.credit import ConstantCredit
    from ludic_lab.training.losses import MaskedCrossEntropyLoss

    return RLAlgorithm("sft", ConstantCredit(1.0), MaskedCrossEntropyLoss(aggregation="token_mean"))


PRESETS: dict[str, Callable[..., RLAlgorithm]] = {
    "reinforce": make_reinforce,
    "reinforce_baseline": make_reinforce_baseline,
    "rloo": make_rloo,
    "grpo": make_grpo,
    "dr_grpo": make_dr_grpo,
    "dapo": make_dapo,
    "gspo": make_gspo,
    "cispo": make_cispo,
    "scalerl": make_scalerl,
    "sft": make_sft,
}
"""Preset name -> factory (``make_dr_grpo`` needs ``max_tokens=``)."""


def make_preset(name: str, *, max_tokens: int | None = None) -> RLAlgorithm:
    """The :data:`PRESETS` algorithm ``name`` with its defaults; ``max_tokens`` (the completion
    budget) goes to the one preset that normalises by it (``dr_grpo``), which requires it.
    An unknown name raises ``ValueError`` listing the presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown algorithm preset {name!r}; choose one of {', '.join(PRESETS)}")
    if name != "dr_grpo":
        return PRESETS[name]()
    if max_tokens is None:
        raise ValueError("the dr_grpo preset normalises by the completion budget: pass max_tokens=")
    return PRESETS[name](max_tokens=max_tokens)
