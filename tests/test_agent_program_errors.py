"""Agent programs the model broke vs programs the infrastructure broke, and the step info of the
endpoint path.

- An OpenAI Agents SDK agent whose model names a tool the agent lacks raises the SDK's
  ``ModelBehaviorError``. With ``model_error_reward`` set the episode is scored (in its group,
  the set reward on what the model sampled, a negative GRPO advantage when its siblings score
  higher); without it the episode is left out (``failure_cause="model_error"``); counted either
  way. A program's own crash and a timeout stay left out in both modes.
- Scripted backend (the tiny model's tokenizer): the SDK episode token for token; our own
  ``UnknownToolError`` and a user's exception class; bad settings.
- The tiny model, taught the scripted reply (a few seconds of supervised steps), writes the bad
  call itself, greedily, through the real endpoint: the run above, with the trainer's logprobs
  of the scored episode equal to the sampler's within 1e-4 (fp32).
- Tool calls on the endpoint path are a list of what the model wrote, malformed blocks counted
  as ``invalid_call`` exactly as ``ToolAgent`` records the same reply.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"  # before the SDK is imported: nothing leaves the machine

pytest.importorskip("openai", reason="the openai extra: pip install -e '.[openai]'")
pytest.importorskip("agents", reason="the OpenAI Agents SDK: pip install openai-agents")

from endpoint_helpers import MULTIPLY, ProductEnv, tool_loop_agent
from helpers import Reply, ScriptedChatClient, chatml_template
from trainer_helpers import load_model, teach_item, trainer_vs_behaviour

from ludic_lab.agents import ToolAgent
from ludic_lab.agents.tools import Tool
from ludic_lab.context import FullDialog
from ludic_lab.endpoint import OpenAIEndpoint
from ludic_lab.inference.chat_template import ChatTemplate
from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
from ludic_lab.interaction import AgentProgramProtocol
from ludic_lab.interaction.model_errors import UnknownToolError
from ludic_lab.parsers import identity_parser
from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutBatchSource, RolloutEngine, RolloutRequest
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.training.algorithm import make_grpo
from ludic_lab.types import StepOutcome

BAD_CALL = '<tool_call>\n{"name": "divide", "arguments": {"a": 11, "b": 3}}\n</tool_call>'
INSTRUCTIONS = "Use the multiply tool, then answer with the number."
GREEDY = InferenceSpec(SamplingConfig(temperature=0.0, max_tokens=40), ReturnSpec.for_training())
PENALTY = -1.0


async def sdk_program(client: Any, task: str) -> str:
    """An Agents SDK agent with a ``multiply`` tool only: a call to anything else is the SDK's
    ``ModelBehaviorError``."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)

    @function_tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    agent = Agent(name="calculator", instructions=INSTRUCTIONS, model=model, tools=[multiply])
    return (await Runner.run(agent, task, max_turns=2)).final_output


async def plain_program(client: Any, task: str) -> str:
    r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": task}])
    return r.choices[0].message.content or ""


async def crashing_program(client: Any, task: str) -> str:
    await plain_program(client, task)
    raise RuntimeError("the program's own tool server is down")


async def slow_program(client: Any, task: str) -> str:
    await plain_program(client, task)
    await asyncio.sleep(30)
    return ""


class AnyAnswerEnv(ProductEnv):
    """Every answer scores 0: a wrong answer is worth more than a broken program (-1)."""

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(obs="done", reward=0.0, truncated=False, terminated=True, info={})


def engine(ep: Any, reward: float | None, **kw: Any) -> RolloutEngine:
    def proto(program: Any, **more: Any) -> Any:
        return lambda: AgentProgramProtocol(program, ep, model_error_reward=reward, **{**kw, **more})

    return RolloutEngine(
        {"any": AnyAnswerEnv},
        {
            "sdk": proto(sdk_program),
            "plain": proto(plain_program),
            "crash": proto(crashing_program),
            "slow": proto(slow_program, timeout_s=1.0),
        },
        episode_timeout_s=120,
    )


def group(*kinds: str) -> list[RolloutRequest]:
    """One request per kind, one GRPO group, the same task (seed 0: "What is 11 * 3?")."""
    return [RolloutRequest(EnvSpec("any"), ProtocolSpec(k), env_seed=0, inference=GREEDY, group_id="g", meta={"kind": k})
            for k in kinds]  # fmt: skip


def tiny_template(model_dir: str) -> ChatTemplate:
    from transformers import AutoTokenizer

    return ChatTemplate(AutoTokenizer.from_pretrained(model_dir))


