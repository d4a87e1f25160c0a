"""LocalChatClient's adaptive thread count on the real sampler: beside a real busy process the
decode steps move to one thread; the configured count stays the upper arm and is restored.
The decision logic alone, with given step times, is in test_thread_governor.py."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ludic_lab.inference import LocalChatClient
from ludic_lab.inference.request import ChatCompletionRequest, ReturnSpec, SamplingConfig


def _request(tokens: int, seed: int = 1) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="policy",
        messages=({"role": "user", "content": "Tell me a story about a cat."},),
        sampling=SamplingConfig(temperature=1.0, max_tokens=tokens, seed=seed),
        return_=ReturnSpec.for_training(),
    )


def _generation_threads(client: LocalChatClient) -> int:
    return client._executor.submit(torch.get_num_threads).result()


def test_fixed_threads_and_the_count_restored_after_the_batch() -> None:
    fixed = LocalChatClient("tiny", num_threads=2, adaptive_threads=False)
    asyncio.run(fixed.complete(_request(40)))
    assert _generation_threads(fixed) == 2  # also waits for the batch's last step to be recorded
    got = fixed.thread_choices()
    assert got["adaptive"] is False and got["probes"] == 0 and set(got["recent"]) == {2}
    assert len(got["recent"]) == len(fixed.step_times()["decode"])

    adaptive = LocalChatClient("tiny", num_threads=2)
    asyncio.run(adaptive.complete(_request(80)))
    assert _generation_threads(adaptive) == 2  # whatever the decode steps chose, the batch restored it
    got = adaptive.thread_choices()
    assert got["adaptive"] is True and got["upper"] == 2 and got["probes"] >= 1 and 1 in got["recent"]

    adaptive.set_num_threads(1)  # the user's count is the upper arm: one thread, nothing to choose
    asyncio.run(adaptive.complete(_request(80)))
    assert _generation_threads(adaptive) == 1
    after = adaptive.thread_choices()
    assert after["upper"] == 1 and after["probes"] == got["probes"]
    assert set(after["recent"][len(got["recent"]) :]) == {1}


_BESIDE_A_BUSY_PROCESS = """
import asyncio, json, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from test_adaptive_threads import LocalChatClient, _request

client = LocalChatClient("default", num_threads=2)
asyncio.run(client.complete(_request(32)))  # quiet: the steps at two threads it will compare with
client._executor.submit(lambda: None).result()  # a step is recorded just after its reply
n0 = len(client.step_times()["decode"])
busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
try:
    time.sleep(0.3)
    for seed in (2, 3):
        asyncio.run(client.complete(_request(48, seed)))
finally:
    busy.kill()
    busy.wait()
client._executor.submit(lambda: None).result()
steps = [round(s, 4) for _, s in client.step_times()["decode"][n0:]]
print(json.dumps({**client.thread_choices(), "recent": client.thread_choices()["recent"][n0:], "steps": steps}))
"""


@pytest.mark.alone  # a busy process of its own must be the only other work on the cores
def test_beside_a_busy_process_most_decode_steps_run_on_one_thread() -> None:
    # a fresh interpreter: another client's OpenMP team in this process (more OpenMP threads than
    # cores) makes libgomp sleep instead of spin, and the collapse this is about would not happen
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", _BESIDE_A_BUSY_PROCESS, str(Path(__file__).parent)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    recent = got["recent"]
    assert len(recent) >= 40  # the two stories' decode steps (each one's first token is its prefill's)
    assert recent.count(1) > 0.7 * len(recent), got
    assert got["switches"] >= 1 and got["upper"] == 2
