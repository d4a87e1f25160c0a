"""Every config dataclass refuses, at construction, values that cannot work or would silently
train differently: NaN, infinities, negatives, unknown choices. Errors name the class, the
field, what is allowed and the value given."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Literal, get_args, get_origin

import pytest

from ludic_lab.demo import DemoConfig
from ludic_lab.inference.request import ReturnSpec, SamplingConfig
from ludic_lab.inference.vllm.server.main import LudicServerOptions
from ludic_lab.pipeline.actor_main import PipelineActorConfig
from ludic_lab.pipeline.trainer_main import PipelineTrainerConfig
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.losses.cispo import CISPOLoss
from ludic_lab.training.losses.clipped import SequenceClippedSurrogateLoss, TokenClippedSurrogateLoss
from ludic_lab.training.losses.composite import LossTerm
from ludic_lab.training.losses.entropy import EntropyBonus
from ludic_lab.training.losses.kl import TokenKLLoss
from ludic_lab.training.losses.reinforce import ReinforceBaselineLoss, ReinforceLoss
from ludic_lab.training.losses.sft import MaskedCrossEntropyLoss
from ludic_lab.validation import check_config, check_number, in_range

NAN, INF = float("nan"), float("inf")


# -- the values the issue found accepted ----------------------------------------------------
@pytest.mark.parametrize(
    "kw, message",
    [
        ({"max_grad_norm": -1}, "TrainerConfig.max_grad_norm must be a finite number > 0 (or None), got -1"),
        ({"lr": INF}, "TrainerConfig.lr must be a finite number > 0, got inf"),
        (
            {"lr_schedule": "bogus"},
            "TrainerConfig.lr_schedule must be one of 'constant', 'linear', 'cosine', got 'bogus'",
        ),
        ({"total_steps": -5}, "TrainerConfig.total_steps must be an integer >= 1 (or None), got -5"),
        ({"lora_r": -4}, "TrainerConfig.lora_r must be an integer >= 0, got -4; 0 trains all weights"),
        ({"scoring_temperature": NAN}, "TrainerConfig.scoring_temperature must be a finite number > 0, got nan"),
        ({"warmup_steps": -3}, "TrainerConfig.warmup_steps must be an integer >= 0, got -3"),
        ({"keep_checkpoints": -1}, "TrainerConfig.keep_checkpoints must be an integer >= 0, got -1"),
        ({"checkpoint_every": -1}, "TrainerConfig.checkpoint_every must be an integer >= 0, got -1"),
        ({"sync_every_steps": -1}, "TrainerConfig.sync_every_steps must be an integer >= 0, got -1"),
        ({"lr": NAN}, "TrainerConfig.lr must be a finite number > 0, got nan"),
        ({"adam_betas": (0.9, NAN)}, "TrainerConfig.adam_betas[1] must be a finite number in [0, 1), got nan"),
        ({"lora_dropout": 1.0}, "TrainerConfig.lora_dropout must be a finite number in [0, 1), got 1.0"),
        ({"optimizer": "adam"}, "TrainerConfig.optimizer must be one of 'adamw', 'sgd', got 'adam'"),
        ({"max_lag": 1.5}, "TrainerConfig.max_lag must be an integer >= 0 (or None), got 1.5"),
        ({"lr_schedule": "cosine", "total_steps": 4, "warmup_steps": 5}, "warmup_steps (5) must be <= total_steps (4)"),
        ({"lr_schedule": "linear"}, "lr_schedule='linear' needs total_steps"),
    ],
)
def test_trainer_config_refuses(kw: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        TrainerConfig(**kw)
    assert message in str(e.value)


def test_trainer_config_still_accepts_what_is_meaningful() -> None:
    TrainerConfig()
    TrainerConfig(
        lr=1,
        max_grad_norm=None,
        max_lag=0,
        total_steps=10,
        lr_schedule="cosine",
        warmup_steps=10,
        lora_r=0,
        keep_checkpoints=0,
        sync_every_steps=0,
        weight_decay=0.0,
        adam_betas=[0.0, 0.5],
    )


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"temperature": NAN}, "SamplingConfig.temperature must be a finite number >= 0, got nan"),
        ({"temperature": INF}, "SamplingConfig.temperature must be a finite number >= 0, got inf"),
        ({"frequency_penalty": NAN}, "SamplingConfig.frequency_penalty must be a finite number in [-2, 2], got nan"),
        ({"presence_penalty": NAN}, "SamplingConfig.presence_penalty must be a finite number in [-2, 2], got nan"),
        ({"presence_penalty": 3.0}, "SamplingConfig.presence_penalty must be a finite number in [-2, 2], got 3.0"),
        ({"top_p": NAN}, "SamplingConfig.top_p must be a finite number in (0, 1], got nan"),
        ({"max_tokens": 2.5}, "SamplingConfig.max_tokens must be an integer >= 1, got 2.5"),
        ({"seed": 1.5}, "SamplingConfig.seed must be an integer (or None), got 1.5"),
        ({"stop": ("ok", 3)}, "SamplingConfig.stop must hold strings"),
    ],
)
def test_sampling_config_refuses(kw: dict, message: str) -> None:
    with pytest.raises(ValueError) as e:
        SamplingConfig(**kw)
    assert message in str(e.value)


def test_return_spec_and_server_options_refuse_bad_values() -> None:
    with pytest.raises(ValueError, match="ReturnSpec.top_logprobs_k must be an integer >= 0, got -1"):
        ReturnSpec(top_logprobs_k=-1)
    with pytest.raises(ValueError, match="LudicServerOptions.drain_timeout_s must be a finite number > 0, got nan"):
        LudicServerOptions(drain_timeout_s=NAN)
    with pytest.raises(ValueError, match="LudicServerOptions.weight_load must be 'auto' or 'reload', got 'fast'"):
        LudicServerOptions(weight_load="fast")
    with pytest.raises(ValueError, match="PipelineActorConfig.group_size must be an integer >= 1, got 0"):
        PipelineActorConfig(group_size=0)
    with pytest.raises(ValueError, match="redis_url 'http://x' has scheme 'http'"):
        PipelineTrainerConfig(redis_url="http://x")
    with pytest.raises(ValueError, match="DemoConfig.backend must be one of 'local', 'vllm', got 'gpu'"):
        DemoConfig(backend="gpu")  # type: ignore[arg-type]


def test_losses_refuse_nan_and_infinite_parameters() -> None:
    with pytest.raises(ValueError, match="TokenClippedSurrogateLoss.clip_eps_low must be a finite number in"):
        TokenClippedSurrogateLoss(clip_eps_low=NAN)
    with pytest.raises(ValueError, match="EntropyBonus.coeff must be a finite number, got nan"):
        EntropyBonus(coef=NAN)
    with pytest.raises(ValueError, match="TokenKLLoss.coeff must be a finite number, got inf"):
        TokenKLLoss(coeff=INF)
    with pytest.raises(ValueError, match="LossTerm.weight must be a finite number, got nan"):
        LossTerm("kl", TokenKLLoss(), NAN)
    assert TokenClippedSurrogateLoss(tis_cap=INF).tis_cap == INF  # an infinite cap means no cap: allowed
    from ludic_lab.training.algorithm import RLAlgorithm, make_grpo

    with pytest.raises(
        ValueError, match="RLAlgorithm.scoring_temperature must be a finite number > 0 .or None., got nan"
    ):
        RLAlgorithm("x", make_grpo().credit_assigner, make_grpo().loss, scoring_temperature=NAN)
    with pytest.raises(ValueError, match="TokenKLLoss.coeff must be a finite number, got nan"):
        make_grpo(kl_coeff=NAN)


# -- every config dataclass, every field ----------------------------------------------------
CONFIGS: list[tuple[type, dict[str, Any]]] = [
    (TrainerConfig, {}),
    (SamplingConfig, {}),
    (ReturnSpec, {}),
    (LudicServerOptions, {}),
    (PipelineActorConfig, {}),
    (PipelineTrainerConfig, {}),
    (DemoConfig, {}),
    (TokenClippedSurrogateLoss, {}),
    (SequenceClippedSurrogateLoss, {}),
    (CISPOLoss, {}),
    (EntropyBonus, {}),
    (TokenKLLoss, {}),
    (ReinforceLoss, {}),
    (ReinforceBaselineLoss, {}),
    (MaskedCrossEntropyLoss, {}),
]
"""The library's config dataclasses with the arguments they need besides defaults."""