# -- the scripted backend ------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def scripted_sdk(tiny_model_dir: str) -> tuple[Any, Any]:
    """The SDK episode scored at -1 on a backend that always writes ``BAD_CALL``: (rollout, backend)."""
    backend = ScriptedChatClient(lambda req: Reply(BAD_CALL), chat_template=tiny_template(tiny_model_dir))
    with OpenAIEndpoint(backend) as ep:
        (r,) = await engine(ep, PENALTY).generate_rollouts(group("sdk"), max_steps=1)
    return r, backend


async def test_an_sdk_model_error_is_scored_on_exactly_what_the_model_sampled(scripted_sdk) -> None:
    r, backend = scripted_sdk
    assert not r.failed, r.error
    assert r.meta["model_error"]["type"] == "ModelBehaviorError"
    assert "divide" in r.meta["model_error"]["message"] and r.meta["end"] == "model_error"
    (step,) = r.steps
    assert r.total_reward == step.reward == PENALTY and step.env_reward == 0.0 and step.terminated
    assert step.info["terminated_by"] == "model_error"
    info = step.info["agent_program"]
    assert info["model_error"].startswith("ModelBehaviorError: ") and info["calls"] == [0]
    (call,) = info["tool_calls"]
    assert (call["name"], call["arguments"], call["error"]) == ("divide", '{"a": 11, "b": 3}', "unknown_tool")
    assert info["num_tool_calls"] == 0 and info["tools"] == {"calls": 1, "failed": 1, "errors": {"unknown_tool": 1}}
    # the bad call is the step's action: every token the backend produced, nothing else
    (req,) = backend.requests
    tr = step.trace
    assert tr.prompt_token_ids == tuple(req.prompt_token_ids)
    tok = backend.chat_template.tokenizer
    assert tok.decode(list(tr.completion_token_ids), skip_special_tokens=True) == BAD_CALL
    item = SAWItem.from_step(r, step, -1.0)
    assert sum(item.action_mask) == tr.num_sampled_tokens == len(tr.completion_token_ids)


class Refused(Exception):
    """A user's own "the model did this" exception."""


@pytest.mark.parametrize(
    ("raised", "extra", "scored"),
    [(UnknownToolError, (), True), (Refused, (Refused,), True), (Refused, (), False), (KeyError, (), False)],
    ids=["UnknownToolError", "listed", "not-listed", "KeyError"],
)
async def test_a_raw_openai_program_names_its_model_errors(raised: type, extra: tuple, scored: bool) -> None:
    """A plain ``openai`` tool loop raising on a tool it lacks: scored when the class is a model error."""

    async def program(client: Any, task: str) -> str:
        r = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task}], tools=[MULTIPLY]
        )
        for c in r.choices[0].message.tool_calls or []:
            if c.function.name != "multiply":
                raise raised(f"the model called {c.function.name!r}, which this program does not have")
        return "?"

    backend = ScriptedChatClient(lambda req: Reply(BAD_CALL), chat_template=chatml_template())
    with OpenAIEndpoint(backend) as ep:
        eng = RolloutEngine({"any": AnyAnswerEnv},
                            {"p": lambda: AgentProgramProtocol(program, ep, model_error_reward=-2, model_errors=extra)})  # fmt: skip
        (r,) = await eng.generate_rollouts([RolloutRequest(EnvSpec("any"), ProtocolSpec("p"), env_seed=0)], max_steps=1)
    assert r.failed is not scored, r.error
    if scored:
        assert r.total_reward == -2.0 and r.meta["model_error"]["type"] == raised.__name__
    else:
        assert r.meta["failure_cause"] == "agent_error" and "model_error" not in r.meta


def test_bad_settings_say_what_to_do() -> None:
    ep = OpenAIEndpoint(ScriptedChatClient(["x"], chat_template=chatml_template()))
    with pytest.raises(TypeError, match=r"a number .* or None"):
        AgentProgramProtocol(plain_program, ep, model_error_reward="-1")
    with pytest.raises(TypeError, match=r"a number"):
        AgentProgramProtocol(plain_program, ep, model_error_reward=True)
    with pytest.raises(ValueError, match="finite"):
        AgentProgramProtocol(plain_program, ep, model_error_reward=float("nan"))
    with pytest.raises(TypeError, match="exception classes"):
        AgentProgramProtocol(plain_program, ep, model_errors=("agents.exceptions.ModelBehaviorError",))
    with pytest.raises(TypeError, match="a list or tuple"):
        AgentProgramProtocol(plain_program, ep, model_errors=Refused)


# -- the same reply through ToolAgent and through the endpoint: one shape -------------------------

VALID = '<tool_call>{"name": "multiply", "arguments": {"a": 11, "b": 3}}</tool_call>'
MALFORMED = "<tool_call>{not json}</tool_call>"


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


