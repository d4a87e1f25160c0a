"""Judges: rubric scores against hand-computed values, group rankings mapped to chosen rewards,
the cache, retries, timeouts and crashes as recorded failures excluded from group statistics,
group rewards without a model under GRPO, and the tiny model as a real judge."""

from __future__ import annotations

import json
import re

import pytest

from ludic_lab.inference.request import ChatCompletionRequest, SamplingConfig
from ludic_lab.judges import (
    Criterion,
    GroupJudge,
    JudgeCaller,
    Rubric,
    RubricJudge,
    VerdictParseError,
    extract_json_object,
    parse_ranking,
)
from ludic_lab.rewards import DiversityBonus, MajorityVoteReward, apply_rewards
from ludic_lab.training.credit_assignment import GroupNormalizedReturn
from ludic_lab.types import Rollout, Step
from tests.helpers import Reply, ScriptedChatClient

RUBRIC = Rubric(
    (
        Criterion("clear", "The answer is easy to follow.", weight=1.0),
        Criterion("correct", "The answer is factually right.", weight=3.0, scale=5),
        Criterion("concise", "The answer is one sentence.", weight=2.0),
    )
)


def ro(
    answer: str, *, gid: str | None = "g", question: str = "Why is the sky blue?", parsed: str | None = None
) -> Rollout:
    step = Step(index=0, prev_obs=question, action=answer, parsed_action=parsed or answer, next_obs=None, reward=0.0)
    return Rollout(steps=(step,), group_id=gid)


def verdict(clear: str, correct: int, concise: str, reasoning: str = "ok") -> str:
    v = {"reasoning": reasoning, "verdicts": {"clear": clear, "correct": correct, "concise": concise}}
    return f"Let me look at it.\n```json\n{json.dumps(v)}\n```"


def answer_in(request: ChatCompletionRequest) -> str:
    m = re.search(r"ANSWER:\n<<<\n(.*?)\n>>>", request.messages[-1]["content"], re.S)
    assert m is not None
    return m.group(1)


# -- rubric scores -----------------------------------------------------------------------------------
def test_rubric_score_matches_hand_computed_values() -> None:
    # (1*1 + 3*(4-1)/(5-1) + 2*0) / (1+3+2) = 3.25 / 6
    assert RUBRIC.score({"clear": True, "correct": 4, "concise": False}) == pytest.approx(3.25 / 6)
    assert RUBRIC.score({"clear": True, "correct": 5, "concise": True}) == 1.0
    assert RUBRIC.score({"clear": False, "correct": 1, "concise": False}) == 0.0
    # (0 + 3*0.5 + 2*1) / 6
    assert RUBRIC.score({"clear": False, "correct": 3, "concise": True}) == pytest.approx(3.5 / 6)


async def test_rubric_judge_scores_and_keeps_reasoning_and_verdicts() -> None:
    client = ScriptedChatClient([verdict("yes", 4, "no", reasoning="Right, but two sentences.")])
    judge = RubricJudge(client, RUBRIC, name="quality")
    out, stats = await apply_rewards([ro("Rayleigh scattering. Blue scatters most.")], [judge])
    step = out[0].steps[-1]
    assert step.reward == pytest.approx(3.25 / 6) and step.info["rewards"]["quality"] == pytest.approx(3.25 / 6)
    info = step.info["reward_info"]["quality"]
    assert info["reasoning"] == "Right, but two sentences."
    assert info["verdicts"] == {"clear": "yes", "correct": 4, "concise": "no"}
    assert info["criterion_scores"] == {"clear": 1.0, "correct": 0.75, "concise": 0.0}
    assert "Rayleigh" in info["judge_reply"] or "Right" in info["judge_reply"]
    json.dumps(step.info)  # stored in the rollout: JSON-serialisable
    # the judge saw the task, the answer and every criterion with its scale
    prompt = client.requests[0].messages[-1]["content"]
    assert "Why is the sky blue?" in prompt and "Rayleigh scattering. Blue scatters most." in prompt
    assert '"correct" (a whole number from 1 to 5, 5 best)' in prompt and '"clear" (yes or no)' in prompt
    assert client.requests[0].sampling.temperature == 0.0
    assert stats["rewards/quality/judge_calls"] == 1 and stats["rewards/quality/cache_hits"] == 0
    assert stats["rewards/quality/judge_seconds"] >= 0


