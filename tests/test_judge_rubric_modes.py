"""RubricJudge beyond one JSON verdict: code-judged criteria (``Criterion(check=...)``),
worked examples as few-shot turns (``Criterion(examples=...)``), verdicts read from the
probability of yes (``ask="logprob"``), and the explain task built on them."""

from __future__ import annotations

import math
from typing import Any

import pytest

from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.judges import Criterion, Rubric, RubricJudge
from ludic_lab.rewards import RewardContractError
from ludic_lab.types import ChatResponse, Rollout, Step
from tests.helpers import ScriptedChatClient


def ro(answer: str, question: str = "Explain rain in one sentence a young child understands.") -> Rollout:
    step = Step(index=0, prev_obs=question, action=answer, parsed_action=answer, next_obs=None, reward=0.0)
    return Rollout(steps=(step,), group_id="g")


def short(prompt: str, answer: str) -> bool:
    return len(answer.split()) <= 5


HYBRID = Rubric(
    (
        Criterion("short", "At most five words.", weight=2.0, check=short),
        Criterion("correct", "The answer is right.", weight=1.0),
        Criterion("clear", "The answer is clear.", weight=1.0),
    )
)


class FakeTokenizer:
    VOCAB = {1: " Yes", 2: "No", 3: "The", 4: " no.", 5: "Maybe"}

    def decode(self, ids: list[int]) -> str:
        return "".join(self.VOCAB[i] for i in ids)


class LogprobClient:
    """Answers every request with one token and the scripted top-k distribution."""

    def __init__(self, top: dict[int, float] | Any) -> None:
        self.top = top
        self.tokenizer = FakeTokenizer()
        self.requests: list[ChatCompletionRequest] = []

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        self.requests.append(request)
        top = self.top(request) if callable(self.top) else self.top
        logprobs = {k: math.log(p) for k, p in top.items()}
        best = max(top, key=lambda k: top[k])
        return ChatResponse(text=FakeTokenizer.VOCAB[best], top_logprobs=(logprobs,)), {}


async def test_code_criteria_are_never_asked_and_enter_the_weighted_mean() -> None:
    client = ScriptedChatClient(lambda req: "yes" if "right" in req.messages[-1]["content"] else "no")
    judge = RubricJudge(client, HYBRID, ask="per_criterion")
    long, brief = await judge.score([ro("Rain is water that falls from the clouds."), ro("Water from clouds.")])
    assert len(client.requests) == 4  # 2 model criteria x 2 answers; "short" is code
    assert not any("five words" in r.messages[-1]["content"] for r in client.requests)
    # verdicts: short no/yes (w 2), correct yes (w 1), clear no (w 1)
    assert long.score == pytest.approx((0 + 1 + 0) / 4) and brief.score == pytest.approx((2 + 1 + 0) / 4)
    assert brief.info["verdicts"] == {"short": "yes", "correct": "yes", "clear": "no"}
    assert brief.info["code_checked"] == ["short"]


async def test_a_rubric_of_code_checks_makes_no_call_and_a_bad_check_is_a_contract_error() -> None:
    client = ScriptedChatClient([])  # any call would exhaust the script
    judge = RubricJudge(client, Rubric((Criterion("short", "At most five words.", check=short),)), ask="json")
    (res,) = await judge.score([ro("Water from clouds.")])
    assert res.score == 1.0 and client.requests == []
    bad = RubricJudge(client, Rubric((Criterion("short", "x", check=lambda p, a: "maybe"),)))
    with pytest.raises(RewardContractError, match="check returned 'maybe'"):
        await bad.score([ro("Water.")])


async def test_json_mode_asks_only_for_the_model_criteria() -> None:
    reply = '{"reasoning": "fine", "verdicts": {"correct": "yes", "clear": "yes"}}'
    client = ScriptedChatClient([reply])
    (res,) = await RubricJudge(client, HYBRID).score([ro("Rain is water that falls from the clouds.")])
    assert '"short"' not in client.requests[0].messages[-1]["content"]
    assert res.score == pytest.approx(2 / 4) and res.info["reasoning"] == "fine"


