"""End to end: real model (LocalChatClient) -> Agent -> protocol -> env -> RolloutEngine -> JSONL.

One mixed batch is run per model (the tiny random model always; SmolLM2 under ``slow``):
TicTacToe against the built-in opponent (multi-turn), two-player TicTacToe (two agents
sharing the client) and DatasetQA on the shipped math problems, all in GRPO groups. For every
step of every rollout we check what the trainer relies on:

- decoding the completion ids (special tokens skipped) gives the step's action text;
- turn t+1's prompt ids start with turn t's prompt + completion ids (``"extended"``);
- a plain fp32 forward pass of the same weights over prompt + completion reproduces the
  trace's behaviour logprobs (temperature 1, top_p 1: the raw softmax) within 1e-4.

A random-weight model almost never writes a legal move, so the TicTacToe envs here read the
move from the completion by hashing it onto a legal square (:class:`HashMoveTicTacToe`):
every completion is a real move and games run several turns. The second half feeds the path
bad input (an env that raises, unparseable text, a cut completion, an empty dataset, an
unknown env kind) and checks each gives a clear error or a recorded failed step.
"""

from __future__ import annotations

import itertools
import zlib
from collections import defaultdict
from typing import Any

import pytest
import torch

from ludic_lab.agents import Agent
from ludic_lab.agents.base_agent import derive_seed
from ludic_lab.aio import run_sync
from ludic_lab.context import FullDialog
from ludic_lab.data import load_math_word_problems
from ludic_lab.envs import DatasetQAEnv, TicTacToeEnv, TicTacToeMultiAgentEnv
from ludic_lab.envs.tic_tac_toe import index_to_coord
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import MultiAgentProtocol, SingleAgentSyncProtocol
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import (
    EnvSpec,
    GRPORequestStrategy,
    ProtocolSpec,
    RolloutEngine,
    RolloutRequest,
    UnknownKindError,
)
from ludic_lab.types import Rollout, StepOutcome, load_rollouts, rollouts_to_dataframe, save_rollouts

LOGPROB_ATOL = 1e-4
BATCH_TIMEOUT_S = 1800  # a hang guard: SmolLM2 on a busy 2-core CPU is slow, the tiny model takes seconds
RESULT_REWARD = {"win": 1.0, "draw": 0.5, "loss": 0.0}


# ---------------------------------------------------------------------------------------
# test environments: TicTacToe whose move is read from any text
# ---------------------------------------------------------------------------------------
def hashed_move(text: str, legal: list[int]) -> str:
    """A legal square chosen by the text's CRC32 (deterministic in the text)."""
    return index_to_coord(legal[zlib.crc32(text.encode("utf-8")) % len(legal)])


class HashMoveTicTacToe(TicTacToeEnv):
    """TicTacToe vs the random opponent; any completion becomes a legal move (by hash)."""

    def __init__(self, *, fail_on_step: int | None = None) -> None:
        super().__init__(opponent="random")
        self.fail_on_step = fail_on_step
        self.step_calls = 0

    def env_step(self, action: str) -> StepOutcome:
        self.step_calls += 1
        if self.step_calls == self.fail_on_step:
            raise RuntimeError("board sensor failure")
        legal = self.game.legal_moves()
        return super().env_step(hashed_move(action, legal) if legal else action)


class HashMoveTicTacToe2P(TicTacToeMultiAgentEnv):
    """Two-player TicTacToe; any completion becomes a legal move (by hash)."""

    def step(self, actions):
        legal = self.game.legal_moves()
        if legal:
            actions = {a: hashed_move(t, legal) for a, t in actions.items()}
        return super().step(actions)


# ---------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["tiny", pytest.param("default", marks=pytest.mark.slow)])
def model_name(request) -> str:
    """``"tiny"`` (random weights, fast) or ``"default"`` (SmolLM2-135M-Instruct, slow)."""
    return request.param


