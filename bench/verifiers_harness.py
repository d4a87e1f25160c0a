"""verifiers harness overhead: ``VerifiersProtocol`` episodes/s against the same episodes as an agent program.

The taskset is ``tests/verifiers_envs/vf_calc``: a multiplication, one shared MCP tool server
(``calc_multiply``), at most 3 model turns, ``correct`` scored by verifiers (the shape of a
user's "count a letter with a tool" taskset: one shared tool, 2-3 model calls an episode).
Three arms run the same ``--episodes`` (env seeds 0..N-1, sampling seeds 1000+i, the same
backend and sampling), ``--concurrency`` at a time through ``RolloutEngine``:

  vf-process    ``VerifiersProtocol``, verifiers' ``null`` harness starting its chat program
                as a process per episode (``harness_mode="subprocess"``, verifiers' own way)
  vf-inprocess  ``VerifiersProtocol``, the same chat program run in this process per episode
                (``harness_mode="in_process"``, the default)
  program       ``AgentProgramProtocol``: an ``openai``-SDK tool loop through the same
                ``OpenAIEndpoint`` whose tool calls go to the same shared MCP server (an MCP
                client per episode, as the chat program opens), scored by the same rule

The arms are interleaved round by round (the order rotates), so load from other work on the
machine hits them alike. Printed: episodes/s per arm (median of ``--rounds``), each vf arm's
ratio to ``program``, its harness overhead per episode ((vf wall - program wall) / episodes,
in seconds and as a share of the vf arm's wall), where a verifiers episode's time goes (from
verifiers' own trace timing: runtime + interception + tool wiring, program start to the first
model call, model calls, tool calls and the loop between them, the program's exit, scoring;
the harness's share is all but the model and tool calls), and the peak resident memory of this
process plus its children during each arm. With a model (not the scripted client) the arms'
sampled tokens can differ (the harness's requests are relayed by verifiers' interception), so
the per-arm sampled tokens are printed beside episodes/s.

``--taskset hint`` runs the same three arms on ``tests/verifiers_envs/vf_hint`` instead: an
``Env`` of the taskset's own that plays the user of its one seat (two segments an episode: the
answer, the env's hint, the answer again; verifiers relaunches the chat program for the second),
its ``program`` arm the same exchange as an ``openai``-SDK program (``bench/verifiers_hint_arm.py``).

Backends (``--backend``): ``scripted`` (a zero-cost client defined here: the tool call, then the
answer; what is left is the harness and the plumbing), ``tiny`` (``LocalChatClient`` on the tiny
random test model), ``default`` (SmolLM2-135M-Instruct, the realistic row).

    .venv/bin/python bench/verifiers_harness.py                                   # scripted, 8 episodes x 3 rounds
    .venv/bin/python bench/verifiers_harness.py --backend tiny
    .venv/bin/python bench/verifiers_harness.py --backend default --episodes 8 --max-tokens 48 --rounds 2
    .venv/bin/python bench/verifiers_harness.py --taskset hint                    # the Env-driven seat

Needs the ``verifiers`` and ``openai`` extras.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ENVS = Path(__file__).resolve().parent.parent / "tests" / "verifiers_envs"
ARMS = ("vf-process", "vf-inprocess", "program")
_NUMBER = re.compile(r"-?\d+")


def envs_importable() -> None:
    """The test tasksets on ``sys.path`` (verifiers imports them by id) and ``PYTHONPATH`` (tool servers)."""
    sys.path.insert(0, str(ENVS))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ENVS), *filter(None, [os.environ.get("PYTHONPATH")])])


class ScriptedCalc:
    """A zero-cost ``ChatClient``: the first call of a conversation gets a ``calc_multiply`` call
    with the task's numbers, later calls the product as the answer (the ids encoded per reply)."""

    model_name = "scripted"

    def __init__(self, template: Any) -> None:
        self.chat_template = template
        self.policy_version = 0
        self._stop = min(template.stop_token_ids)

    async def complete(self, request: Any) -> tuple[Any, dict[str, Any]]:
        from ludic_lab.types import ChatResponse

        user = next(m["content"] for m in request.messages if m.get("role") == "user")
        a, b = (int(x) for x in _NUMBER.findall(user)[:2])
        if any(m.get("role") == "tool" for m in request.messages):
            text = f"It is {a * b}."
        else:
            text = f'<tool_call>\n{{"name": "calc_multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
        ids = (*self.chat_template.encode_text(text), self._stop)
        prompt = request.prompt_token_ids or tuple(self.chat_template.render_ids(request.messages))
        return ChatResponse(text=text, completion_token_ids=ids, prompt_token_ids=prompt,
                            completion_logprobs=(-0.5,) * len(ids), finish_reason="stop",
                            policy_version=self.policy_version), {}  # fmt: skip