def test_verdict_parser_accepts_common_shapes_and_explains_errors() -> None:
    assert RUBRIC.parse('{"clear": true, "correct": "5", "concise": 0}')["verdicts"] == {
        "clear": True,
        "correct": 5.0,
        "concise": False,
    }
    assert extract_json_object('first {"a": 1} then {"b": "}"} end') == {"b": "}"}
    with pytest.raises(VerdictParseError, match="no JSON object"):
        RUBRIC.parse("It is good.")
    with pytest.raises(VerdictParseError, match=r"no entry for \['concise'\]"):
        RUBRIC.parse('{"verdicts": {"clear": "yes", "correct": 3}}')
    with pytest.raises(VerdictParseError, match='verdict "correct" must be from 1 to 5'):
        RUBRIC.parse('{"verdicts": {"clear": "yes", "correct": 9, "concise": "no"}}')
    with pytest.raises(VerdictParseError, match='must be "yes" or "no"'):
        RUBRIC.parse('{"verdicts": {"clear": "maybe", "correct": 3, "concise": "no"}}')
    with pytest.raises(VerdictParseError, match="exactly once"):
        parse_ranking('{"ranking": [1, 1, 2]}', 3)


def test_bad_rubrics_are_refused() -> None:
    with pytest.raises(ValueError, match="weight must be a finite number > 0"):
        Criterion("x", "d", weight=-1)
    with pytest.raises(ValueError, match="scale must be None"):
        Criterion("x", "d", scale=1)
    with pytest.raises(ValueError, match="unique"):
        Rubric((Criterion("x", "d"), Criterion("x", "e")))
    with pytest.raises(TypeError, match="needs a ChatClient"):
        RubricJudge(object(), RUBRIC)  # type: ignore[arg-type]


# -- retries, failures --------------------------------------------------------------------------------
async def test_unreadable_reply_is_retried_once_with_the_error_shown() -> None:
    client = ScriptedChatClient(["The answer is great!", verdict("yes", 5, "yes")])
    judge = RubricJudge(client, RUBRIC)
    out, stats = await apply_rewards([ro("Because of scattering.")], [judge])
    assert not out[0].failed and out[0].total_reward == 1.0
    assert len(client.requests) == 2
    retry = client.requests[1].messages
    assert retry[-2] == {"role": "assistant", "content": "The answer is great!"}
    assert "could not be read" in retry[-1]["content"] and "no JSON object" in retry[-1]["content"]
    assert out[0].steps[-1].info["reward_info"]["rubric"]["attempts"] == 2
    assert stats["rewards/rubric/parse_retries"] == 1 and stats["rewards/rubric/judge_calls"] == 2


async def test_garbage_twice_is_a_recorded_judge_failure() -> None:
    client = ScriptedChatClient(["garbage", "still garbage"])
    out, stats = await apply_rewards([ro("x")], [RubricJudge(client, RUBRIC)])
    r = out[0]
    assert r.failed and r.meta["failure_cause"] == "judge_failure"
    assert r.error.startswith("judge_failure: rubric: unreadable judge reply after 2 attempt(s)")
    assert r.steps[-1].info["reward_info"]["rubric"]["judge_reply"] == "still garbage"
    assert stats["rewards/rubric/failures"] == 1 and stats["rewards/rubric/parse_failures"] == 1
    assert len(client.requests) == 2


async def test_timeout_and_crash_are_recorded_failures() -> None:
    def script(req: ChatCompletionRequest) -> Reply:
        a = answer_in(req)
        if a == "slow":
            return Reply(text=verdict("yes", 5, "yes"), delay_s=5.0)
        if a == "crash":
            return Reply(error=ConnectionError("connection refused"))
        return Reply(text=verdict("yes", 5, "yes"))

    judge = RubricJudge(ScriptedChatClient(script), RUBRIC, timeout_s=0.2)
    out, stats = await apply_rewards([ro("fine"), ro("slow"), ro("crash")], [judge])
    assert [r.failed for r in out] == [False, True, True]
    assert "timed out after 0.2 s" in out[1].error
    assert "raised ConnectionError: connection refused" in out[2].error
    assert stats["rewards/rubric/timeouts"] == 1 and stats["rewards/rubric/errors"] == 1
    assert stats["rewards/rubric/failures"] == 2 and stats["rewards/failed_rollouts"] == 2


