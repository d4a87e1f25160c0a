"""Resident memory of the agent-program training path stays bounded from step to step.

An ``openai``-SDK agent (one tool, a long system prompt, up to two calls) runs through the real
``OpenAIEndpoint`` over ``LocalChatClient``; GRPO + LoRA trains on its episodes and publishes
into the sampler after every step. The model is a small random Qwen2 (6 layers, hidden 256),
large enough that one step's activations are hundreds of MB, which glibc's arenas keep resident
after the step for the next one to reuse. ``TrainerConfig.release_host_memory``
(``training/host_memory.py``) bounds what they keep: resident memory between steps stays under a
limit (step 1's end, a tenth over), trimmed past it.

Checked per step: resident memory at its end is under the limit in force before it, and no Python
object or tensor is kept per step (endpoint sessions, traces, the batch source's rollouts, sampler
caches). That a step past the limit trims, on real glibc: ``tests/test_memory_release.py``.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from typing import Any

import pytest

psutil = pytest.importorskip("psutil")
pytest.importorskip("openai")

MB = 2**20
STEPS = 4

SYSTEM = "Use the calculator tool for arithmetic, then reply with just the number. " * 12
CALCULATOR = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "required": ["expression"], "properties": {"expression": {"type": "string"}}},
}}  # fmt: skip


async def agent(client: Any, question: str) -> str:
    """Plain openai-SDK tool loop: at most two calls, the tool's results sent back."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    msg: Any = None
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            break
        for call in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "42"})
        messages.append({"role": "user", "content": "And the answer?"})
    return (msg.content or "") if msg is not None else ""


class RSS:
    """The process's resident set size, sampled every 5 ms; ``peak`` since the last :meth:`mark`."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> int:
        r = int(self.proc.memory_info().rss)
        self.peak = max(self.peak, r)
        return r

    def _run(self) -> None:
        while not self._stop.is_set():
            self.now()
            time.sleep(0.005)

    def mark(self) -> int:
        self.peak = 0
        return self.now()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def live_census() -> tuple[int, int]:
    """(Python objects the collector tracks, bytes of the distinct tensor storages among them)."""
    import torch

    gc.collect()
    storages: dict[int, int] = {}
    objects = gc.get_objects()
    for o in objects:
        if isinstance(o, torch.Tensor) and o.layout == torch.strided:
            st = o.untyped_storage()
            storages[st.data_ptr()] = st.nbytes()
    return len(objects), sum(storages.values())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from ludic_lab.inference.models.tiny import build_tiny_model

    # a step's activations in the hundreds of MB (the default tiny model's are a few MB)
    return build_tiny_model(tmp_path_factory.mktemp("memory") / "model", hidden_size=256, num_layers=6, num_heads=4)


def run_steps(model_dir: str, **trainer_kw: Any) -> list[dict[str, Any]]:
    """Train the agent for :data:`STEPS` steps; per step: RSS at its start and end, its peak, live objects."""
    from transformers import AutoModelForCausalLM

    from ludic_lab.aio import run_sync
    from ludic_lab.distributed import ClientPublisher
    from ludic_lab.endpoint import OpenAIEndpoint
    from ludic_lab.envs import DatasetQAEnv
    from ludic_lab.inference import InferenceSpec, LocalChatClient, SamplingConfig
    from ludic_lab.interaction import AgentProgramProtocol
    from ludic_lab.rollouts import (
        EnvSpec,
        GRPORequestStrategy,
        ProtocolSpec,
        RolloutBatchSource,
        RolloutEngine,
        RolloutRequest,
    )
    from ludic_lab.training import Trainer, TrainerConfig, make_grpo

    rows = [{"question": f"What is {a} * {b}?", "answer": str(a * b)} for a in range(11, 31) for b in (7, 13)]
    client = LocalChatClient(model_dir, max_batch_size=16)
    rss = RSS()
    out: list[dict[str, Any]] = []
    with OpenAIEndpoint(client) as endpoint:
        engine = RolloutEngine(
            {"qa": lambda: DatasetQAEnv(rows, system_prompt=None, verifier=lambda reply, _: len(reply) % 2 == 0)},
            {"agent": lambda: AgentProgramProtocol(agent, endpoint, max_calls=2, timeout_s=120)},
        )
        spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=24))
        step = iter(range(10**6))

        def requests() -> list[RolloutRequest]:  # two questions a step, each a GRPO group of 4
            n = next(step)
            return [RolloutRequest(env=EnvSpec("qa"), protocol=ProtocolSpec("agent"), env_seed=2 * n + k,
                                   inference=spec, max_steps=1) for k in range(2)]  # fmt: skip

        source = RolloutBatchSource(
            engine,
            requests,
            make_grpo().credit_assigner,
            request_strategy=GRPORequestStrategy(4, seed=0),
        )
        policy = AutoModelForCausalLM.from_pretrained(model_dir)
        # one micro-batch a step (~5,300 tokens): a step's activations stay in the hundreds of MB, as
        # the check needs, rather than the CPU default's 1,024-token micro-batches (~310 MB a step)
        config = TrainerConfig(lr=1e-5, lora_r=8, max_seq_len=1024, share_prompts=False, micro_token_budget=8192,
                               **trainer_kw)  # fmt: skip
        trainer = Trainer(policy, make_grpo(), source, config=config, publisher=ClientPublisher(client),
                          pad_token_id=client.pad_token_id)  # fmt: skip
        try:
            for _ in range(STEPS):
                start = rss.mark()
                metrics = run_sync(trainer.train_step())
                end = rss.now()
                objects, tensor_bytes = live_census()
                out.append({"start": start, "end": end, "peak": rss.peak, "objects": objects,
                            "tensor_bytes": tensor_bytes, "tokens": metrics.get("tokens"),
                            "limit": trainer._host_memory.limit, "trims": trainer._host_memory.releases})  # fmt: skip
        finally:
            trainer.close()
            rss.stop()
    return out


def test_agent_program_training_memory_stays_under_its_trim_limit_from_step_to_step(model_dir: str) -> None:
    steps = run_steps(model_dir)
    table = json.dumps([{k: round(v / MB) if k in ("start", "end", "peak", "limit") and v else v
                         for k, v in s.items()} for s in steps])  # fmt: skip
    base = steps[0]["start"]  # before training: both models loaded, the sampler's weights packed
    used = [s["peak"] - base for s in steps]  # what each step needs at its peak, above that
    assert min(used) > 300 * MB, f"the workload must need enough memory per step to show growth: {table}"
    assert steps[0]["limit"] is not None and steps[0]["limit"] > steps[0]["end"], table  # step 1's end, +10%
    for k, s in enumerate(steps[1:], 2):  # at every step's end, a trim included, under the limit before it
        limit = steps[k - 2]["limit"]
        assert limit is None or s["end"] <= limit, f"step {k} ended over the limit: {table}"
    # nothing kept per step: Python objects and live tensors are flat after step 2
    assert steps[-1]["tensor_bytes"] - steps[1]["tensor_bytes"] < 1 * MB, table
    assert steps[-1]["objects"] - steps[1]["objects"] < 2000, table