def build_backend(name: str, taskset: str = "calc") -> Any:
    from ludic_lab.inference.models import tiny_model_path

    if name == "scripted":
        from transformers import AutoTokenizer
        from verifiers_hint_arm import ScriptedHint

        from ludic_lab.inference.chat_template import ChatTemplate

        template = ChatTemplate(AutoTokenizer.from_pretrained(tiny_model_path()))
        return ScriptedCalc(template) if taskset == "calc" else ScriptedHint(template)
    from ludic_lab.inference import LocalChatClient

    return LocalChatClient(tiny_model_path() if name == "tiny" else "default")


def make_program(url: str, max_turns: int) -> Any:
    async def tool_loop(client: Any, task: str) -> str:
        """An ``openai``-SDK tool loop over the shared MCP calculator, ``max_turns`` calls at most."""
        from verifiers.v1.harnesses.utils.mcp import mcp_client

        async with mcp_client({"url": url}) as mcp:
            listed = await mcp.list_tools()
            tools = [  # as verifiers' chat program lists them (key order too: the same rendered prompt)
                {
                    "type": "function",
                    "function": {
                        "name": f"calc_{t.name}",
                        "description": t.description or "",
                        "parameters": t.input_schema,
                    },
                }
                for t in listed.tools
            ]
            messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
            content = ""
            for _ in range(max_turns):
                r = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
                msg = r.choices[0].message
                messages.append(msg.model_dump(exclude_none=True))
                content = msg.content or ""
                if not msg.tool_calls:
                    break
                for call in msg.tool_calls:
                    try:
                        args = json.loads(call.function.arguments or "{}")
                        res = await mcp.call_tool(call.function.name.removeprefix("calc_"), args)
                        result = "\n".join(getattr(b, "text", str(b)) for b in res.content)
                    except Exception as e:  # noqa: BLE001 - a tool error is the model's to read
                        result = f"error: {e}"
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            return content

    return tool_loop


def product_env(source: Any) -> Any:
    """vf_calc's tasks as an env an agent program steps: the same prompts, ``correct``'s rule."""
    from ludic_lab.integrations.verifiers_env import VerifiersTaskEnv
    from ludic_lab.types import StepOutcome

    class ProductEnv(VerifiersTaskEnv):
        def env_step(self, action: str) -> StepOutcome:
            numbers = _NUMBER.findall(action)
            ok = bool(numbers) and int(numbers[-1]) == self.task.data.a * self.task.data.b
            return StepOutcome(obs="", reward=float(ok), truncated=False, terminated=True, info={})

    return ProductEnv(source)


class PeakRSS:
    """Peak resident memory of this process plus its children, sampled every 50 ms."""

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            for p in [self._me, *self._me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.05)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


BETWEEN = {"calc": "between calls (tool calls, loop)", "hint": "between calls (exit, env's hint, relaunch)"}
"""What lies between an episode's model calls: calc's tool calls, or hint's program relaunch (harness)."""


def breakdown(rollouts: list[Any], taskset: str = "calc") -> dict[str, float]:
    """Mean seconds per verifiers episode, by stage, from each trace's own timing."""
    rows: list[dict[str, float]] = []
    for r in rollouts:
        tr = r.meta["verifiers"]["trace"]
        tm, calls = tr["timing"], tr.get("calls") or []
        agent = tm["agent"]
        model = sum(c["time"]["end"] - c["time"]["start"] for c in calls)
        first = calls[0]["time"]["start"] - agent["start"] if calls else 0.0
        exit_ = agent["end"] - calls[-1]["time"]["end"] if calls else 0.0
        rows.append({
            "setup (runtime, interception, tool wiring)": tm["setup"]["end"] - tm["boot"]["start"],
            "program start -> 1st model call": first,
            "model calls": model,
            BETWEEN[taskset]: (agent["end"] - agent["start"]) - first - model - exit_,
            "last call -> program exit": exit_,
            "finalize + scoring": tm["scoring"]["end"] - tm["finalize"]["start"],
        })  # fmt: skip
    return {k: statistics.mean(row[k] for row in rows) for k in rows[0]} if rows else {}