ALLOWED_INF = {
    (TokenClippedSurrogateLoss, "tis_cap"),
    (TokenClippedSurrogateLoss, "ratio_clip"),
    (SequenceClippedSurrogateLoss, "tis_cap"),
    (CISPOLoss, "tis_cap"),
    (CISPOLoss, "clip_eps_high"),
    (ReinforceLoss, "tis_cap"),
    (ReinforceBaselineLoss, "tis_cap"),
}
"""Where an infinity means something (a cap of inf = no cap)."""


def _bad_values(cls: type) -> list[tuple[str, Any]]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if get_origin(tp) in (typing.Union, __import__("types").UnionType):
            tp = [a for a in get_args(tp) if a is not type(None)][0]
        if tp is float:
            out.append((f.name, NAN))
            if (cls, f.name) not in ALLOWED_INF:
                out += [(f.name, INF), (f.name, -INF)]
        elif tp is int:
            out += [(f.name, INF), (f.name, 2.5), (f.name, NAN)]
        elif get_origin(tp) is Literal:
            out.append((f.name, "bogus"))
    return out


CASES = [(cls, kw, name, bad) for cls, kw in CONFIGS for name, bad in _bad_values(cls)]


@pytest.mark.parametrize("cls, kw, name, bad", CASES, ids=[f"{c.__name__}.{n}={b!r}" for c, _, n, b in CASES])
def test_every_config_field_refuses_nan_inf_and_unknown_choices(cls: type, kw: dict, name: str, bad: Any) -> None:
    cls(**kw)  # the defaults are valid
    with pytest.raises(ValueError) as e:
        cls(**{**kw, name: bad})
    assert f"{cls.__name__}.{name} must be" in str(e.value) and repr(bad) in str(e.value)