async def test_judge_failures_are_excluded_from_group_statistics_not_zero() -> None:
    """Group rewards [1, 0, failure]: GRPO advantages over [1, 0] (+0.5, -0.5).

    Had the failure become a 0, the mean would be 1/3 and the advantages 2/3, -1/3, -1/3.
    """
    one = Rubric((Criterion("good", "The answer is good."),))
    replies = {"great": '{"verdicts": {"good": "yes"}}', "poor": '{"verdicts": {"good": "no"}}'}
    judge = RubricJudge(ScriptedChatClient(lambda req: replies.get(answer_in(req), "???")), one)
    out, _ = await apply_rewards([ro("great"), ro("poor"), ro("broken")], [judge])
    assert [r.failed for r in out] == [False, False, True]
    weights = GroupNormalizedReturn().compute(out)
    assert weights == {(out[0].id, 0): pytest.approx(0.5), (out[1].id, 0): pytest.approx(-0.5)}
    normed = GroupNormalizedReturn(normalize_adv=True).compute(out)
    assert normed[(out[0].id, 0)] == pytest.approx(1.0, abs=1e-5)  # std over [1, 0] is 0.5


# -- cache -------------------------------------------------------------------------------------------
async def test_cached_judge_calls_are_not_repeated() -> None:
    client = ScriptedChatClient(lambda req: verdict("yes", 3, "yes"))
    judge = RubricJudge(client, RUBRIC)
    # the same answer twice in one batch: one call (the second waits for the first)
    out, stats = await apply_rewards([ro("same"), ro("same"), ro("other")], [judge])
    assert len(client.requests) == 2
    assert stats["rewards/rubric/judge_calls"] == 2 and stats["rewards/rubric/cache_hits"] == 1
    assert out[0].total_reward == out[1].total_reward == pytest.approx((1 + 3 * 0.5 + 2) / 6)
    # a later batch asking the same prompts: no call at all
    out2, stats2 = await apply_rewards([ro("same"), ro("other")], [judge])
    assert len(client.requests) == 2
    assert stats2["rewards/rubric/judge_calls"] == 0 and stats2["rewards/rubric/cache_hits"] == 2
    assert out2[0].steps[-1].info["reward_info"]["rubric"]["cached"] is True
    # a different task is a different prompt
    await apply_rewards([ro("same", question="Why is grass green?")], [judge])
    assert len(client.requests) == 3
    # a judge whose weights changed (the policy's own client after a step) is asked again
    client.sync_weights({}, version=7)
    await apply_rewards([ro("same")], [judge])
    assert len(client.requests) == 4


async def test_failures_are_not_cached() -> None:
    client = ScriptedChatClient(["bad", "bad", verdict("yes", 5, "yes")])
    judge = RubricJudge(client, RUBRIC)
    out, _ = await apply_rewards([ro("a")], [judge])
    assert out[0].failed
    out, _ = await apply_rewards([ro("a")], [judge])
    assert not out[0].failed and len(client.requests) == 3


async def test_caller_cache_is_bounded() -> None:
    client = ScriptedChatClient(lambda req: "{}")
    caller = JudgeCaller(client, cache_size=2, sampling=SamplingConfig(temperature=0.0, max_tokens=8))
    for q in ("a", "b", "c", "a"):
        await caller.ask([{"role": "user", "content": q}], lambda t: t)
    assert len(client.requests) == 4  # "a" was evicted by "c"
    assert caller.take_stats()["cache_hits"] == 0 and caller.take_stats()["judge_calls"] == 0  # reset


# -- group judge -------------------------------------------------------------------------------------
def shown_answers(req: ChatCompletionRequest) -> dict[int, str]:
    text = req.messages[-1]["content"]
    return {int(k): v for k, v in re.findall(r"ANSWER (\d+):\n<<<\n(.*?)\n>>>", text, re.S)}