async def run(args: argparse.Namespace) -> None:
    from verifiers_hint_arm import hint_env, hint_program

    from ludic_lab.endpoint import OpenAIEndpoint
    from ludic_lab.inference.request import InferenceSpec, ReturnSpec, SamplingConfig
    from ludic_lab.integrations.verifiers_env import VerifiersTaskEnv, load_verifiers_env
    from ludic_lab.integrations.verifiers_protocol import VerifiersProtocol
    from ludic_lab.interaction import AgentProgramProtocol
    from ludic_lab.rollouts import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest

    n, conc, taskset = args.episodes, args.concurrency, f"vf_{args.taskset}"
    sources = {
        "vf-process": load_verifiers_env(taskset, limit=n, harness_mode="subprocess", max_concurrent=conc),
        "vf-inprocess": load_verifiers_env(taskset, limit=n, harness_mode="in_process", max_concurrent=conc),
    }
    backend = build_backend(args.backend, args.taskset)
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=args.max_tokens), ReturnSpec.for_training())
    try:
        shared = {}
        for arm, src in sources.items():
            async with src.tools() as tools:  # started before the clock (once per run, as in training)
                shared[arm] = tools
        if args.taskset == "calc":
            url = next(iter(shared["vf-inprocess"].values())).url
            program, program_env = make_program(url, 3), product_env
        else:
            program, program_env = hint_program, hint_env
        with OpenAIEndpoint(backend) as ep:
            engines = {
                arm: RolloutEngine(
                    {"e": (lambda s=src: VerifiersTaskEnv(s))},
                    {"p": lambda: VerifiersProtocol(ep, timeout_s=args.timeout_s)},
                    max_concurrency=conc,
                )  # fmt: skip
                for arm, src in sources.items()
            }
            engines["program"] = RolloutEngine(
                {"e": lambda: program_env(sources["vf-inprocess"])},
                {"p": lambda: AgentProgramProtocol(program, ep, timeout_s=args.timeout_s)},
                max_concurrency=conc,
            )
            reqs = [RolloutRequest(EnvSpec("e"), ProtocolSpec("p"), env_seed=i, sampling_seed=1000 + i, inference=spec)
                    for i in range(n)]  # fmt: skip
            for arm in ARMS:  # warm-up: imports, the tool servers' first calls, the model's first batch
                await engines[arm].generate_rollouts(reqs[: min(2, n)], max_steps=1)
            walls: dict[str, list[float]] = {a: [] for a in ARMS}
            peaks: dict[str, int] = dict.fromkeys(ARMS, 0)
            outs: dict[str, list[Any]] = {a: [] for a in ARMS}
            for rnd in range(args.rounds):
                order = ARMS[rnd % 3 :] + ARMS[: rnd % 3]
                for arm in order:
                    with PeakRSS() as mem:
                        t = time.perf_counter()
                        rs = await engines[arm].generate_rollouts(reqs, max_steps=1)
                        walls[arm].append(time.perf_counter() - t)
                    peaks[arm] = max(peaks[arm], mem.peak)
                    outs[arm] += rs
                    print(f"  round {rnd + 1} {arm:12}: {walls[arm][-1]:7.2f} s", flush=True)
    finally:
        for src in sources.values():
            await src.aclose()
    report(args, walls, peaks, outs)


def report(args: argparse.Namespace, walls: dict, peaks: dict, outs: dict) -> None:
    n = args.episodes
    load = os.getloadavg()[0]
    print(f"\n[{args.backend}] vf_{args.taskset}, {n} episodes x {args.rounds} interleaved rounds, "
          f"{args.concurrency} at a time, max_tokens={args.max_tokens}; "
          f"load average {load:.1f} on {os.cpu_count()} CPUs")  # fmt: skip
    med = {a: statistics.median(walls[a]) for a in ARMS}
    for arm in ARMS:
        rs = outs[arm]
        ok = [r for r in rs if r.error is None]
        calls = statistics.mean(r.meta["agent_program"]["calls"] for r in ok) if ok else 0.0
        tokens = statistics.mean(sum(s.trace.num_sampled_tokens for s in r.steps) for r in ok) if ok else 0.0
        reward = statistics.mean(r.total_reward for r in ok) if ok else 0.0
        print(f"  {arm:12}: {n / med[arm]:7.3f} episodes/s  (median wall {med[arm]:7.2f} s; {calls:.2f} model calls "
              f"and {tokens:.1f} sampled tokens an episode, reward {reward:.2f}, failed {len(rs) - len(ok)}/{len(rs)}; "
              f"peak RSS {peaks[arm] / 2**20:,.0f} MiB incl. children)")  # fmt: skip
    for arm in ("vf-process", "vf-inprocess"):
        over = med[arm] - med["program"]
        print(f"  {arm} / program: {med['program'] / med[arm]:.3f}x the episodes/s; harness overhead "
              f"{over / n:+.3f} s an episode = {over / med[arm]:+.1%} of its wall")  # fmt: skip
    for arm in ("vf-process", "vf-inprocess"):
        parts = breakdown([r for r in outs[arm] if r.error is None], args.taskset)
        total = sum(parts.values()) or 1.0
        print(f"  where a {arm} episode's time goes (mean of its own trace timing, s; episodes overlap):")
        for k, v in parts.items():
            print(f"    {k:44}: {v:7.3f}  {v / total:6.1%}")
        not_harness = ("model calls", BETWEEN["calc"])  # hint's relaunch between its calls is the harness's
        harness = sum(v for k, v in parts.items() if k not in not_harness)
        what = "program start and exit" + (", relaunch" if args.taskset == "hint" else "")
        print(f"    harness (setup, {what}, scoring): {harness:.3f} s = {harness / total:.1%} of it")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="scripted", choices=("scripted", "tiny", "default"))
    p.add_argument(
        "--taskset",
        default="calc",
        choices=("calc", "hint"),
        help="calc: a SingleAgentEnv seat with a shared tool; hint: an Env of its own playing the user",
    )
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--timeout-s", type=float, default=600.0)
    args = p.parse_args()
    envs_importable()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