@pytest.fixture(scope="module")
def model_dir(request, model_name) -> str:
    return request.getfixturevalue("tiny_model_dir" if model_name == "tiny" else "default_model_dir")


@pytest.fixture(scope="module")
def client(model_dir) -> LocalChatClient:
    return LocalChatClient(model_dir, max_batch_size=16)


@pytest.fixture(scope="module")
def ref_model(model_dir):
    """An independent fp32 copy of the same weights, for plain forward passes."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def inference(max_tokens: int) -> InferenceSpec:
    return InferenceSpec(
        sampling=SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=max_tokens),
        return_=ReturnSpec.for_training(),
    )


def make_engine(client: LocalChatClient, **kw: Any) -> RolloutEngine:
    data = load_math_word_problems("train")

    def single(parser=identity_parser, **pkw):
        return lambda: SingleAgentSyncProtocol(
            Agent(client, FullDialog(), parser, reject_incomplete_completions=False), **pkw
        )

    def two_players():
        return MultiAgentProtocol(
            {
                m: Agent(client, FullDialog(), identity_parser, reject_incomplete_completions=False, name=f"player_{m}")
                for m in ("X", "O")
            }
        )

    return RolloutEngine(
        {
            "ttt": HashMoveTicTacToe,
            "ttt2": HashMoveTicTacToe2P,
            "qa": lambda: DatasetQAEnv(data),
        },
        {
            "single": single(),
            "single_qa": single(DatasetQAEnv.recommended_parser(error_reward=-0.5)),
            "two_players": two_players,
        },
        **kw,
    )


def batch_requests(model: str) -> list[RolloutRequest]:
    """GRPO groups of TicTacToe (multi-turn), two-player TicTacToe and math QA.

    SmolLM2 on a CPU re-reads each growing multi-turn prompt every turn, so its batch is
    smaller: one two-player game instead of a group of two, shorter answers.
    """
    tiny = model == "tiny"
    ttt_tokens, qa_tokens = (8, 8) if tiny else (12, 32)
    grpo = GRPORequestStrategy(2, seed=1234)
    ttt = RolloutRequest(
        EnvSpec("ttt"), ProtocolSpec("single"), env_seed=1, max_steps=5, inference=inference(ttt_tokens)
    )
    ttt2 = RolloutRequest(
        EnvSpec("ttt2"), ProtocolSpec("two_players"), env_seed=7, max_steps=9, inference=inference(ttt_tokens)
    )
    qa = [
        RolloutRequest(
            EnvSpec("qa"), ProtocolSpec("single_qa"), env_seed=s, max_steps=1, inference=inference(qa_tokens)
        )
        for s in (11, 250)
    ]
    two_player = grpo.expand([ttt2]) if tiny else GRPORequestStrategy(1, seed=1234).expand([ttt2])
    return [*grpo.expand([ttt]), *two_player, *grpo.expand(qa)]


def two_player_episodes(model: str) -> int:
    return 2 if model == "tiny" else 1


@pytest.fixture(scope="module")
def batch(client, model_name, tmp_path_factory):
    model = model_name
    requests = batch_requests(model)
    jsonl = tmp_path_factory.mktemp("e2e") / "engine.jsonl"
    engine = make_engine(client, max_concurrency=16, jsonl_path=jsonl)
    rollouts = run_sync(engine.generate_rollouts(requests), timeout=BATCH_TIMEOUT_S)
    return {"requests": requests, "rollouts": rollouts, "engine": engine, "jsonl": jsonl, "model": model}


def by_kind(rollouts: list[Rollout], kind: str) -> list[Rollout]:
    return [r for r in rollouts if r.meta["env_kind"] == kind]


# ---------------------------------------------------------------------------------------
# the per-step checks
# ---------------------------------------------------------------------------------------
@torch.no_grad()
def forward_logprobs(model, prompt: tuple[int, ...], completion: tuple[int, ...]) -> torch.Tensor:
    """log p(completion[i] | prompt + completion[:i]) from one plain forward pass."""
    ids = torch.tensor([list(prompt) + list(completion)], dtype=torch.long)
    logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return lp.gather(-1, torch.tensor(completion, dtype=torch.long)[:, None])[:, 0]


def check_rollout_traces(r: Rollout, client: LocalChatClient, ref_model, max_tokens: int) -> int:
    """Assert the trainer-facing invariants on every step of ``r``; returns the number of steps."""
    tok = client.tokenizer
    stop_ids = client.chat_template.stop_token_ids
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    prev = None
    for s in r.steps:
        t = s.trace
        assert t is not None, f"step {s.index} of {r.id} has no trace"
        ids = t.completion_token_ids
        assert len(ids) >= 1 and len(t.completion_logprobs) == len(ids)
        # 1. the action text is the decoded completion
        assert tok.decode(list(ids), skip_special_tokens=True) == s.action
        # finish reason: recorded in trace and step info, consistent with the ids
        assert s.info["agent"]["finish_reason"] == t.finish_reason
        if t.finish_reason == "length":
            assert len(ids) == max_tokens and ids[-1] not in stop_ids
        else:
            assert t.finish_reason == "stop" and ids[-1] in stop_ids and len(ids) <= max_tokens
        assert t.policy_version == client.policy_version
        # 2. token-exact multi-turn prompts
        if prev is None:
            assert t.prompt_source == "fresh"
        else:
            assert t.prompt_source == "extended"
            n = len(prev.input_ids)
            assert t.prompt_token_ids[:n] == prev.input_ids, f"turn {s.index} does not extend turn {s.index - 1}"
            tail = t.prompt_token_ids[n:]
            if prev.finish_reason == "length":  # a cut turn gets its end-of-turn token added
                assert tail[0] == im_end
            else:
                assert tail[0] != im_end  # ... which is not repeated after a stop
            tail_text = tok.decode(list(tail), skip_special_tokens=False)
            assert s.prev_obs in tail_text and tail_text.endswith("<|im_start|>assistant\n")
        # 3. behaviour logprobs == a plain forward pass of the same weights
        ref = forward_logprobs(ref_model, t.prompt_token_ids, ids)
        got = torch.tensor(t.completion_logprobs)
        diff = (ref - got).abs().max().item()
        assert diff < LOGPROB_ATOL, f"step {s.index}: logprobs differ from a forward pass by {diff:.2e}"
        assert bool((got <= 0).all())
        prev = t
    return len(r.steps)


# ---------------------------------------------------------------------------------------
# the batch
# ---------------------------------------------------------------------------------------
@pytest.mark.timeout(BATCH_TIMEOUT_S)
def test_batch_shape_and_no_failures(batch):
    rollouts = batch["rollouts"]
    assert not [r.error for r in rollouts if r.failed]
    # 1 group x 2 single TTT, (1 group x) 2 or 1 episode(s) x 2 agents, 2 groups x 2 QA
    n2 = 2 * two_player_episodes(batch["model"])
    assert [r.meta["env_kind"] for r in rollouts] == ["ttt"] * 2 + ["ttt2"] * n2 + ["qa"] * 4
    assert len({r.id for r in rollouts}) == len(rollouts) == 6 + n2


@pytest.mark.timeout(BATCH_TIMEOUT_S)
def test_every_step_is_token_exact(batch, client, ref_model):
    def max_tokens(r: Rollout) -> int:
        return batch["requests"][r.meta["request_index"]].inference.sampling.max_tokens

    checked = sum(check_rollout_traces(r, client, ref_model, max_tokens(r)) for r in batch["rollouts"])
    n2 = 2 * two_player_episodes(batch["model"])
    multi_turn = [r for r in batch["rollouts"] if r.length >= 2]
    assert len(multi_turn) == 2 + n2  # every TicTacToe rollout: single-agent ones play >= 3 moves, players >= 2
    assert checked >= 4 + 2 * 3 + n2 * 2
    assert sum(s.trace.prompt_source == "extended" for r in multi_turn for s in r.steps) >= 2 * 2 + n2 * 1


@pytest.mark.timeout(BATCH_TIMEOUT_S)
def test_groups_share_env_seed_and_differ_in_sampling_seed(batch):
    groups: dict[str, list[Rollout]] = defaultdict(list)
    for r in batch["rollouts"]:
        if r.meta["env_kind"] != "ttt2":
            groups[r.group_id].append(r)
    assert len(groups) == 3 and all(len(g) == 2 for g in groups.values())
    differ = []
    for g in groups.values():
        a, b = g
        assert a.env_seed == b.env_seed is not None
        assert a.sampling_seed != b.sampling_seed
        # same prompt, different samples
        assert a.steps[0].prev_obs == b.steps[0].prev_obs
        assert a.steps[0].trace.prompt_token_ids == b.steps[0].trace.prompt_token_ids
        differ.append(a.steps[0].trace.completion_token_ids != b.steps[0].trace.completion_token_ids)
    # a random-weight model never repeats itself; a trained one may give a short answer twice
    assert all(differ) if batch["model"] == "tiny" else any(differ)
    for g in groups.values():
        for r in g:  # each turn derives its own seed from the rollout's sampling seed
            assert [s.info["agent"]["sampling_seed"] for s in r.steps] == [
                derive_seed(r.sampling_seed, t) for t in range(r.length)
            ]


@pytest.mark.timeout(BATCH_TIMEOUT_S)
def test_tictactoe_vs_opponent_plays_real_games(batch):
    for r in by_kind(batch["rollouts"], "ttt"):
        assert 3 <= r.length <= 5
        assert all(not s.done for s in r.steps[:-1])
        last = r.steps[-1]
        assert last.terminated and not last.truncated  # X's 5th move fills the board at the latest
        result = last.info["result"]
        assert r.total_reward == RESULT_REWARD[result] == last.env_reward
        assert all(s.info["parse_error"] is False for s in r.steps)
        for a, b in itertools.pairwise(r.steps):
            assert b.prev_obs == a.next_obs
            assert "opponent_move" in a.info
        assert r.meta["end"] == "terminated" and r.meta["env"] == "HashMoveTicTacToe"


@pytest.mark.timeout(BATCH_TIMEOUT_S)
def test_two_player_tictactoe_gives_one_rollout_per_agent(batch):
    rs = by_kind(batch["rollouts"], "ttt2")
    episodes: dict[str, list[Rollout]] = defaultdict(list)
    for r in rs:
        episodes[r.meta["episode_id"]].append(r)
    assert len(episodes) == two_player_episodes(batch["model"])
    for pair in episodes.values():
        x, o = pair
        assert (x.agent_id, o.agent_id) == ("X", "O")
        assert x.env_seed == o.env_seed and x.sampling_seed == o.sampling_seed and x.group_id == o.group_id
        assert x.length in (o.length, o.length + 1) and o.length >= 2
        assert x.steps[-1].terminated and o.steps[-1].terminated
        result_x = x.steps[-1].info.get("result") or x.steps[-1].info["delivered"][-1]["info"]["result"]
        result_o = o.steps[-1].info.get("result") or o.steps[-1].info["delivered"][-1]["info"]["result"]
        assert {result_x, result_o} in ({"win", "loss"}, {"draw"})
        assert x.total_reward == RESULT_REWARD[result_x] and o.total_reward == RESULT_REWARD[result_o]
        # the player who did not make the final move got its outcome folded into its last step
        assert ("delivered" in x.steps[-1].info) != ("delivered" in o.steps[-1].info)
        # the two players sample with different per-agent seeds
        assert x.meta["agent_sampling_seed"] == derive_seed(x.sampling_seed, "agent", "X")
        assert o.meta["agent_sampling_seed"] == derive_seed(o.sampling_seed, "agent", "O")
        assert x.meta["agent_name"] == "player_X" and o.meta["agent_name"] == "player_O"


@pytest.mark.timeout(BATCH_TIMEOUT_S)
def test_math_qa_episodes(batch):
    data = load_math_word_problems("train")
    for r in by_kind(batch["rollouts"], "qa"):
        assert r.length == 1
        (s,) = r.steps
        row = data[r.env_seed % len(data)]
        assert s.prev_obs == row["question"]
        if s.info["parse_error"]:
            assert s.reward == s.format_reward == -0.5 and s.parsed_action is None
            assert s.truncated and s.info["max_steps_reached"]
        else:
            assert s.terminated and s.info["target"] == row["answer"]
            assert s.reward == (1.0 if s.info["correct"] else 0.0)


@pytest.mark.timeout(BATCH_TIMEOUT_S)
def test_jsonl_round_trip_is_lossless(batch, tmp_path):
    rollouts = batch["rollouts"]
    path = tmp_path / "rollouts.jsonl"
    assert save_rollouts(rollouts, path) == len(rollouts)
    assert load_rollouts(path) == rollouts
    # the engine's own JSONL log holds the same rollouts (in completion order)
    logged = load_rollouts(batch["jsonl"])
    assert sorted(logged, key=lambda r: r.id) == sorted(rollouts, key=lambda r: r.id)


@pytest.mark.timeout(BATCH_TIMEOUT_S)
def test_dataframes(batch):
    rollouts = batch["rollouts"]
    df = rollouts_to_dataframe(rollouts)
    assert len(df) == len(rollouts)
    assert df["rollout_id"].tolist() == [r.id for r in rollouts]
    assert df["num_steps"].tolist() == [r.length for r in rollouts]
    assert df["total_reward"].tolist() == [r.total_reward for r in rollouts]
    assert df["completion_tokens"].tolist() == [r.num_completion_tokens for r in rollouts]
    assert df["meta.env_kind"].tolist() == [r.meta["env_kind"] for r in rollouts]
    steps = rollouts_to_dataframe(rollouts, per="step")
    assert len(steps) == sum(r.length for r in rollouts)
    assert steps["prompt_source"].tolist() == [s.trace.prompt_source for r in rollouts for s in r.steps]
    assert steps["finish_reason"].tolist() == [s.trace.finish_reason for r in rollouts for s in r.steps]
    assert set(steps["agent_id"]) == {"agent_0", "X", "O"}


@pytest.mark.timeout(BATCH_TIMEOUT_S)
def test_seeded_batch_replays_identically(batch, client):
    again = run_sync(make_engine(client).generate_rollouts(batch["requests"]), timeout=BATCH_TIMEOUT_S)

    def tokens(rs):
        return [(r.agent_id, [s.trace.completion_token_ids for s in r.steps], r.total_reward) for r in rs]

    assert tokens(again) == tokens(batch["rollouts"])


# ---------------------------------------------------------------------------------------
# bad input, end to end (tiny model only: these are about the plumbing, not the weights)
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_client(tiny_model_dir) -> LocalChatClient:
    return LocalChatClient(tiny_model_dir, max_batch_size=16)


@pytest.fixture(scope="module")
def tiny_ref(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.mark.timeout(60)
def test_env_raising_in_step_fails_only_its_episodes(tiny_client, tiny_ref):
    engine = make_engine(tiny_client)
    engine.register_env("flaky", lambda: HashMoveTicTacToe(fail_on_step=2))
    reqs = [
        RolloutRequest(EnvSpec(kind), ProtocolSpec("single"), env_seed=0, sampling_seed=s, inference=inference(6))
        for kind, s in (("flaky", 1), ("ttt", 2), ("flaky", 3), ("ttt", 4))
    ]
    rollouts = engine.generate_rollouts_sync(reqs, max_steps=5, timeout_s=30)
    assert len(rollouts) == 4
    ok, bad = rollouts[1::2], rollouts[0::2]
    assert not any(r.failed for r in ok) and all(r.steps[-1].terminated for r in ok)
    for r in bad:
        assert r.failed
        assert r.error == "env.step: RuntimeError: board sensor failure"
        assert r.length == 1 and not r.steps[0].done  # the first move was kept
        assert r.meta["error_phase"] == "env.step" and r.meta["end"] == "error"
        assert "board sensor failure" in r.meta["error_traceback"]
        check_rollout_traces(r, tiny_client, tiny_ref, 6)


@pytest.mark.timeout(60)
def test_garbage_completions_become_parse_error_steps(tiny_client, tiny_ref):
    """Random-model text has no <move> tag: every turn is a synthetic, penalised step, the env is
    never stepped, the parser's feedback reaches the next prompt, and the episode is bounded."""
    envs: list[HashMoveTicTacToe] = []

    def env_factory():
        envs.append(HashMoveTicTacToe())
        return envs[-1]

    parser = TicTacToeEnv.recommended_parser(error_reward=-0.7)
    engine = make_engine(tiny_client)
    engine.register_env("counted", env_factory)
    # cut replies reach the parser here (the default rejects them before it, with -0.1)
    agent = lambda: Agent(tiny_client, FullDialog(), parser, reject_incomplete_completions=False)  # noqa: E731
    engine.register_protocol("strict", lambda: SingleAgentSyncProtocol(agent()))
    reqs = [
        RolloutRequest(
            EnvSpec("counted"),
            ProtocolSpec("strict"),
            env_seed=0,
            sampling_seed=5,
            num_episodes=2,
            inference=inference(8),
        )
    ]
    rollouts = engine.generate_rollouts_sync(reqs, max_steps=3, concurrency=2)
    assert len(envs) == 2 and [e.step_calls for e in envs] == [0, 0]
    for r in rollouts:
        assert not r.failed and r.length == 3
        for s in r.steps:
            assert s.info["parse_error"] is True and s.parsed_action is None
            assert s.reward == s.format_reward == -0.7 and s.env_reward == 0.0
            assert s.next_obs == parser(s.action).obs and s.next_obs.startswith("Format error")
        assert r.steps[-1].truncated and r.steps[-1].info["max_steps_reached"] and not r.steps[-1].terminated
        assert r.total_reward == pytest.approx(-2.1)
        assert r.meta["num_parse_errors"] == 3 and r.meta["end"] == "max_steps"
        check_rollout_traces(r, tiny_client, tiny_ref, 8)  # feedback is in the extended prompts
    stop_early = make_engine(tiny_client)
    stop_early.register_protocol(
        "strict", lambda: SingleAgentSyncProtocol(Agent(tiny_client, FullDialog(), parser), stop_on_parse_error=True)
    )
    (r,) = stop_early.generate_rollouts_sync(
        [RolloutRequest(EnvSpec("ttt"), ProtocolSpec("strict"), env_seed=0, sampling_seed=5, inference=inference(4))],
        max_steps=3,
    )
    assert r.length == 1 and r.steps[0].terminated and r.steps[0].info["terminated_by"] == "parse_error"