async def test_group_judge_ranking_maps_to_the_rewards_given() -> None:
    preference = ["best", "middle", "worst"]

    def script(req: ChatCompletionRequest) -> str:
        number_of = {a: k for k, a in shown_answers(req).items()}
        return json.dumps({"reasoning": "by taste", "ranking": [number_of[a] for a in preference]})

    client = ScriptedChatClient(script)
    judge = GroupJudge(client, mode="rank", rank_rewards=[1.0, 0.25, -1.0], name="ruler")
    group = [ro("worst"), ro("best"), ro("middle")]
    out, stats = await apply_rewards(group, [judge])
    assert [r.total_reward for r in out] == [-1.0, 1.0, 0.25]
    assert [r.steps[-1].info["reward_info"]["ruler"]["rank"] for r in out] == [2, 0, 1]
    assert len(client.requests) == 1 and stats["rewards/ruler/calls"] == 1
    prompt = client.requests[0].messages[-1]["content"]
    assert "Why is the sky blue?" in prompt and "Rank the answers from best to worst" in prompt
    # the shown order is shuffled (seeded by the group id) and recorded
    positions = [r.steps[-1].info["reward_info"]["ruler"]["position"] for r in out]
    assert sorted(positions) == [1, 2, 3]
    assert {shown_answers(client.requests[0])[p] for p in positions} == set(preference)
    # the default mapping: 1 for the best down to 0 for the worst; a function works too
    out, _ = await apply_rewards(group, [GroupJudge(ScriptedChatClient(script), mode="rank")])
    assert [r.total_reward for r in out] == [0.0, 1.0, 0.5]
    rr = GroupJudge(ScriptedChatClient(script), mode="rank", rank_rewards=lambda k, n: float(n - k))
    out, _ = await apply_rewards(group, [rr])
    assert [r.total_reward for r in out] == [1.0, 3.0, 2.0]


async def test_group_judge_scores_and_failures() -> None:
    scores_of = {"good": 0.9, "ok": 0.5}

    def script(req: ChatCompletionRequest) -> str:
        shown = shown_answers(req)
        if "broken" in shown.values():
            return "I like them all"
        return json.dumps({"reasoning": "r", "scores": {str(k): scores_of[a] for k, a in shown.items()}})

    judge = GroupJudge(ScriptedChatClient(script), weight=2.0)
    rs = [ro("good", gid="g1"), ro("ok", gid="g1"), ro("ok", gid="g2"), ro("broken", gid="g2")]
    out, stats = await apply_rewards(rs, [judge])
    assert [r.total_reward for r in out[:2]] == [pytest.approx(1.8), pytest.approx(1.0)]
    assert out[2].failed and out[3].failed  # the whole group's verdict was unreadable
    assert all(r.meta["failure_cause"] == "judge_failure" for r in out[2:])
    assert stats["rewards/group_judge/failures"] == 2 and stats["rewards/group_judge/parse_retries"] == 1
    weights = GroupNormalizedReturn().compute(out)
    assert set(weights) == {(out[0].id, 0), (out[1].id, 0)}


async def test_short_rank_rewards_is_a_loud_error() -> None:
    from ludic_lab.rewards import RewardContractError

    judge = GroupJudge(ScriptedChatClient(lambda req: '{"ranking": [1, 2, 3]}'), mode="rank", rank_rewards=[1.0, 0.0])
    with pytest.raises(RewardContractError, match="rank_rewards has 2 values for a group of 3"):
        await apply_rewards([ro("a"), ro("b"), ro("c")], [judge])


