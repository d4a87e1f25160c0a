"""An evaluation is never silent: ``evaluate`` (and so ``task.evaluate``, ``evaluate_task``,
``ludic-lab eval``) shows episodes done / total, rate, time left and failures, and while no
episode has ended, how long and for what it waits — on stderr in a script, in one output
updated in place in a notebook; quick evaluations stay silent."""

from __future__ import annotations

import io
import re

import pytest

from ludic_lab.eval import evaluate
from ludic_lab.eval.eval_progress import FIRST_WAIT, EvalProgress
from ludic_lab.eval.qa import qa_engine
from ludic_lab.parsers import identity_parser
from tests.helpers import Reply, ScriptedChatClient, chatml_template

ROWS = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(6)]


def answers(delay_s: float):
    """Right for even questions, wrong for odd ones; every reply takes ``delay_s``."""

    def reply(request) -> Reply:
        i = int(re.search(r"What is (\d+)", request.messages[-1]["content"])[1])
        return Reply(text=str(i + 1 if i % 2 == 0 else i), delay_s=delay_s)

    return reply


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


async def test_a_slow_evaluation_says_how_far_it_is_and_what_it_waits_for(tmp_path, capsys):
    client = ScriptedChatClient(answers(1.3), chat_template=chatml_template())
    engine, env, protocol, n = qa_engine(client, ROWS, parser=identity_parser, concurrency=2)
    res = await evaluate(engine, env, protocol, range(n), k=2, temperature=1.0, concurrency=4, progress=True,
                         name="held-out")  # fmt: skip
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("held-out")]
    # on a plain stream: the first line at once (nothing ended yet: what it waits for), the last at the end
    assert lines[0].startswith("held-out 0/12 episodes") and "waiting for the first of 4 running episodes" in lines[0]
    assert FIRST_WAIT in lines[0]
    assert lines[-1].startswith("held-out 12/12 episodes") and "waiting" not in lines[-1]
    assert re.search(r" · [\d.]+ (ep/s|s/ep) · ", lines[-1]), lines[-1]
    # the same result as without the line: same episodes, same order
    assert res.summary()["num_samples"] == 12 and res.summary()["accuracy"] == pytest.approx(0.5)
    quiet = await evaluate(
        *qa_engine(ScriptedChatClient(answers(0.0), chat_template=chatml_template()), ROWS, parser=identity_parser)[:3], range(n), k=2,
        temperature=1.0, progress=False,
    )  # fmt: skip
    assert [r.env_seed for r in res.rollouts] == [r.env_seed for r in quiet.rollouts]
    assert capsys.readouterr().err == ""


async def test_a_quick_evaluation_is_silent_by_default(capsys):
    client = ScriptedChatClient(answers(0.0), chat_template=chatml_template())
    engine, env, protocol, n = qa_engine(client, ROWS, parser=identity_parser)
    res = await evaluate(engine, env, protocol, range(n))
    assert res.summary()["num_samples"] == 6
    assert capsys.readouterr().err == ""


async def test_the_line_counts_rate_time_left_and_failures_on_a_terminal():
    out = Tty()
    line = EvalProgress(10, name="eval", delay_s=0.0, stream=out).start()
    line.update(1)
    line._first -= 4.0  # the next episodes came 2 s apart
    line._t0 -= 10.0
    line.update(2, failed=1)
    text = line.text()
    assert text.startswith("eval 3/10 episodes · 2 s/ep") and "~00:14 left" in text and "1 failed" in text, text
    await line.aclose()
    assert out.getvalue().count("\r\x1b[K") == line.lines == 4  # at start, 2 updates, at close
    assert out.getvalue().endswith("\n")


async def test_in_a_notebook_one_output_is_updated_in_place(monkeypatch):
    shown: list[dict] = []

    class Handle:
        def update(self, bundle, raw):
            shown.append(bundle)

    def display(bundle, raw, display_id):
        shown.append(bundle)
        return Handle()

    monkeypatch.setattr("IPython.display.display", display)
    line = EvalProgress(4, name="held-out", delay_s=0.0, notebook=True).start()
    line.update(4)
    await line.aclose()
    assert len(shown) == line.lines >= 2
    assert "<progress value='4' max='4'" in shown[-1]["text/html"]
    assert shown[-1]["text/plain"].startswith("held-out 4/4 episodes")


async def test_lab_run_episodes_shows_the_line_and_returns_what_the_engine_returns(capsys):
    from ludic_lab import lab
    from ludic_lab.eval.evaluator import eval_requests
    from ludic_lab.inference.request import InferenceSpec, SamplingConfig

    client = ScriptedChatClient(answers(0.3), chat_template=chatml_template())
    engine, env, protocol, n = qa_engine(client, ROWS, parser=identity_parser)
    inference = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=8))
    requests = eval_requests(env, protocol, range(3), k=2, inference=inference, max_steps=None)
    got = await lab.run_episodes(engine, requests, name="first episodes", max_steps=1)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("first episodes 0/6 episodes") and "waiting for the first of" in err[0]
    assert err[-1].startswith("first episodes 6/6 episodes")
    plain = await engine.generate_rollouts(requests, max_steps=1)
    assert [(r.env_seed, r.sampling_seed, r.total_reward) for r in got] == [
        (r.env_seed, r.sampling_seed, r.total_reward) for r in plain
    ]


def test_episodes_ending_together_do_not_make_a_rate_out_of_nothing():
    line = EvalProgress(4, name="before", delay_s=0.0, stream=io.StringIO())
    line._t0 -= 120.0  # two minutes before the first two episodes (one item, k=2) ended at once
    line.update(2)
    assert " · 60 s/ep · " in line.text(), line.text()  # 120 s over 2 episodes, not 2 / 0 s
    line.update(2)
    assert "ep/s" in line.text() and "s/ep" not in line.text()  # the next two a moment later: fast
