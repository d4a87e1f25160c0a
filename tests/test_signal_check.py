"""Steps with nothing to learn are said, not silent: an env whose reward is constant (every
group equal: no gradient) and a tool agent whose episodes never call a tool give a warning
in the console step line, the tqdm bar and the notebook's LivePlot, and are counted in the
metrics (``source/signal/...`` per step, ``total/no_gradient_steps`` over the run)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from trainer_helpers import DigitsEnv, digits_source, load_model

from ludic_lab.agents import ToolAgent
from ludic_lab.context import FullDialog
from ludic_lab.distributed import ClientPublisher
from ludic_lab.inference import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutBatchSource, RolloutEngine, RolloutRequest
from ludic_lab.rollouts.signal_check import NoSignalNotice, no_signal_warning
from ludic_lab.rollouts.strategies import GRPORequestStrategy
from ludic_lab.training.algorithm import make_grpo
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.loggers import ConsoleLogger
from ludic_lab.training.progress import LivePlot, TqdmProgress
from ludic_lab.training.trainer import Trainer


def lookup(word: str) -> str:
    """Look a word up in the dictionary.

    Args:
        word: The word to look up.
    """
    return f"{word}: a word"


def test_a_constant_reward_is_warned_about_in_every_view_and_counted(tiny_model_dir: str) -> None:
    client = LocalChatClient(tiny_model_dir)
    algo = make_grpo()
    source = digits_source(client, algo.credit_assigner, prompts=3, group_size=4, max_tokens=6, reward_fn=lambda s: 0.0)
    buf = io.StringIO()
    console = ConsoleLogger(keys=("reward_mean", "loss"), console=Console(file=buf, width=400, color_system=None))
    plot = LivePlot(display=False)
    cfg = TrainerConfig(lr=1e-3, max_seq_len=128, micro_token_budget=4096, seed=0)
    trainer = Trainer(
        load_model(tiny_model_dir), algo, source, config=cfg, publisher=ClientPublisher(client), loggers=[console]
    )
    ms = trainer.train_sync(2, progress=plot)
    for m in ms:
        assert m["source/signal/no_gradient"] == 1.0 and m["source/signal/equal_reward_groups"] == 3.0
        assert m["source/signal/equal_reward_group_frac"] == 1.0 and m["grad_norm"] == 0.0
    assert [m["total/no_gradient_steps"] for m in ms] == [1, 2]
    assert [m["total/no_tool_calls_steps"] for m in ms] == [0, 0]  # no tools offered: nothing to warn about
    out = buf.getvalue()
    first, second = (line for line in out.splitlines() if "no learning signal" in line)
    assert first.startswith("step 1: no learning signal: all 3 groups scored equal rewards")
    assert "(every reward 0)" in first and "likely causes" in first and "too hard or too easy" in first
    assert second.startswith("step 2:") and "likely causes" not in second  # the causes are given once
    assert "(2 steps without signal so far)" in second
    html = plot._repr_mimebundle_()["text/html"]
    assert "ll-live-warn" in html and "no learning signal" in html
    assert plot.no_signal.count == 2


def test_a_reward_that_varies_gives_no_warning(tiny_model_dir: str) -> None:
    client = LocalChatClient(tiny_model_dir)
    algo = make_grpo()
    source = digits_source(
        client, algo.credit_assigner, prompts=2, group_size=4, max_tokens=6, reward_fn=lambda s: len(s) / 50
    )
    plot = LivePlot(display=False)
    trainer = Trainer(load_model(tiny_model_dir), algo, source, config=TrainerConfig(lr=1e-3, max_seq_len=128))
    (m,) = trainer.train_sync(1, progress=plot)
    assert m["source/signal/no_gradient"] == 0.0 and m["total/no_gradient_steps"] == 0
    assert no_signal_warning(m) is None and plot.warning is None
    assert "ll-live-warn" not in plot._repr_mimebundle_()["text/html"]


def test_a_tool_agent_that_never_calls_its_tool_is_warned_about(
    tiny_model_dir: str, capsys: pytest.CaptureFixture
) -> None:
    """The tiny model never writes a ``<tool_call>`` block: the episodes offered ``lookup``
    and none called it."""
    client = LocalChatClient(tiny_model_dir)
    algo = make_grpo()
    engine = RolloutEngine(
        {"digits": lambda: DigitsEnv(lambda s: len(s) / 50)},
        {
            "tools": lambda: SingleAgentSyncProtocol(
                ToolAgent(client, FullDialog(), identity_parser, tools=[lookup], max_tool_turns=2)
            )
        },
    )
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=8), ReturnSpec.for_training())
    requests = [RolloutRequest(EnvSpec("digits"), ProtocolSpec("tools"), env_seed=i, inference=spec) for i in range(2)]
    source = RolloutBatchSource(
        engine, lambda: requests, algo.credit_assigner, request_strategy=GRPORequestStrategy(3, seed=0)
    )
    batch = source.next_batch_sync()
    assert batch.meta["signal/tool_episodes"] == 6.0 and batch.meta["signal/tool_calls"] == 0.0
    assert batch.meta["signal/no_tool_calls"] == 1.0
    calls = [s.info["agent"]["tools"]["calls"] for r in source.last_rollouts for s in r.steps]
    assert calls == [0] * 6  # what the flag says, read from the episodes themselves
    warning = no_signal_warning(batch.meta)
    assert warning is not None and "no tool calls: 6 episodes were offered tools and none called one" in warning
    assert "few_shot_messages" in warning

    capsys.readouterr()
    bar = TqdmProgress(total=1)
    bar.step({"step": 1, **{f"source/{k}": v for k, v in batch.meta.items()}})
    bar.close()
    written = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert len(written) == 1 and written[0].startswith("warning: step 1: ") and "no tool calls" in written[0]


def test_each_kind_of_problem_gets_its_causes_once() -> None:
    notice = NoSignalNotice()
    no_grad = {"signal/no_gradient": 1.0, "reward_min": 0.0, "reward_max": 0.0}
    no_tools = {"signal/tool_episodes": 4.0, "signal/no_tool_calls": 1.0}
    a = notice(1, no_grad)
    b = notice(2, {**no_grad, **no_tools})
    c = notice(3, no_tools)
    assert a is not None and "every weight is 0 (every reward 0)" in a and "likely causes" in a
    assert b is not None and b.count("likely causes") == 1 and "few_shot_messages" in b  # tools' causes: new
    assert c is not None and "likely causes" not in c and "(3 steps without signal so far)" in c
    assert notice(4, {"signal/no_gradient": 0.5}) is None  # one batch of two had signal: the step learned
    assert notice.count == 3