# -- group rewards without a model -------------------------------------------------------------------
async def test_majority_vote_and_diversity_compose_with_grpo() -> None:
    group = [
        ro("so it is 42", parsed="42"),
        ro("the answer: 42.", parsed="42 "),
        ro("maybe 7", parsed="7"),
        Rollout(steps=(Step(0, "q", "???", None, "bad format", -0.1, format_reward=-0.1),), group_id="g"),
    ]
    majority = MajorityVoteReward()
    out, stats = await apply_rewards(group, [majority])
    assert [r.steps[-1].info["rewards"]["majority_vote"] for r in out] == [1.0, 1.0, 0.0, 0.0]
    totals = [r.total_reward for r in out]
    assert totals == pytest.approx([1.0, 1.0, 0.0, -0.1])
    weights = GroupNormalizedReturn().compute(out)
    mean = sum(totals) / 4
    assert [weights[(r.id, 0)] for r in out] == pytest.approx([t - mean for t in totals])
    assert stats["rewards/majority_vote/mean"] == 0.5
    # every answer different: no majority (min_votes=2), all 0
    distinct, _ = await apply_rewards([ro("a"), ro("b")], [MajorityVoteReward()])
    assert [r.total_reward for r in distinct] == [0.0, 0.0]

    diverse = [ro("the cat sat"), ro("the cat ran"), ro("a dog barked")]
    out, _ = await apply_rewards(diverse, [DiversityBonus(weight=1.0), MajorityVoteReward(weight=0.0)])
    assert [r.steps[-1].info["rewards"]["diversity"] for r in out] == [0.5, 0.5, 1.0]
    assert [r.total_reward for r in out] == [0.5, 0.5, 1.0]


# -- a real model as the judge -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_judge_client(tiny_model_dir):
    from ludic_lab.inference.local.client import LocalChatClient

    return LocalChatClient(tiny_model_dir)


async def test_tiny_model_as_judge_end_to_end(tiny_judge_client) -> None:
    """The plumbing with a real model: every rollout gets a parsed verdict or a recorded failure, info kept."""
    one = Rubric((Criterion("good", "The answer is helpful."),))
    judge = RubricJudge(tiny_judge_client, one, sampling=SamplingConfig(temperature=0.0, max_tokens=24), timeout_s=60)
    rs = [ro("Because air scatters blue light.", gid="g"), ro("No idea.", gid="g"), ro("Blue.", gid="g")]
    out, stats = await apply_rewards(rs, [judge])
    for r in out:
        info = r.steps[-1].info["reward_info"]["rubric"]
        assert isinstance(info["judge_reply"], str)
        if r.failed:
            assert r.meta["failure_cause"] == "judge_failure" and info["attempts"] == 2
        else:
            assert info["verdicts"]["good"] in ("yes", "no") and r.total_reward in (0.0, 1.0)
    assert stats["rewards/rubric/judge_calls"] >= 3
    assert stats["rewards/rubric/failures"] + stats["rewards/rubric/scored"] == 3
    weights = GroupNormalizedReturn().compute(out)  # credit runs on whatever survived
    assert all((r.id, 0) in weights for r in out if not r.failed)


async def test_credit_view_shows_verdicts_and_failures() -> None:
    from ludic_lab.lab.rollout_html import rollouts_html

    client = ScriptedChatClient(
        lambda req: (
            verdict("yes", 4, "no", reasoning="Right <b>but</b> long.")
            if "good one" in req.messages[1]["content"]
            else "??"
        )
    )
    out, _ = await apply_rewards([ro("good one"), ro("bad one")], [RubricJudge(client, RUBRIC)])
    page = rollouts_html(out, weights=GroupNormalizedReturn().compute(out))
    assert "rubric: <b>+0.542</b> (weight 1)" in page and "clear: yes, correct: 4, concise: no" in page
    assert "Right &lt;b&gt;but&lt;/b&gt; long." in page  # escaped
    assert "rubric: <span class='ll-err'>failed: unreadable judge reply" in page


