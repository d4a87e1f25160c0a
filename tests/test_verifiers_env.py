"""verifiers (v1) environments as ludic_lab episodes: a single-turn taskset of our own
(``tests/verifiers_envs/vf_digits``, written with verifiers' v1 API), run with verifiers'
``null`` harness through the OpenAI-compatible endpoint on the tiny model.

- a GRPO group runs as episodes and trains one step on exactly the sampled tokens, with
  verifiers' ``trace.reward`` as the reward; verifiers' own scoring of each recorded trace,
  offline and by a freshly loaded task, gives the same rewards;
- ``task.evaluate`` (``ludic_lab.eval``) reports accuracy with its Wilson interval and pass@k;
- an ``Env`` of the taskset's own with one seat (``vf_hint``: it plays the user) is one exchange,
  recorded token-exactly across the harness's relaunch;
- bad input: a reward that raises, returns NaN or never returns is a failed rollout with its
  cause and the steps kept; harnesses, runtimes and tool servers this machine cannot run,
  a taskset that needs the network, an uninstalled one: each a clear error before anything runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("verifiers", reason="the verifiers extra: pip install -e '.[verifiers]'")
pytest.importorskip("openai", reason="the openai extra (the endpoint): pip install -e '.[openai]'")
pytest.importorskip("httpx", reason="the openai extra (the endpoint): pip install -e '.[openai]'")

from verifiers_helpers import rescore, verifiers_envs_importable

from ludic_lab.distributed import ClientPublisher
from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.inference.local.client import LocalChatClient
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.integrations.verifiers_env import VerifiersEnvError, load_verifiers_env
from ludic_lab.rollouts import GRPORequestStrategy, RolloutBatchSource
from ludic_lab.task.external.verifiers import endpoint_for, evaluate_verifiers, verifiers_source, verifiers_task

SPEC = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=12), ReturnSpec.for_training())


@pytest.fixture(scope="module", autouse=True)
def _envs() -> Iterator[None]:
    with verifiers_envs_importable():
        yield


@pytest.fixture(scope="module")
def client(tiny_model_dir: str) -> LocalChatClient:
    return LocalChatClient(tiny_model_dir, dtype="float32")


@pytest.fixture(scope="module")
def endpoint(client: LocalChatClient) -> Iterator[OpenAIEndpoint]:
    ep = endpoint_for(client)  # what a verifiers task bound to ``client`` calls (started on first use)
    yield ep
    ep.stop()


@pytest.fixture(scope="module")
def digits(endpoint: OpenAIEndpoint) -> Any:
    return verifiers_task("vf_digits", heldout=10, timeout_s=120, max_concurrent=2)


async def test_a_single_turn_env_trains_one_grpo_step_on_verifiers_own_scores(
    digits, client, endpoint, tiny_model_dir
) -> None:
    from trainer_helpers import load_model

    from ludic_lab.training import Trainer, TrainerConfig, make_grpo

    assert digits.size == 40 and len(verifiers_source(digits)) == 50
    algo = make_grpo()
    source = RolloutBatchSource(
        digits.engine(client),
        digits.requests(per_step=1, inference=SPEC),
        algo.credit_assigner,
        request_strategy=GRPORequestStrategy(4, seed=0),
    )
    trainer = Trainer(load_model(tiny_model_dir), algo, source, config=TrainerConfig(lr=1e-3, max_seq_len=1024),
                      publisher=ClientPublisher(client))  # fmt: skip
    m = await trainer.train_step()
    rollouts = source.last_rollouts
    assert len(rollouts) == 4 and all(r.error is None for r in rollouts), [r.error for r in rollouts]
    tokenizer = client.chat_template.tokenizer
    for r in rollouts:
        (step,) = r.steps  # one model call: one segment, one step
        vf_meta = r.meta["verifiers"]
        assert vf_meta["harness"] == "null" and vf_meta["num_turns"] == 1 and r.meta["agent_program"]["calls"] == 1
        prompt = tokenizer.decode(list(step.trace.prompt_token_ids))
        assert "Write the number" in prompt and "Answer with digits only." in prompt  # the task's own prompts
        # what verifiers scored is what the model sampled (the trained ids, decoded)
        sampled = [n for n in vf_meta["trace"]["nodes"] if n["sampled"]]
        assert [n["message"]["content"].strip() for n in sampled] == [step.action.strip()]
        assert all(not n["token_ids"] for n in sampled)  # verifiers' eval client records no ids: the endpoint does
        weighted = sum(v["score"] * v["weight"] for v in vf_meta["rewards"].values())
        assert r.total_reward == vf_meta["reward"] == pytest.approx(weighted) and len(vf_meta["rewards"]) == 3
        assert step.info["verifiers"]["metrics"]["reply_chars"] == len(step.action.strip())
        # verifiers' own scoring of the recorded trace, by the task loaded afresh, gives the trained reward
        again = await rescore("vf_digits", r)
        assert again.reward == r.total_reward and again.metrics == vf_meta["metrics"]
        assert {k: v.score for k, v in again.rewards.items()} == {k: v["score"] for k, v in vf_meta["rewards"].items()}
    assert len({r.total_reward for r in rollouts}) > 1, "no signal in the group: pick other seeds"
    assert not m.get("skipped"), m.get("skip_reason")
    assert m["action_tokens"] == sum(s.trace.num_sampled_tokens for r in rollouts for s in r.steps) > 0
    assert math.isfinite(m["loss"]) and m["grad_norm"] > 0 and client.policy_version == 1
    assert endpoint.running and endpoint.backend is client  # the episodes' endpoint: one per client
    trainer.close()


async def test_evaluate_reports_accuracy_with_its_wilson_interval_and_pass_at_k(digits, client) -> None:
    from ludic_lab.eval import RewardThresholdSuccess, pass_at_k, wilson_interval

    success = RewardThresholdSuccess(0.25)
    res = await evaluate_verifiers(client, digits, seeds=[40, 41], k=2, max_tokens=8, success=success)
    s = res.summary()
    t = res.table
    assert s["num_samples"] == 4 and s["num_items"] == 2 and s["k"] == 2 and s["num_failed"] == 0
    solved = int(t["success"].sum())
    assert s["accuracy"] == solved / 4 and (s["accuracy_ci_low"], s["accuracy_ci_high"]) == wilson_interval(solved, 4)
    per_item = t.groupby("item")["success"].sum()
    assert s["pass@2"] == pytest.approx(sum(pass_at_k(2, int(c), 2) for c in per_item) / 2)
    assert list(t["reward"]) == [r.meta["verifiers"]["reward"] for r in res.rollouts]
    assert sorted(set(t["env_seed"])) == [40, 41]
    spans = [(tr["timing"]["boot"]["start"], tr["timing"]["scoring"]["end"])
             for tr in (r.meta["verifiers"]["trace"] for r in res.rollouts)]  # fmt: skip
    assert max(sum(a <= t < b for a, b in spans) for t, _ in spans) <= 2  # max_concurrent=2: two at a time
    # the task's own evaluation: the held-out tasks by default (here two of them, once each)
    report = await digits.evaluate(client, seeds=[49], max_tokens=8)
    assert report["num_samples"] == 1 and report["k"] == 1 and "accuracy_ci_high" in report


async def test_a_reward_that_raises_or_returns_nan_or_hangs_is_a_failed_rollout_with_its_cause(endpoint) -> None:
    from ludic_lab.integrations.verifiers_env import VerifiersTaskEnv
    from ludic_lab.integrations.verifiers_protocol import VerifiersProtocol
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest

    source = load_verifiers_env("vf_faulty")
    engine = RolloutEngine({"faulty": lambda: VerifiersTaskEnv(source)},
                           {"vf": lambda: VerifiersProtocol(endpoint, timeout_s=60),
                            "vf_6s": lambda: VerifiersProtocol(endpoint, timeout_s=6)})  # fmt: skip
    kinds = ["vf", "vf", "vf_6s", "vf"]
    reqs = [RolloutRequest(EnvSpec("faulty"), ProtocolSpec(k), env_seed=i, inference=SPEC) for i, k in enumerate(kinds)]
    raised, nan, hung, fine = await engine.generate_rollouts(reqs, max_steps=1)
    assert fine.error is None and fine.total_reward == 1.0
    assert raised.meta["failure_cause"] == nan.meta["failure_cause"] == "judge_failure"
    assert "ValueError: the reference answer file is missing" in raised.error and "unscored: brittle" in raised.error
    assert "brittle=nan" in nan.error
    assert hung.meta["failure_cause"] == "timeout", hung.error
    for r in (raised, nan, hung):  # nothing lost: the sampled call is kept, with verifiers' trace
        assert r.failed and len(r.steps) == 1 and r.steps[0].trace.num_sampled_tokens > 0
        assert r.meta["verifiers"]["trace_id"] and r.meta["agent_program"]["calls"] == 1
    await source.aclose()


async def test_an_env_of_its_own_that_plays_the_user_is_one_exactly_recorded_exchange(endpoint, client) -> None:
    """vf_hint's ``HintEnv`` drives its one seat through two user turns (verifiers relaunches the
    harness on the conversation): the second call extends the first token for token, and the
    reward is the trace's, the env's own ``answered_twice`` included."""
    from ludic_lab.integrations.verifiers_env import VerifiersTaskEnv
    from ludic_lab.integrations.verifiers_protocol import VerifiersProtocol
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest

    source = load_verifiers_env("vf_hint")
    assert source.role == "player" and not source.single_agent
    engine = RolloutEngine({"hint": lambda: VerifiersTaskEnv(source)}, {"vf": lambda: VerifiersProtocol(endpoint)})
    req = RolloutRequest(EnvSpec("hint"), ProtocolSpec("vf"), env_seed=3, inference=SPEC)
    (r,) = await engine.generate_rollouts([req], max_steps=1)
    assert r.error is None, r.error
    assert r.meta["agent_program"]["calls"] == 2 and r.meta["agent_program"]["segments"] == 1
    vf_meta = r.meta["verifiers"]
    assert vf_meta["num_turns"] == 2 and vf_meta["rewards"]["answered_twice"] == {"score": 1.0, "weight": 0.5}
    assert r.total_reward == vf_meta["reward"] == 0.5 + vf_meta["rewards"]["correct"]["score"]
    (step,) = r.steps
    tr = step.trace
    assert tr.num_sampled_tokens == r.meta["agent_program"]["completion_tokens"]
    inserted = [t for t, m in zip(tr.completion_token_ids, tr.completion_mask, strict=True) if not m]
    assert "Hint: it is a multiple of 7 with 2 digits." in client.chat_template.tokenizer.decode(inserted)
    again = await rescore("vf_hint", r)  # the task's own reward, re-scored offline
    assert again.rewards["correct"].score == vf_meta["rewards"]["correct"]["score"]


@pytest.mark.parametrize(
    "options, match",
    [
        ({"agent": {"harness": {"id": "bash"}}}, "harness 'bash' is not supported: it gives the model a bash shell"),
        ({"agent": {"harness": {"id": "codex"}}}, "harness 'codex' is not supported"),
        ({"agent": {"runtime": {"type": "prime"}}}, "runtime 'prime', which is a remote Prime sandbox"),
        ({"agent": {"runtime": {"type": "docker"}}}, "runtime 'docker', which needs a Docker engine"),
        ({"env_id": "user-sim"}, r"env UserSimEnv .* has the agent roles \['assistant', 'user'\]: ludic_lab runs"),
    ],
    ids=["bash", "codex", "prime", "docker", "two-agents"],
)
def test_what_this_machine_cannot_run_is_refused_before_anything_runs(options: dict, match: str) -> None:
    with pytest.raises(VerifiersEnvError, match=match):
        load_verifiers_env("vf_digits", **options)


def test_tool_servers_in_a_container_or_a_network_taskset_or_a_missing_one_are_clear_errors() -> None:
    with pytest.raises(
        VerifiersEnvError, match="tool server CalcToolset of 'vf_calc' asks for verifiers runtime 'docker'"
    ):
        load_verifiers_env("vf_calc", taskset_options={"tools": {"runtime": {"type": "docker"}}})
    with pytest.raises(
        VerifiersEnvError, match="remote MCP server at https://tools.example.com/mcp: it needs the network"
    ):
        load_verifiers_env("vf_calc", taskset_options={"tools": {"url": "https://tools.example.com/mcp"}})
    with pytest.raises(
        VerifiersEnvError, match="loading the tasks of verifiers taskset 'vf_reverse_text' failed .*network"
    ):
        load_verifiers_env("vf_reverse_text")
    with pytest.raises(VerifiersEnvError, match="'no_such_env' cannot be loaded.*Install its package"):
        load_verifiers_env("no_such_env")