def test_the_sweep_covers_many_fields() -> None:
    assert len(CASES) > 150


# -- the helpers -----------------------------------------------------------------------------
def test_range_rules() -> None:
    assert in_range(0.5, "(0, 1]") and in_range(1, "(0, 1]") and not in_range(0, "(0, 1]")
    assert in_range(-2, "[-2, 2]") and not in_range(2.0001, "[-2, 2]") and in_range(3, ">= 3")
    assert not in_range(math.nan, "> 0") and not in_range(3, "< 3")
    with pytest.raises(ValueError, match="bad range rule"):
        in_range(1, "between 0 and 1")
    check_number("C", "x", None, "> 0", optional=True)
    with pytest.raises(ValueError, match="C.x must be an integer >= 0, got True"):
        check_number("C", "x", True, ">= 0", integer=True)  # a bool is not a count


def test_check_config_catches_its_own_misuse() -> None:
    @dataclasses.dataclass
    class C:
        a: int = 1

    with pytest.raises(TypeError, match="has no field"):
        check_config(C(), {"b": "> 0"})


def test_cli_reports_a_refused_value_as_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    from ludic_lab.cli import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--lr", "nan"])
    assert e.value.code == 2
    assert "ludic-lab demo: error: --lr must be a finite number > 0, got nan" in capsys.readouterr().err