# -- one question per criterion (small judges) ------------------------------------------------------
async def test_per_criterion_questions_score_like_the_rubric() -> None:
    def script(req: ChatCompletionRequest) -> str:
        q = req.messages[-1]["content"]
        if "easy to follow" in q:
            return "Yes."
        if "factually right" in q:
            return "I would say 4 out of 5"
        return "no, it is two sentences"

    client = ScriptedChatClient(script)
    judge = RubricJudge(client, RUBRIC, ask="per_criterion")
    out, stats = await apply_rewards([ro("Scattering."), ro("Scattering.")], [judge])
    assert [r.total_reward for r in out] == [pytest.approx(3.25 / 6)] * 2
    info = out[0].steps[-1].info["reward_info"]["rubric"]
    assert info["verdicts"] == {"clear": "yes", "correct": 4, "concise": "no"}
    assert info["judge_replies"]["correct"] == "I would say 4 out of 5"
    assert len(client.requests) == 3 and stats["rewards/rubric/cache_hits"] == 3  # one call per criterion
    first = client.requests[0]
    assert first.sampling.max_tokens == 8 and "Reply with one word: yes or no." in first.messages[-1]["content"]
    assert "Reply with one number from 1 (not at all) to 5 (fully)." in client.requests[1].messages[-1]["content"]
    assert "JSON" not in first.messages[0]["content"]


async def test_per_criterion_unreadable_answer_fails_the_rollout() -> None:
    client = ScriptedChatClient(lambda req: "maybe" if "factually" in str(req.messages) else "yes")
    out, stats = await apply_rewards([ro("x")], [RubricJudge(client, RUBRIC, ask="per_criterion")])
    assert out[0].failed and out[0].error.startswith("judge_failure: rubric: correct: unreadable judge reply")
    assert stats["rewards/rubric/parse_retries"] == 1 and stats["rewards/rubric/judge_calls"] == 4
    with pytest.raises(ValueError, match="ask must be"):
        RubricJudge(client, RUBRIC, ask="xml")  # type: ignore[arg-type]


