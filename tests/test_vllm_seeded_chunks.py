"""Seeded sampling when vLLM prefills a prompt in chunks, on CPU (the bundled server).

vLLM 0.32 rewinds a seeded request's generator after each discarded partial-prefill token with
a CUDA-only call; on CPU the engine core died ("CPU Generator does not use offset") and every
request failed — the first GSM8K evaluation through the server here hit it (40 seeded
prompts). ``vllm.server.patches.skip_cpu_generator_rewind`` (installed in every worker) skips the
rewind for CPU generators. This server is started with a 64-token prefill budget so that
every prompt below is prefilled in several chunks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from vllm_helpers import require_vllm, shared_vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def test_the_patch_installs_once() -> None:
    require_vllm()
    from ludic_lab.inference.vllm.server.patches import skip_cpu_generator_rewind

    assert skip_cpu_generator_rewind() is True
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    first = GPUModelRunner._bookkeeping_sync
    assert skip_cpu_generator_rewind() is True and GPUModelRunner._bookkeeping_sync is first


def test_seeded_requests_with_chunked_prefill_are_served(tiny_model_dir: str) -> None:
    import httpx

    server = shared_vllm_server(tiny_model_dir, max_model_len=512, extra_args=["--max-num-batched-tokens", "64"])
    url = f"{server.api_base}/completions"

    async def one(client: Any, seed: int, n: int) -> list[int]:
        body = {"model": tiny_model_dir, "prompt": [(7 * seed + 3 * i) % 1900 + 10 for i in range(n)],
                "max_tokens": 6, "temperature": 1.0, "seed": seed, "return_token_ids": True}  # fmt: skip
        r = await client.post(url, json=body, timeout=300)
        assert r.status_code == 200, r.text[:500]
        return list(r.json()["choices"][0]["token_ids"])

    async def run() -> None:
        async with httpx.AsyncClient() as client:
            outs = await asyncio.gather(*(one(client, s, 150 + 10 * s) for s in range(8)))
            assert all(len(o) == 6 for o in outs)
            # the same seeded request alone, twice: the same tokens (same chunking each time)
            a = await one(client, 3, 180)
            b = await one(client, 3, 180)
            assert a == b
        async with httpx.AsyncClient() as client:  # the engine is still alive
            assert (await client.get(f"{server.base_url}/health", timeout=30)).status_code == 200

    asyncio.run(run())
