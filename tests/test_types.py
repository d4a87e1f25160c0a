"""Core data (``ludic_lab.types``): validation, coercion, JSONL round trips, summaries, tables."""

from __future__ import annotations

import dataclasses
import json
import math
import sys

import pandas as pd
import pytest
import torch

from ludic_lab.types import (
    ChatResponse,
    Rollout,
    Step,
    TokenTrace,
    finite_or_none,
    load_rollouts,
    rollouts_to_dataframe,
    save_rollouts,
)


def trace(n: int = 3, *, prompt=(1, 2, 3), source="fresh", finish="stop", version=None) -> TokenTrace:
    return TokenTrace(
        prompt_token_ids=prompt,
        completion_token_ids=tuple(range(100, 100 + n)),
        completion_logprobs=tuple(-0.1 * (i + 1) for i in range(n)),
        prompt_source=source,
        policy_version=version,
        finish_reason=finish,
    )


def step(i: int, *, reward: float = 0.0, tr: TokenTrace | None = None, **kw) -> Step:
    base = dict(index=i, prev_obs=f"obs {i}", action=f"act {i}", parsed_action=f"a{i}", next_obs=f"obs {i + 1}")
    base.update(kw)
    return Step(reward=reward, trace=tr, **base)


# -- TokenTrace ----------------------------------------------------------------------------
class TestTokenTrace:
    def test_coerces_sequences_to_int_and_float_tuples(self):
        t = TokenTrace(
            prompt_token_ids=torch.tensor([5, 6]),
            completion_token_ids=[7, 8, 9],
            completion_logprobs=[torch.tensor(-1.5), -2, -0.25],
        )
        assert t.prompt_token_ids == (5, 6) and all(type(x) is int for x in t.prompt_token_ids)
        assert t.completion_token_ids == (7, 8, 9)
        assert t.completion_logprobs == (-1.5, -2.0, -0.25)
        assert all(type(x) is float for x in t.completion_logprobs)
        assert t.input_ids == (5, 6, 7, 8, 9)

    def test_length_mismatch_is_an_error_naming_both_lengths(self):
        with pytest.raises(ValueError, match=r"3 completion ids but 2 logprobs"):
            TokenTrace(prompt_token_ids=(1,), completion_token_ids=(1, 2, 3), completion_logprobs=(-1.0, -1.0))

    def test_empty_prompt_is_rejected(self):
        with pytest.raises(ValueError, match="empty prompt_token_ids"):
            TokenTrace(prompt_token_ids=(), completion_token_ids=(1,), completion_logprobs=(-1.0,))

    def test_bad_prompt_source_is_rejected(self):
        with pytest.raises(ValueError, match="fresh/extended/retokenized"):
            TokenTrace(prompt_token_ids=(1,), completion_token_ids=(2,), prompt_source="rewritten")  # type: ignore[arg-type]

    def test_logprobs_optional_and_frozen(self):
        t = TokenTrace(prompt_token_ids=(1,), completion_token_ids=(2, 3))
        assert t.completion_logprobs is None
        with pytest.raises(dataclasses.FrozenInstanceError):
            t.prompt_source = "extended"  # type: ignore[misc]

    def test_from_response_copies_everything(self):
        r = ChatResponse(
            text="hi",
            completion_token_ids=[4, 5],
            prompt_token_ids=[1, 2, 3],
            completion_logprobs=[-0.5, -0.25],
            finish_reason="length",
            policy_version=7,
        )
        t = TokenTrace.from_response(r, prompt_source="extended")
        assert t == TokenTrace((1, 2, 3), (4, 5), (-0.5, -0.25), "extended", 7, "length")

    def test_from_response_without_ids_says_how_to_ask_for_them(self):
        with pytest.raises(ValueError, match=r"ReturnSpec\(return_token_ids=True"):
            TokenTrace.from_response(ChatResponse(text="no ids"))