@pytest.mark.timeout(60)
def test_completion_cut_at_max_tokens(tiny_client, tiny_ref):
    engine = make_engine(tiny_client)
    engine.register_protocol(
        "qa_identity",
        lambda: SingleAgentSyncProtocol(
            Agent(tiny_client, FullDialog(), identity_parser, reject_incomplete_completions=False)
        ),
    )
    reqs = [
        # graded as is: the cut answer is simply wrong, the episode terminates
        RolloutRequest(EnvSpec("qa"), ProtocolSpec("qa_identity"), env_seed=0, sampling_seed=1, inference=inference(3)),
        # parse error, episode continues: the next prompt closes the cut turn with <|im_end|>
        RolloutRequest(EnvSpec("qa"), ProtocolSpec("single_qa"), env_seed=0, sampling_seed=2, inference=inference(3)),
        # a multi-turn game whose every turn is cut
        RolloutRequest(EnvSpec("ttt"), ProtocolSpec("single"), env_seed=0, sampling_seed=3, inference=inference(3)),
    ]
    graded, continued, game = engine.generate_rollouts_sync(reqs, max_steps=2)
    for r in (graded, continued, game):
        assert not r.failed
        assert all(s.trace.finish_reason == "length" and len(s.trace.completion_token_ids) == 3 for s in r.steps)
        check_rollout_traces(r, tiny_client, tiny_ref, 3)
    assert graded.length == 1 and graded.steps[0].terminated and graded.steps[0].info["correct"] is False
    assert continued.length == 2 and continued.steps[1].trace.prompt_source == "extended"
    assert continued.steps[-1].truncated
    assert game.length == 2 and game.steps[-1].truncated and game.steps[-1].info["truncation_reason"] == "max_steps"
    df = rollouts_to_dataframe([graded, continued, game], per="step")
    assert set(df["finish_reason"]) == {"length"} and set(df["completion_tokens"]) == {3}