# -- a VLLMChatClient as the judge (its real HTTP exchange, against a scripted server) -------------
@pytest.fixture
def verdict_server(tiny_model_dir):
    """An OpenAI-style /v1/completions server answering every request with a rubric verdict's token ids."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.encode('{"verdicts": {"good": "yes"}}', add_special_tokens=False)
    bodies: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            n = int(self.headers.get("content-length") or 0)
            bodies.append(json.loads(self.rfile.read(n) or b"{}"))
            choice = {"token_ids": ids, "text": "", "finish_reason": "stop", "stop_reason": None, "logprobs": None}
            data = json.dumps(
                {"choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": len(ids)}}
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1", bodies
    srv.shutdown()
    srv.server_close()


async def test_vllm_client_as_judge(tiny_model_dir, verdict_server) -> None:
    from ludic_lab.inference.vllm.client.client import VLLMChatClient

    api_base, bodies = verdict_server
    client = VLLMChatClient(tiny_model_dir, api_base=api_base, max_retries=0, connect_timeout_s=2.0)
    judge = RubricJudge(client, Rubric((Criterion("good", "The answer is good."),)), model="served-judge")
    out, stats = await apply_rewards([ro("one"), ro("two")], [judge])
    assert [r.total_reward for r in out] == [1.0, 1.0]
    assert out[0].steps[-1].info["reward_info"]["rubric"]["verdicts"] == {"good": "yes"}
    assert len(bodies) == 2 and all(b["temperature"] == 0.0 for b in bodies)
    assert stats["rewards/rubric/judge_calls"] == 2


@pytest.mark.slow
async def test_smollm2_as_a_per_criterion_judge(default_model_dir) -> None:
    """The embedded model as judge, one question per criterion: readable verdicts or recorded failures."""
    from ludic_lab.inference.local.client import LocalChatClient

    client = LocalChatClient(default_model_dir)
    rubric = Rubric((Criterion("on_topic", "The answer explains why the sky is blue."),))
    judge = RubricJudge(client, rubric, ask="per_criterion", timeout_s=600)
    answers = ["Sunlight bounces off air and blue bounces most.", "I like pizza.", "Because it is blue."]
    out, stats = await apply_rewards([ro(a) for a in answers], [judge])
    for r in out:
        info = r.steps[-1].info["reward_info"]["rubric"]
        assert isinstance(info["judge_replies"]["on_topic"], str)
        assert r.failed or info["verdicts"]["on_topic"] in ("yes", "no")
    assert stats["rewards/rubric/judge_calls"] >= 3
    assert stats["rewards/rubric/scored"] + stats["rewards/rubric/failures"] == 3


# -- pairwise ------------------------------------------------------------------------------------
def pair_answers(req: ChatCompletionRequest) -> tuple[str, str]:
    text = req.messages[-1]["content"]
    a = re.search(r"ANSWER A:\n<<<\n(.*?)\n>>>", text, re.S)
    b = re.search(r"ANSWER B:\n<<<\n(.*?)\n>>>", text, re.S)
    assert a is not None and b is not None
    return a.group(1), b.group(1)


async def test_pairwise_judge_win_rates() -> None:
    from ludic_lab.judges import PairwiseJudge

    rank = {"best": 0, "middle": 1, "worst": 2}

    def prefer(req: ChatCompletionRequest) -> str:
        a, b = pair_answers(req)
        return "A" if rank[a] < rank[b] else "Answer B is better."

    client = ScriptedChatClient(prefer)
    out, stats = await apply_rewards([ro("worst"), ro("best"), ro("middle")], [PairwiseJudge(client)])
    assert [r.total_reward for r in out] == [0.0, 1.0, 0.5]
    assert len(client.requests) == 6  # 3 pairs, both orders
    assert out[1].steps[-1].info["reward_info"]["pairwise"]["comparisons"] == 4
    # a judge that always says "A" (pure position bias) cancels out over both orders
    out, _ = await apply_rewards(
        [ro("worst"), ro("best"), ro("middle")], [PairwiseJudge(ScriptedChatClient(lambda r: "A"))]
    )
    assert [r.total_reward for r in out] == [0.5, 0.5, 0.5]


async def test_pairwise_failed_comparisons_are_left_out_and_counted() -> None:
    from ludic_lab.judges import PairwiseJudge

    def judge(req: ChatCompletionRequest) -> str:
        everything = " ".join(m["content"] for m in req.messages)
        return "??" if "broken" in everything else ("A" if pair_answers(req)[0] == "good" else "B")

    out, stats = await apply_rewards([ro("good"), ro("bad"), ro("broken")], [PairwiseJudge(ScriptedChatClient(judge))])
    assert [r.total_reward for r in out[:2]] == [1.0, 0.0]
    assert out[2].failed and "all 4 comparisons of member 3 failed" in out[2].error
    assert out[0].steps[-1].info["reward_info"]["pairwise"]["failed_comparisons"] == 2
    assert stats["rewards/pairwise/parse_failures"] == 4


DEEP = "[" * 100_000 + "]" * 100_000  # legal JSON past Python's recursion limit


async def test_a_deeply_nested_judge_reply_is_retried_and_fails_only_its_own_rollout() -> None:
    def script(req: ChatCompletionRequest) -> str:
        nested = any("<<<\nnested\n>>>" in str(m["content"]) for m in req.messages)  # the retry too
        return '{"reasoning": "r", "verdicts": ' + DEEP + "}" if nested else verdict("yes", 5, "yes")

    client = ScriptedChatClient(script)
    out, stats = await apply_rewards([ro("fine", gid="a"), ro("nested", gid="b")], [RubricJudge(client, RUBRIC)])
    assert not out[0].failed and out[0].total_reward == 1.0  # before: RecursionError failed every rollout of the call
    assert out[1].failed and out[1].meta["failure_cause"] == "judge_failure" and "nested too deeply" in out[1].error
    assert stats["rewards/rubric/parse_retries"] == 1 and stats["rewards/rubric/parse_failures"] == 1
    with pytest.raises(VerdictParseError, match="nested too deeply"):
        extract_json_object("{" + '"a": ' + DEEP + "}")


async def test_a_deeply_nested_group_judge_reply_fails_only_its_group() -> None:
    def script(req: ChatCompletionRequest) -> str:
        if "broken" in shown_answers(req).values():
            return '{"scores": ' + DEEP + "}"
        return json.dumps({"reasoning": "r", "scores": {str(k): 0.5 for k in shown_answers(req)}})

    rs = [ro("good", gid="g1"), ro("ok", gid="g1"), ro("ok", gid="g2"), ro("broken", gid="g2")]
    out, stats = await apply_rewards(rs, [GroupJudge(ScriptedChatClient(script))])
    assert [r.failed for r in out] == [False, False, True, True]
    assert stats["rewards/group_judge/parse_retries"] == 1
