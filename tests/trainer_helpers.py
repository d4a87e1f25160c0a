"""Helpers of the Trainer tests: the "reply with digits" task on the tiny model, fixed-item
batch sources, synthetic SAW items and parameter snapshots.

The digits task: the prompt asks for digits; the reward is the fraction of digit characters
in the (12-token) completion. The untrained tiny model scores ~0.002; GRPO (full fine-tune,
lr 6e-3, 8 prompts x 8 samples) passes 0.9 after 17 steps, so a learning test fails loudly
when gradients, signs, publishing or credit are broken (checked: with the loss's sign
flipped the reward stays at ~0.002 for all 40 steps).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import (
    EnvSpec,
    GRPORequestStrategy,
    ProtocolSpec,
    RolloutBatchSource,
    RolloutEngine,
    RolloutRequest,
)
from ludic_lab.rollouts.saw import SAWBatch, SAWItem
from ludic_lab.types import Info, StepOutcome


def digit_fraction(text: str) -> float:
    """Fraction of the stripped text's characters that are digits (0 for empty text)."""
    s = text.strip()
    return sum(ch.isdigit() for ch in s) / max(1, len(s))


class DigitsEnv(SingleAgentEnv):
    """One turn: reward = ``reward_fn(action)`` (default: fraction of digit characters)."""

    def __init__(self, reward_fn: Callable[[str], float] = digit_fraction) -> None:
        super().__init__()
        self.reward_fn = reward_fn
        self._obs = ""

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        self._obs = f"Write some digits. ({seed})"
        return self._obs, {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="ok", reward=self.reward_fn(action), truncated=False, terminated=True, info={})

    def env_current_obs(self) -> str:
        return self._obs


def load_model(model_dir: str, **config_overrides: Any) -> Any:
    """A fresh fp32 copy of the model at ``model_dir`` (config fields may be overridden)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, **config_overrides)


def digits_source(
    client: LocalChatClient,
    credit_assigner: Any,
    *,
    prompts: int = 8,
    group_size: int = 8,
    max_tokens: int = 12,
    seed: int = 0,
    reward_fn: Callable[[str], float] = digit_fraction,
) -> RolloutBatchSource:
    """A RolloutBatchSource on the digits task: ``prompts`` fresh env seeds per batch, each
    expanded into a GRPO group of ``group_size`` (reproducible sampling seeds from ``seed``)."""
    engine = RolloutEngine(
        {"digits": lambda: DigitsEnv(reward_fn)},
        {
            "agent": lambda: SingleAgentSyncProtocol(
                Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False)
            )
        },
    )
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=max_tokens), ReturnSpec.for_training())
    calls = [0]

    def requests() -> list[RolloutRequest]:
        calls[0] += 1
        return [
            RolloutRequest(
                env=EnvSpec("digits"), protocol=ProtocolSpec("agent"), env_seed=calls[0] * 1000 + i, inference=spec
            )
            for i in range(prompts)
        ]

    strategy = GRPORequestStrategy(group_size, seed=seed) if group_size > 1 else None
    return RolloutBatchSource(engine, requests, credit_assigner, request_strategy=strategy)


class ListBatchSource:
    """Serves the given batches in order (cycling when ``cycle``); a BatchSource for tests."""

    def __init__(self, batches: Sequence[SAWBatch], *, cycle: bool = True) -> None:
        self.batches = list(batches)
        self.cycle = cycle
        self.served = 0

    async def next_batch(self) -> SAWBatch:
        if not self.cycle and self.served >= len(self.batches):
            raise StopAsyncIteration("ListBatchSource exhausted")
        b = self.batches[self.served % len(self.batches)]
        self.served += 1
        return b


def random_items(
    n: int,
    *,
    vocab_size: int,
    seed: int = 0,
    prompt_len: tuple[int, int] = (4, 12),
    action_len: tuple[int, int] = (3, 20),
    weights: Sequence[float] | None = None,
    behaviour_logprob: float = -7.0,
    policy_version: int | None = 0,
) -> list[SAWItem]:
    """``n`` synthetic items: random token ids, random prompt/action lengths, a scalar weight
    per item (``weights`` or alternating +-1 scaled by a random factor) and a constant
    behaviour logprob (about uniform over the tiny model's 2k vocabulary)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, a = rng.randint(*prompt_len), rng.randint(*action_len)
        w = weights[i] if weights is not None else (1 if i % 2 == 0 else -1) * rng.uniform(0.5, 1.5)
        out.append(
            SAWItem(
                input_ids=tuple(rng.randrange(vocab_size) for _ in range(p + a)),
                action_mask=(0,) * p + (1,) * a,
                weights=(0.0,) * p + (float(w),) * a,
                behaviour_logprobs=(0.0,) * p + (behaviour_logprob,) * a,
                policy_version=policy_version,
                reward=float(w),
                rollout_id=f"r{seed}-{i}",
                group_id=f"g{i // 4}",
            )
        )
    return out


def params_of(model: Any) -> dict[str, torch.Tensor]:
    """Detached CPU clones of every trainable parameter, by name."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def all_params(model: Any) -> dict[str, torch.Tensor]:
    """Detached CPU clones of every parameter (trainable or frozen), by name."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute elementwise difference over same-named tensors (names must match)."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def assert_params_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Bitwise equality of two parameter snapshots (names, shapes, values)."""
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
    diff = [k for k in a if not torch.equal(a[k], b[k])]
    assert not diff, f"{len(diff)} tensors differ, e.g. {diff[:3]} (max |diff| {max_abs_diff(a, b):.3g})"


def trainer_vs_behaviour(model: Any, item: SAWItem) -> torch.Tensor:
    """|trainer logprob - behaviour logprob| at every action position of ``item``: the item
    packed and scored by ``model_token_logprobs`` exactly as ``Trainer`` does (actions only)."""
    from ludic_lab.training.logprobs import model_token_logprobs
    from ludic_lab.training.packing import pack_items

    (mb,) = pack_items([item], micro_token_budget=4096, max_seq_len=4096)
    with torch.no_grad():
        lp_RT = model_token_logprobs(model, mb, only_at_RT=mb.action_mask)
    act = mb.action_mask.bool()
    assert int(act.sum()) == item.num_action_tokens and bool((lp_RT[~act] == 0).all())
    return (lp_RT[act] - mb.behaviour_logprobs[act]).abs()


def teach_item(model_dir: str, out: Any, item: SAWItem, *, min_logprob: float = -0.01, max_steps: int = 300) -> None:
    """Save to ``out`` a copy of the model at ``model_dir`` fit (seeded, one thread, a few
    seconds) to ``item``'s sampled tokens until each has a logprob over ``min_logprob`` (the
    default: p > 0.99, so sampling at temperature 1 writes it too; log(0.5) is enough for
    greedy): the tiny model then writes a scripted reply (a tool call, an answer) itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the small matmuls run faster on one thread than on two busy ones
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        x = torch.tensor([list(item.input_ids)])
        act = torch.tensor(list(item.action_mask[1:]), dtype=torch.bool)
        for _ in range(max_steps):
            lp = torch.log_softmax(model(x).logits[0, :-1].float(), -1).gather(-1, x[0, 1:, None])[:, 0][act]
            worst = float(lp.detach().min())
            if worst > min_logprob:
                break
            opt.zero_grad()
            (-lp.mean()).backward()
            opt.step()
        assert worst > min_logprob, f"the reply was not learnt (min logprob {worst:.3f})"
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