# -- ChatResponse --------------------------------------------------------------------------
class TestChatResponse:
    def test_lists_become_tuples_and_top_logprob_keys_ints(self):
        r = ChatResponse(
            text="x",
            completion_token_ids=[1, 2],
            prompt_token_ids=[9],
            completion_logprobs=[-1, -2],
            top_logprobs=[{"3": "-0.5", 4: -1}, {5: -0.1}],
            tool_calls=[{"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        )
        assert r.completion_token_ids == (1, 2) and r.prompt_token_ids == (9,)
        assert r.completion_logprobs == (-1.0, -2.0)
        assert r.top_logprobs == ({3: -0.5, 4: -1.0}, {5: -0.1})
        assert isinstance(r.tool_calls, tuple) and r.tool_calls[0]["function"]["name"] == "f"

    def test_defaults(self):
        r = ChatResponse(text="only text")
        assert (r.completion_token_ids, r.prompt_token_ids, r.completion_logprobs) == (None, None, None)
        assert r.finish_reason == "stop" and r.policy_version is None and r.tool_calls is None

    def test_mismatched_ids_and_logprobs_are_rejected(self):
        with pytest.raises(ValueError, match="2 completion ids but 1 logprobs"):
            ChatResponse(text="x", completion_token_ids=[1, 2], completion_logprobs=[-1.0])

    def test_logprobs_without_ids_are_allowed(self):
        r = ChatResponse(text="x", completion_logprobs=[-1.0, -2.0])
        assert r.completion_logprobs == (-1.0, -2.0)


# -- Step / Rollout --------------------------------------------------------------------------
class TestRolloutSummaries:
    def test_totals_and_flags(self):
        r = Rollout(
            steps=[
                step(0, reward=0.5, tr=trace(3), env_reward=0.25, format_reward=0.25),
                step(1, reward=-1.0, tr=None),  # a scripted turn: no trace
                step(2, reward=0.25, tr=trace(4), terminated=True),
            ],
            env_seed=3,
            sampling_seed=4,
        )
        assert isinstance(r.steps, tuple)
        assert r.total_reward == pytest.approx(-0.25) and isinstance(r.total_reward, float)
        assert r.length == 3
        assert r.num_completion_tokens == 7
        assert not r.failed
        assert r.seeds == {"env_seed": 3, "sampling_seed": 4}
        assert r.steps[2].done and not r.steps[0].done
        assert step(0, truncated=True).done

    def test_empty_and_failed(self):
        r = Rollout(steps=(), error="env.step: ValueError: boom")
        assert r.total_reward == 0.0 and r.length == 0 and r.num_completion_tokens == 0
        assert r.failed

    def test_ids_are_unique_and_with_meta_copies(self):
        a, b = Rollout(steps=()), Rollout(steps=())
        assert a.id != b.id and len(a.id) == 32
        c = a.with_meta(x=1)
        d = c.with_meta(y=2, x=3)
        assert a.meta == {} and c.meta == {"x": 1} and d.meta == {"x": 3, "y": 2}
        assert d.id == a.id


def rich_rollouts() -> list[Rollout]:
    """Rollouts exercising every field: unicode, awkward floats, None, failures, meta."""
    awkward = (0.1, 1 / 3, -1e-300, 5e-324, 1.7976931348623157e308, -0.0, math.pi, float("inf"))
    t1 = TokenTrace(
        prompt_token_ids=(1, 2, 3),
        completion_token_ids=tuple(range(10, 10 + len(awkward))),
        completion_logprobs=awkward,
        prompt_source="fresh",
        policy_version=None,
        finish_reason="length",
    )
    t2 = TokenTrace(
        prompt_token_ids=(1, 2, 3, *t1.completion_token_ids, 4, 5),
        completion_token_ids=(2**31 + 5, 0),
        completion_logprobs=None,
        prompt_source="extended",
        policy_version=12,
    )
    steps = (
        Step(
            index=0,
            prev_obs='Grüße, 世界 \U0001f600 \u200b "quoted" \\ back\nslash\ttab',
            action="<move>B2</move> ✓",
            parsed_action="B2",
            next_obs=None,
            reward=0.1 + 0.2,
            truncated=False,
            terminated=False,
            info={"nested": {"list": [1, 2.5, None, True, "é"]}, "empty": {}, "none": None},
            trace=t1,
            env_reward=0.30000000000000004,
            format_reward=0.0,
        ),
        Step(
            index=1,
            prev_obs="",
            action="",
            parsed_action=None,
            next_obs="Format error: …",
            reward=-1.0,
            info={"parse_error": True},
            trace=t2,
            format_reward=-1.0,
        ),
    )
    return [
        Rollout(
            steps=steps,
            agent_id="X",
            group_id="g/0",
            env_seed=0,
            sampling_seed=2**40,
            policy_version=12,
            meta={"env": "TicTacToeEnv", "unicode": "ü", "ratio": 1 / 7, "list": [1, "two"], "none": None},
        ),
        Rollout(
            steps=steps[:1],
            error="env.step: RuntimeError: sensor failure — «details»",
            meta={"error_phase": "env.step"},
        ),
        Rollout(steps=(), error="ValueError: DatasetQAEnv: the dataset is empty"),
    ]


class TestJsonl:
    def test_round_trip_is_exact(self, tmp_path):
        rollouts = rich_rollouts()
        path = tmp_path / "r.jsonl"
        assert save_rollouts(rollouts, path) == 3
        back = load_rollouts(path)
        assert back == rollouts
        # floats come back bit-for-bit (repr round trip), including -0.0 and subnormals
        lp = back[0].steps[0].trace.completion_logprobs
        assert [x.hex() for x in lp] == [x.hex() for x in rollouts[0].steps[0].trace.completion_logprobs]
        assert math.copysign(1.0, lp[5]) == -1.0
        assert back[0].steps[1].trace.completion_logprobs is None
        assert back[0].steps[0].next_obs is None and back[0].steps[1].parsed_action is None
        assert back[1].failed and back[1].error == rollouts[1].error
        assert back[2].steps == ()

    def test_lines_are_utf8_json_one_per_rollout(self, tmp_path):
        path = tmp_path / "r.jsonl"
        save_rollouts(rich_rollouts(), path)
        raw = path.read_text(encoding="utf-8")
        lines = raw.splitlines()
        assert len(lines) == 3 and raw.endswith("\n")
        assert "世界" in lines[0]  # ensure_ascii=False: readable, not \\u escapes
        d = json.loads(lines[0])
        assert d["steps"][0]["trace"]["completion_token_ids"][0] == 10
        assert Rollout.from_json(lines[0]) == rich_rollouts()[0].__class__.from_dict(d)

    def test_nan_survives(self, tmp_path):
        t = TokenTrace((1,), (2,), (float("nan"),))
        r = Rollout(steps=(step(0, reward=float("nan"), tr=t),))
        path = tmp_path / "nan.jsonl"
        save_rollouts([r], path)
        (back,) = load_rollouts(path)
        assert math.isnan(back.steps[0].reward) and math.isnan(back.steps[0].trace.completion_logprobs[0])

    def test_append_and_blank_lines(self, tmp_path):
        path = tmp_path / "r.jsonl"
        rs = rich_rollouts()
        save_rollouts(rs[:1], path)
        with open(path, "a", encoding="utf-8") as f:
            f.write("\n   \n")
        assert save_rollouts(rs[1:], path, append=True) == 2
        assert load_rollouts(path) == rs
        save_rollouts(rs[:1], path)  # overwrite by default
        assert load_rollouts(path) == rs[:1]

    def test_empty_file_gives_no_rollouts(self, tmp_path):
        path = tmp_path / "empty.jsonl"
        assert save_rollouts([], path) == 0
        assert load_rollouts(path) == []

    @pytest.mark.parametrize(
        "bad, why",
        [
            ("{not json", "Expecting property name"),
            ('{"steps": [], "bogus_field": 1}', "unknown fields \\['bogus_field'\\]"),
            ('{"steps": [{"index": 0}]}', "missing"),
            (
                '{"steps": [{"index": 0, "prev_obs": "", "action": "", "parsed_action": null, "next_obs": null, '
                '"reward": 0, "trace": {"prompt_token_ids": [], "completion_token_ids": []}}]}',
                "empty prompt_token_ids",
            ),
        ],
    )
    def test_bad_line_is_reported_with_its_number(self, tmp_path, bad, why):
        path = tmp_path / "bad.jsonl"
        save_rollouts(rich_rollouts()[:2], path)
        with open(path, "a", encoding="utf-8") as f:
            f.write("\n" + bad + "\n")
        with pytest.raises(ValueError, match=rf"bad\.jsonl:4: not a valid rollout line .*{why}"):
            load_rollouts(path)

    def test_missing_file_is_a_file_not_found_error(self, tmp_path):
        with pytest.raises(FileNotFoundError):
            load_rollouts(tmp_path / "nope.jsonl")


class TestDataFrame:
    def test_one_row_per_rollout(self):
        rs = rich_rollouts()
        df = rollouts_to_dataframe(rs)
        assert len(df) == 3
        assert list(df["rollout_id"]) == [r.id for r in rs]
        assert list(df["num_steps"]) == [2, 1, 0]
        assert df["total_reward"].tolist() == pytest.approx([0.1 + 0.2 - 1.0, 0.1 + 0.2, 0.0])
        assert list(df["completion_tokens"]) == [10, 8, 0]
        assert list(df["parse_errors"]) == [1, 0, 0]
        assert pd.isna(df["error"].iloc[0]) and df["error"].iloc[2].startswith("ValueError")
        assert df["final_action"].tolist()[:2] == ["", "<move>B2</move> ✓"] and pd.isna(df["final_action"].iloc[2])
        assert df["agent_id"].tolist()[0] == "X" and df["group_id"].tolist()[0] == "g/0"
        # scalar meta becomes columns, lists are left out
        assert df["meta.env"].tolist()[0] == "TicTacToeEnv"
        assert "meta.list" not in df.columns and "meta.error_phase" in df.columns

    def test_one_row_per_step(self):
        rs = rich_rollouts()
        df = rollouts_to_dataframe(rs, per="step")
        assert len(df) == 3  # 2 + 1 + 0
        assert df["step"].tolist() == [0, 1, 0]
        assert df["rollout_id"].tolist() == [rs[0].id, rs[0].id, rs[1].id]
        assert df["parse_error"].tolist() == [False, True, False]
        assert df["prompt_source"].tolist() == ["fresh", "extended", "fresh"]
        assert df["finish_reason"].tolist() == ["length", "stop", "length"]
        assert df["completion_tokens"].tolist() == [8, 2, 8]
        assert df["format_reward"].tolist() == [0.0, -1.0, 0.0]

    def test_steps_without_trace(self):
        df = rollouts_to_dataframe([Rollout(steps=(step(0),))], per="step")
        assert df["completion_tokens"].tolist() == [0]
        assert df["prompt_source"].isna().all() and df["finish_reason"].isna().all()

    @pytest.mark.parametrize("rollouts", [[], None])
    def test_bad_per_is_an_error_even_without_rollouts(self, rollouts):
        rs = rich_rollouts() if rollouts is None else rollouts
        with pytest.raises(ValueError, match="per must be 'rollout' or 'step'"):
            rollouts_to_dataframe(rs, per="episode")  # type: ignore[arg-type]

    def test_empty_input_gives_empty_frame(self):
        assert len(rollouts_to_dataframe([])) == 0
        assert len(rollouts_to_dataframe([], per="step")) == 0


def test_finite_or_none():
    assert finite_or_none(1.5) == 1.5
    assert finite_or_none(None) is None
    assert finite_or_none(float("nan")) is None
    assert finite_or_none(float("-inf")) is None
    assert finite_or_none(sys.float_info.max) == sys.float_info.max
