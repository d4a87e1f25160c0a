"""Evaluation: the pass@k estimator against brute force, success rules, the evaluator end to end.

Fast tests drive real ``DatasetQAEnv`` episodes with the scripted ChatClient of
``tests/helpers.py`` (real token ids, scripted texts) so every count is known exactly; the
tiny-model tests run ``LocalChatClient`` for determinism and the accept-everything case.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections import Counter
from fractions import Fraction
from typing import Any

import pytest
from helpers import ScriptedChatClient, chatml_template

from ludic_lab.agents import Agent
from ludic_lab.context import FullDialog
from ludic_lab.data import load_math_word_problems
from ludic_lab.envs import DatasetQAEnv
from ludic_lab.eval import (
    TABLE_COLUMNS,
    DefaultSuccess,
    EngineEvaluator,
    EvalResult,
    Evaluator,
    InfoKeySuccess,
    RewardThresholdSuccess,
    eval_inference,
    eval_requests,
    evaluate,
    evaluate_qa,
    evaluate_qa_sync,
    evaluate_sync,
    mean_pass_at_k,
    pass_at_k,
    pass_at_k_curve,
    wilson_interval,
)
from ludic_lab.inference.request import InferenceSpec, SamplingConfig
from ludic_lab.interaction import SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine
from ludic_lab.types import Info, Rollout, Step


# -- pass@k ----------------------------------------------------------------------------------
def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of all k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    hits = sum(any(i < c for i in s) for s in subsets)
    return Fraction(hits, len(subsets))


def test_pass_at_k_equals_brute_force_enumeration_over_all_subsets():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == float(brute_force_pass_at_k(n, c, k)), (n, c, k)


def test_pass_at_1_is_the_fraction_correct_and_edges():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3, abs=0)
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 6, 5) == 1.0  # n - c < k: every 5-subset holds a correct sample
    assert pass_at_k(5, 5, 5) == 1.0


def test_pass_at_k_large_n_stable_form_matches_exact_value():
    # n above the exact-arithmetic limit goes through the log1p/expm1 product form
    for n, c, k in [(2500, 1, 1), (2500, 3, 10), (3000, 1500, 100), (5000, 2, 1)]:
        exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    # tiny probabilities keep their relative precision (1 - ratio would cancel)
    n, c, k = 3000, 1, 1
    assert pass_at_k(n, c, k) == pytest.approx(1 / 3000, rel=1e-14)


def test_pass_at_k_bad_input_errors_say_what_to_do():
    with pytest.raises(ValueError, match="at least k samples"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_at_k(3, 1, 0)
    with pytest.raises(TypeError):
        pass_at_k(3.0, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="item 1"):
        mean_pass_at_k([(3, 1), (1, 1)], 2)


def test_mean_pass_at_k_and_curve_average_over_items():
    counts = [(3, 0), (3, 1), (3, 3), (3, 2)]
    assert mean_pass_at_k(counts, 1) == pytest.approx(0.5)
    assert mean_pass_at_k(counts, 2) == pytest.approx((0 + 2 / 3 + 1 + 1) / 4)
    assert pass_at_k_curve(counts, 3) == pytest.approx({1: 0.5, 2: (2 / 3 + 2) / 4, 3: 0.75})
    # an item with too few samples is left out of the k it cannot estimate
    assert pass_at_k_curve([(3, 3), (1, 0)], 2) == pytest.approx({1: 0.5, 2: 1.0})
    assert math.isnan(mean_pass_at_k([], 1))


def test_wilson_interval_hand_values():
    lo, hi = wilson_interval(8, 10)
    assert (lo, hi) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and hi == pytest.approx(0.2775, abs=1e-4)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


# -- success rules ---------------------------------------------------------------------------
def _rollout(*infos: Info, rewards: list[float] | None = None, error: str | None = None) -> Rollout:
    rewards = rewards or [0.0] * len(infos)
    steps = tuple(
        Step(index=i, prev_obs="q", action="a", parsed_action="a", next_obs="o", reward=r, info=dict(info))
        for i, (info, r) in enumerate(zip(infos, rewards, strict=True))
    )
    return Rollout(steps=steps, error=error)


def test_success_rules():
    info_rule = InfoKeySuccess()
    assert info_rule(_rollout({"correct": False}, {"correct": True}))
    assert not info_rule(_rollout({"correct": True}, {"correct": False}))  # the last verdict counts
    assert not info_rule(_rollout({"parse_error": True}))
    thr = RewardThresholdSuccess(0.5)
    assert thr(_rollout({}, rewards=[0.6])) and not thr(_rollout({}, rewards=[0.5]))
    assert not thr(_rollout({}, rewards=[math.nan]))
    default = DefaultSuccess()
    assert not default(_rollout({"correct": False}, rewards=[5.0]))  # the verdict beats the reward
    assert default(_rollout({}, rewards=[0.1]))
    assert "correct" in default.name and "0" in thr.name


# -- requests and sampling settings -------------------------------------------------------------
def test_eval_requests_share_env_seed_and_use_distinct_sampling_seeds():
    reqs = eval_requests(EnvSpec("qa"), ProtocolSpec("p"), [7, 7, 3], k=2, max_steps=1, sampling_seed=100)
    seeds = [r.episode_seeds(e) for r in reqs for e in range(r.num_episodes)]
    assert seeds == [(7, 100), (7, 101), (7, 102), (7, 103), (3, 104), (3, 105)]
    assert [r.meta["eval_item"] for r in reqs] == [0, 1, 2]  # duplicate seeds stay separate items
    with pytest.raises(ValueError, match="k"):
        eval_requests(EnvSpec("qa"), ProtocolSpec("p"), [1], k=0)
    with pytest.raises(TypeError, match="seeds"):
        eval_requests(EnvSpec("qa"), ProtocolSpec("p"), 5, k=1)  # type: ignore[arg-type]
    import numpy as np

    assert [r.env_seed for r in eval_requests(EnvSpec("qa"), ProtocolSpec("p"), np.arange(2), k=1)] == [0, 1]


def test_eval_inference_defaults_greedy_for_k1_and_warns_on_greedy_pass_at_k():
    assert eval_inference(k=1).sampling.temperature == 0.0
    assert eval_inference(k=4).sampling.temperature == 1.0
    mine = InferenceSpec(sampling=SamplingConfig(temperature=0.7, max_tokens=9))
    assert eval_inference(mine, k=3).sampling == SamplingConfig(temperature=0.7, max_tokens=9)
    spec = eval_inference(mine, k=3, temperature=0.2, max_tokens=5)
    assert (spec.sampling.temperature, spec.sampling.max_tokens) == (0.2, 5)
    with pytest.warns(UserWarning, match="pass@k equals pass@1"):
        eval_inference(k=2, temperature=0.0)


# -- the evaluator with a scripted policy (exact counts) ---------------------------------------
DATA = [{"id": f"q{i}", "question": f"Q{i}: what is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
CORRECT_PER_ITEM = {0: 0, 1: 1, 2: 3, 3: 2}  # of k = 3 samples; item 0 never even parses


def scripted_policy() -> ScriptedChatClient:
    calls: Counter[int] = Counter()

    def reply(request: Any) -> str:
        question = request.messages[-1]["content"]
        i = int(question[1 : question.index(":")])
        n = calls[i]
        calls[i] += 1
        if i == 0:
            return "no idea"  # no <answer> tag: a parse error, the env is never called
        return f"<answer>{2 * i}</answer>" if n < CORRECT_PER_ITEM[i] else "<answer>-1</answer>"

    return ScriptedChatClient(reply, chat_template=chatml_template())


class FlakyQAEnv(DatasetQAEnv):
    """A QA env whose reset raises for the seeds in ``bad_seeds``."""

    def __init__(self, data: Any, bad_seeds: tuple[int, ...] = (), **kw: Any) -> None:
        super().__init__(data, **kw)
        self.bad_seeds = bad_seeds

    def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        if seed in self.bad_seeds:
            raise OSError(f"dataset shard for seed {seed} is unreadable")
        return super().env_reset(seed=seed)


def qa_setup(client: Any, **env_kw: Any) -> tuple[RolloutEngine, EnvSpec, ProtocolSpec]:
    engine = RolloutEngine(
        {"qa": lambda **kw: FlakyQAEnv(DATA, **{**env_kw, **kw})},
        {"agent": lambda: SingleAgentSyncProtocol(Agent(client, FullDialog(), DatasetQAEnv.recommended_parser()))},
    )
    return engine, EnvSpec("qa"), ProtocolSpec("agent")


async def test_evaluate_counts_successes_pass_at_k_and_parse_errors_exactly():
    engine, env, proto = qa_setup(scripted_policy())
    res = await evaluate(engine, env, proto, range(4), k=3, temperature=1.0, success=InfoKeySuccess())
    assert isinstance(res, EvalResult)
    t = res.table
    assert list(t.columns) == list(TABLE_COLUMNS) and len(t) == 12
    assert t["item"].tolist() == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    assert t["sample"].tolist() == [0, 1, 2] * 4
    assert t["env_seed"].tolist() == t["item"].tolist()
    assert t.groupby("item")["success"].sum().to_dict() == CORRECT_PER_ITEM
    assert t.loc[t["item"] == 0, "parse_error"].all() and not t.loc[t["item"] > 0, "parse_error"].any()
    assert set(t.loc[t["item"] == 2, "target"]) == {"4"}
    assert (t["completion_tokens"] > 0).all()
    s = res.summary()
    assert s["accuracy"] == pytest.approx(6 / 12)
    assert s["pass@1"] == pytest.approx(0.5)
    assert s["pass@2"] == pytest.approx((0 + 2 / 3 + 1 + 1) / 4)
    assert s["pass@3"] == pytest.approx(0.75)
    assert s["parse_error_rate"] == pytest.approx(3 / 12)
    # reward: parse errors -1 (the parser's penalty), correct 1, wrong 0
    assert s["mean_reward"] == pytest.approx((3 * -1 + 6 * 1 + 3 * 0) / 12)
    assert (s["num_items"], s["num_samples"], s["k"], s["num_failed"]) == (4, 12, 3, 0)
    assert s["success_rule"] == "info['correct']"
    assert res.summary(prefix="eval/")["eval/pass@3"] == s["pass@3"]
    per_item = res.per_item()
    assert per_item["n"].tolist() == [3, 3, 3, 3] and per_item["c"].tolist() == [0, 1, 3, 2]


async def test_failed_episodes_are_counted_not_fatal():
    engine, env, proto = qa_setup(scripted_policy(), bad_seeds=(1, 3))
    res = await evaluate(engine, env, proto, range(4), k=3, temperature=1.0)
    s = res.summary()
    assert s["num_failed"] == 6 and s["failure_rate"] == pytest.approx(0.5)
    failed = res.table[res.table["failed"]]
    assert set(failed["item"]) == {1, 3} and not failed["success"].any()
    assert failed["error"].str.contains("unreadable").all()
    # failed episodes are unsolved samples: items 1 and 3 contribute 0 to accuracy and pass@k
    assert s["accuracy"] == pytest.approx(3 / 12)
    assert s["pass@3"] == pytest.approx(1 / 4)  # only item 2 is ever solved
    # the mean reward is over episodes that ran: item 0's parse errors and item 2's wins
    assert s["mean_reward"] == pytest.approx((3 * -1 + 3 * 1) / 6)
    assert len(res.examples(10, which="errors")) == 6


async def test_nan_rewards_are_counted_and_not_successes():
    engine, env, proto = qa_setup(scripted_policy(), correct_reward=math.nan)
    res = await evaluate(engine, env, proto, [1, 2], k=3, temperature=1.0, success=RewardThresholdSuccess(0.5))
    s = res.summary()
    assert s["num_nonfinite_rewards"] == 4  # 1 + 3 correct answers got a NaN reward
    assert s["accuracy"] == 0.0
    assert s["mean_reward"] == 0.0  # over the two finite (wrong-answer) rewards


def test_evaluate_sync_and_engine_evaluator_agree():
    engine, env, proto = qa_setup(scripted_policy())
    res = evaluate_sync(engine, env, proto, [2], k=1)
    assert res.summary()["accuracy"] == 1.0
    ev = EngineEvaluator(engine, env, proto, seeds=[1, 2], options={"k": 3, "temperature": 1.0})
    assert isinstance(ev, Evaluator)
    assert [r.num_episodes for r in ev.requests()] == [3, 3]
    res2 = ev.evaluate_sync()
    assert res2.summary()["pass@3"] == 1.0
    with pytest.raises(TypeError, match="unknown options"):
        EngineEvaluator(engine, env, proto, seeds=[1], options={"kk": 3})
    with pytest.raises(KeyError, match="unknown env kind"):
        EngineEvaluator(engine, EnvSpec("nope"), proto, seeds=[1])


async def test_repr_html_compare_and_examples():
    engine, env, proto = qa_setup(scripted_policy())
    before = await evaluate(engine, env, proto, range(4), k=3, temperature=1.0, name="before")
    html = before._repr_html_()
    assert "<table>" in html and "pass@3" in html and "accuracy" in html and "0.7500" in html
    assert "pass@3=0.7500" in repr(before)
    after = EvalResult.from_rollouts(before.rollouts, k=3, success=lambda r: True, success_rule="all", name="after")
    cmp = before.compare(after)
    assert cmp.loc["accuracy", "delta"] == pytest.approx(0.5)
    assert "success_rule" not in cmp.index
    ex = before.examples(2, which="successes")
    assert len(ex) == 2 and ex["success"].all()
    with pytest.raises(ValueError, match="which"):
        before.examples(which="bad")


async def test_empty_evaluation():
    engine, env, proto = qa_setup(scripted_policy())
    res = await evaluate(engine, env, proto, [], k=2, temperature=1.0)
    s = res.summary()
    assert s["num_samples"] == 0 and math.isnan(s["accuracy"]) and math.isnan(s["pass@1"])
    assert "accuracy" in res._repr_html_()


# -- tiny model, end to end --------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir: str) -> Any:
    from ludic_lab.inference.local.client import LocalChatClient

    return LocalChatClient(tiny_model_dir)


async def test_greedy_k1_evaluation_is_deterministic(tiny_client):
    test_set = load_math_word_problems("test")
    runs = [await evaluate_qa(tiny_client, test_set, limit=6, max_tokens=12) for _ in range(2)]
    cols = ["item", "completion", "reward", "success", "parse_error", "completion_tokens"]
    assert runs[0].table[cols].equals(runs[1].table[cols])
    s = runs[0].summary()
    assert s["k"] == 1 and s["num_samples"] == 6 and s["num_failed"] == 0
    assert s["pass@1"] == s["accuracy"]
    assert runs[0].table["finish_reason"].isin(["stop", "length"]).all()


def test_accept_all_verifier_gives_accuracy_and_pass_at_k_one(tiny_client):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # k > 1 with temperature 1.0: no greedy warning
        res = evaluate_qa_sync(
            tiny_client,
            load_math_word_problems("test"),
            limit=3,
            k=2,
            max_tokens=8,
            parser=identity_parser,  # every completion parses, so the verifier sees every one
            reject_incomplete_completions=False,  # ... even one cut at max_tokens=8
            verifier=lambda prediction, target: True,
        )
    s = res.summary()
    assert s["accuracy"] == 1.0 and s["pass@1"] == 1.0 and s["pass@2"] == 1.0
    assert s["parse_error_rate"] == 0.0 and s["num_samples"] == 6
    # k samples of an item share the question but not the sampling seed
    t = res.table
    assert t.groupby("item")["prompt"].nunique().eq(1).all()
    assert t["sampling_seed"].nunique() == 6


async def test_evaluate_sync_works_inside_a_running_event_loop():
    # as in a Jupyter cell: run_sync hands the coroutine to a background loop
    engine, env, proto = qa_setup(scripted_policy())
    res = evaluate_sync(engine, env, proto, [1, 2], k=3, temperature=1.0)
    assert res.summary()["pass@1"] == pytest.approx((1 / 3 + 1) / 2)