async def test_tool_calls_are_one_list_on_both_paths_malformed_ones_counted_alike() -> None:
    reply = f"{VALID} {MALFORMED}"
    agent = ToolAgent(ScriptedChatClient([reply, "It is 33"], chat_template=chatml_template()), FullDialog(),
                      identity_parser, tools=[Tool(multiply, schema=MULTIPLY)])  # fmt: skip
    agent.reset(INSTRUCTIONS)
    agent.on_env_reset("What is 11 * 3?", {})
    res = await agent.act()
    backend = ScriptedChatClient([reply, "It is 33"], chat_template=chatml_template())
    with OpenAIEndpoint(backend) as ep:
        eng = RolloutEngine({"product": ProductEnv}, {"p": lambda: AgentProgramProtocol(tool_loop_agent, ep)})
        (r,) = await eng.generate_rollouts(
            [RolloutRequest(EnvSpec("product"), ProtocolSpec("p"), env_seed=0)], max_steps=1
        )
    assert r.error is None and r.total_reward == 1.0, r.error
    info = r.steps[0].info["agent_program"]
    keys = ("name", "arguments", "error")
    got = [tuple(c[k] for k in keys) for c in info["tool_calls"]]
    assert got == [tuple(c[k] for k in keys) for c in res.info["tool_calls"]]
    assert got == [("multiply", '{"a": 11, "b": 3}', None), ("", MALFORMED, "invalid_call")]
    assert info["tools"] == {k: res.info["tools"][k] for k in ("calls", "failed", "errors")}
    assert info["tools"] == {"calls": 2, "failed": 1, "errors": {"invalid_call": 1}}
    assert info["num_tool_calls"] == 1 and info["tool_calls"][0]["call"] == 0
    assert "not valid JSON" in info["tool_calls"][1]["why"]


UNKNOWN = '<tool_call>{"name": "divide", "arguments": {"a": 11, "b": 3}}</tool_call>'
NOT_AN_OBJECT = '<tool_call>{"name": "multiply", "arguments": [11, 3]}</tool_call>'


async def test_a_tool_the_request_did_not_offer_is_counted_alike_on_both_paths() -> None:
    reply = f"{VALID} {UNKNOWN} {NOT_AN_OBJECT}"
    agent = ToolAgent(ScriptedChatClient([reply, "It is 33"], chat_template=chatml_template()), FullDialog(),
                      identity_parser, tools=[Tool(multiply, schema=MULTIPLY)])  # fmt: skip
    agent.reset(INSTRUCTIONS)
    agent.on_env_reset("What is 11 * 3?", {})
    res = await agent.act()

    async def lenient_loop(client: Any, task: str) -> str:  # answers every call, as a forgiving program would
        messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
        r = await client.chat.completions.create(model="policy", messages=messages, tools=[MULTIPLY], max_tokens=40)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "33"} for c in msg.tool_calls or ()]
        r = await client.chat.completions.create(model="policy", messages=messages, tools=[MULTIPLY], max_tokens=40)
        return r.choices[0].message.content or ""

    backend = ScriptedChatClient([reply, "It is 33"], chat_template=chatml_template())
    with OpenAIEndpoint(backend) as ep:
        eng = RolloutEngine({"product": ProductEnv}, {"p": lambda: AgentProgramProtocol(lenient_loop, ep)})
        (r,) = await eng.generate_rollouts(
            [RolloutRequest(EnvSpec("product"), ProtocolSpec("p"), env_seed=0)], max_steps=1
        )
    assert r.error is None, r.error
    info = r.steps[0].info["agent_program"]
    got = [(c["name"], c["error"]) for c in info["tool_calls"]]
    assert got == [(c["name"], c["error"]) for c in res.info["tool_calls"]]  # ToolAgent records the same
    # arguments that are no JSON object are not a call for the parser: invalid_call on both paths
    assert got == [("multiply", None), ("divide", "unknown_tool"), ("", "invalid_call")]
    assert info["tools"] == {"calls": 3, "failed": 2, "errors": {"unknown_tool": 1, "invalid_call": 1}}
    assert info["num_tool_calls"] == 1