@pytest.mark.timeout(60)
def test_empty_dataset(tiny_client):
    """``DatasetQAEnv([])`` raises ``ValueError`` at construction. Through the engine the env
    factory runs inside the episode, so that episode becomes a failed rollout (no steps, the
    ValueError's message as ``error``) and the rest of the batch still runs — the engine
    records failures rather than raising."""
    with pytest.raises(ValueError, match="the dataset is empty; pass at least one sample"):
        DatasetQAEnv([])
    engine = make_engine(tiny_client)
    engine.register_env("empty_qa", lambda: DatasetQAEnv([]))
    reqs = [
        RolloutRequest(EnvSpec("empty_qa"), ProtocolSpec("single_qa"), env_seed=0, inference=inference(4)),
        RolloutRequest(EnvSpec("qa"), ProtocolSpec("single_qa"), env_seed=0, inference=inference(4)),
    ]
    bad, good = engine.generate_rollouts_sync(reqs, max_steps=1)
    assert bad.failed and bad.steps == ()
    assert bad.error == "ValueError: DatasetQAEnv: the dataset is empty; pass at least one sample"
    assert bad.meta["error_type"] == "ValueError" and bad.meta["env_kind"] == "empty_qa"
    assert "error_phase" not in bad.meta  # it failed before the protocol ran
    assert not good.failed and good.length == 1