async def test_logprob_mode_reads_the_probability_of_yes() -> None:
    client = LogprobClient({1: 0.5, 4: 0.1, 3: 0.3})  # " Yes" 0.5, " no." 0.1, "The" 0.3
    rubric = Rubric((Criterion("correct", "Right.", weight=3.0), Criterion("short", "Short.", check=short)))
    judge = RubricJudge(client, rubric, ask="logprob")
    (res,) = await judge.score([ro("Water from clouds.")])
    p = 0.5 / 0.6
    assert res.score == pytest.approx((3 * p + 1) / 4)
    assert res.info["p_yes"]["correct"] == pytest.approx(p, abs=1e-4) and res.info["verdicts"]["correct"] == "yes"
    req = client.requests[0]
    assert req.sampling.max_tokens == 1 and req.sampling.temperature == 0.0 and req.return_.top_logprobs_k == 20
    (again,) = await judge.score([ro("Water from clouds.")])
    assert again.score == res.score and len(client.requests) == 1  # cached
    assert judge.take_stats()["cache_hits"] == 1


async def test_logprob_mode_without_yes_or_no_is_a_failure_not_a_zero() -> None:
    judge = RubricJudge(LogprobClient({3: 0.7, 5: 0.2}), Rubric((Criterion("correct", "Right."),)), ask="logprob")
    (res,) = await judge.score([ro("Water.")])
    assert res.score is None and "yes or no" in (res.failure or "")
    assert judge.take_stats()["parse_failures"] == 1


def test_logprob_mode_refuses_scales_and_needs_a_tokenizer() -> None:
    with pytest.raises(ValueError, match="yes/no criteria only"):
        RubricJudge(LogprobClient({1: 1.0}), Rubric((Criterion("c", "x", scale=5),)), ask="logprob")
    with pytest.raises(TypeError, match="tokenizer="):
        RubricJudge(ScriptedChatClient([]), Rubric((Criterion("c", "x"),)), ask="logprob")


def test_examples_become_earlier_turns_and_are_validated() -> None:
    c = Criterion(
        "good", "Good.", examples=[("Explain a cat.", "A cat purrs.", "yes"), ("Explain a cat.", "Bread.", False)]
    )
    judge = RubricJudge(ScriptedChatClient([]), Rubric((c,)), ask="per_criterion")
    msgs = judge.messages(ro("Water."))
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [msgs[2]["content"], msgs[4]["content"]] == ["yes", "no"]
    assert "A cat purrs." in msgs[1]["content"] and "Water." in msgs[-1]["content"]
    with pytest.raises(ValueError, match="example verdict"):
        Criterion("good", "Good.", examples=[("t", "a", "perhaps")])
    with pytest.raises(ValueError, match="an example is"):
        Criterion("good", "Good.", examples=[("t", "a")])


def test_explain_task_checks_and_data() -> None:
    from ludic_lab.data import load_explain_concepts
    from ludic_lab.demos.explain_task import explain_rubric, names_it, one_sentence, plain_words, short as short_enough

    q = "Explain why we sleep in one sentence a young child understands."
    assert one_sentence(q, "We sleep to rest.") and not one_sentence(q, "We sleep. We rest.")
    assert one_sentence(q, "Dr. Who sleeps at 3.5 o'clock") is False  # "Dr. Who": a sentence end for this check
    assert names_it(q, "Sleeping helps you grow.") and not names_it(q, "Dogs like to play.")
    assert short_enough(q, "one two three") and not short_enough(q, " ".join(["word"] * 26))
    assert plain_words(q, "Sleep is rest.") and not plain_words(q, "Electromagnetic ferromagnetic sleep.")
    r = explain_rubric(model_weight=0.5)
    assert [c.name for c in r.model_criteria] == ["good"] and r.model_criteria[0].weight == 0.5
    train, test = load_explain_concepts("train"), load_explain_concepts("test")
    assert (len(train), len(test)) == (36, 12)
    assert not {r["concept"] for r in train} & {r["concept"] for r in test}
    assert all(names_it(r["question"], r["concept"]) for r in train + test)  # the keyword rule finds each concept