async def test_agents_sdk_few_shot_items_reach_the_model_as_a_call_and_its_result() -> None:
    """docs/agents_from_outside.md's few-shot form: ``function_call`` / ``function_call_output``
    items before the question are rendered as the model's own call format, all prompt."""
    import json

    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    examples = [
        {"role": "user", "content": "What is 12 * 34?"},
        {"type": "function_call", "call_id": "ex0", "name": "multiply", "arguments": json.dumps({"a": 12, "b": 34})},
        {"type": "function_call_output", "call_id": "ex0", "output": "408"},
        {"role": "assistant", "content": "408"},
    ]

    async def program(client: Any, task: str) -> str:
        model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
        agent = Agent(name="calculator", instructions=INSTRUCTIONS, model=model, tools=[function_tool(multiply)])
        return (await Runner.run(agent, [*examples, {"role": "user", "content": task}], max_turns=2)).final_output

    template = chatml_template()
    backend = ScriptedChatClient(["33"], chat_template=template)
    with OpenAIEndpoint(backend) as ep:
        eng = RolloutEngine({"product": ProductEnv}, {"p": lambda: AgentProgramProtocol(program, ep)})
        (r,) = await eng.generate_rollouts(
            [RolloutRequest(EnvSpec("product"), ProtocolSpec("p"), env_seed=0)], max_steps=1
        )
    assert r.error is None and r.total_reward == 1.0, r.error
    prompt = template.tokenizer.decode(list(r.steps[0].trace.prompt_token_ids))
    call = '<|im_start|>assistant\n<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 34}}\n</tool_call><|im_end|>'
    assert call in prompt and "<|im_start|>tool\n408<|im_end|>" in prompt
    assert prompt.index("12 * 34") < prompt.index("408") < prompt.index("11 * 3")
    assert r.steps[0].trace.num_sampled_tokens == len(r.steps[0].trace.completion_token_ids)  # only "33" trains


# -- the tiny model, taught the bad call, through the real endpoint ------------------------------


@pytest.fixture(scope="module")
def taught_dir(scripted_sdk, tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    r, _ = scripted_sdk
    out = tmp_path_factory.mktemp("divide_caller")
    teach_item(tiny_model_dir, out, SAWItem.from_step(r, r.steps[0], 1.0), min_logprob=-0.3)  # greedy: the argmax
    return str(out)


@pytest.mark.slow  # teaching the call: ~140 supervised steps of the tiny model
@pytest.mark.parametrize("reward", [PENALTY, None], ids=["scored", "left-out"])
async def test_the_tiny_model_naming_a_missing_tool_is_scored_or_left_out(
    taught_dir: str, reward: float | None
) -> None:
    from ludic_lab.inference.local.client import LocalChatClient

    client = LocalChatClient(taught_dir, dtype="float32")
    algo = make_grpo()
    kinds = ("sdk", "sdk", "plain", "plain", "crash", "slow")
    with OpenAIEndpoint(client) as ep:
        source = RolloutBatchSource(engine(ep, reward), lambda: group(*kinds), algo.credit_assigner)
        batch = await source.next_batch()
    by_kind: dict[str, list[Any]] = {}
    for r in source.last_rollouts:
        by_kind.setdefault(r.meta["kind"], []).append(r)
    # infrastructure failures: left out in both modes, each with its own cause
    (crash,), (slow,) = by_kind["crash"], by_kind["slow"]
    assert crash.failed and crash.meta["failure_cause"] == "agent_error" and "RuntimeError" in crash.error
    assert slow.failed and slow.meta["failure_cause"] == "timeout"
    assert (
        "did not return within 1 s (AgentProgramProtocol timeout_s=1)" in slow.error and "agent.act" not in slow.error
    )
    assert not any(r.failed for r in by_kind["plain"])
    sdk = by_kind["sdk"]
    assert all(r.meta["model_error"]["type"] == "ModelBehaviorError" for r in sdk)
    assert all("divide" in r.meta["model_error"]["message"] for r in sdk)  # the model wrote the bad call itself
    m = batch.meta
    assert m["num_model_error_rollouts"] == 2 and m["failed/agent_error"] == 1 and m["failed/timeout"] == 1
    weights = source.last_weights
    if reward is None:  # left out: failed, no weight, counted as a model error
        assert all(r.failed and r.meta["failure_cause"] == "model_error" for r in sdk)
        assert m["failed/model_error"] == 2 and m["num_failed_rollouts"] == 4
        assert not any(k[0] in {r.id for r in sdk} for k in weights)
        return
    # scored: in the group with the set reward, pushed down against siblings that scored higher
    assert m["failed/model_error"] == 0 and m["num_failed_rollouts"] == 2
    assert all(not r.failed and r.total_reward == PENALTY for r in sdk)
    assert all(weights[(r.id, 0)] < 0 for r in sdk) and all(weights[(r.id, 0)] > 0 for r in by_kind["plain"])
    scorer = load_model(taught_dir).eval()
    for r in sdk:  # what trains is exactly what the model sampled, the bad call
        (step,) = r.steps
        item = next(it for it in batch.items if it.rollout_id == r.id)
        assert item.weight < 0 and sum(item.action_mask) == step.trace.num_sampled_tokens
        text = client.chat_template.tokenizer.decode(list(step.trace.completion_token_ids), skip_special_tokens=True)
        assert text == BAD_CALL
        diff = trainer_vs_behaviour(scorer, item)
        assert diff.numel() > 0 and float(diff.max()) < 1e-4, float(diff.max())