@pytest.mark.timeout(60)
def test_unknown_env_kind_fails_before_anything_runs(tiny_client):
    built: list[str] = []
    engine = make_engine(tiny_client)
    engine.register_protocol("counted", lambda: built.append("protocol") or SingleAgentSyncProtocol(
        Agent(tiny_client, FullDialog(), identity_parser, reject_incomplete_completions=False)))  # fmt: skip
    engine.register_env("counted_qa", lambda: built.append("env") or DatasetQAEnv(load_math_word_problems("test")))
    good = RolloutRequest(EnvSpec("counted_qa"), ProtocolSpec("counted"), env_seed=0, inference=inference(2))
    bad = RolloutRequest(EnvSpec("chess"), ProtocolSpec("counted"), env_seed=0)
    for call in (
        lambda: engine.generate_rollouts_sync([good, bad], max_steps=1),
        lambda: run_sync(engine.generate_rollouts([good, bad], max_steps=1)),
        lambda: engine.validate([good, bad], max_steps=1),
    ):
        with pytest.raises(UnknownKindError) as e:
            call()
        msg = str(e.value)
        assert "requests[1]: unknown env kind 'chess'" in msg
        assert "'counted_qa'" in msg and "register_env('chess'" in msg
        assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    with pytest.raises(UnknownKindError, match="unknown protocol kind 'debate'"):
        engine.generate_rollouts_sync([RolloutRequest(EnvSpec("qa"), ProtocolSpec("debate"))], max_steps=1)
    assert built == []  # nothing was constructed, let alone run
    (r,) = engine.generate_rollouts_sync([good], max_steps=1)  # the engine is still usable
    assert built == ["protocol", "env"] and not r.failed
