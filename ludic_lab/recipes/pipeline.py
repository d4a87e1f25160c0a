"""Monitoring a pipeline-RL run (``examples/pipeline_rl/``), as the deployment guide does by
hand with ``redis-cli XLEN`` and ``curl /runtime_version``: how many items wait in the Redis
stream, and which policy version the vLLM server the actors sample from is serving.

    samples: list[dict] = []
    task = asyncio.create_task(monitor(redis_url, queue_key, vllm_url, samples, every_s=10))
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from typing import Any

log = logging.getLogger("pipeline_rl.trainer")


def runtime_version(url: str) -> int | None:
    """The server's policy version (``GET /runtime_version``), ``None`` if it does not answer."""
    base = url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(base + "/runtime_version", timeout=5) as r:
            return int(json.loads(r.read())["version"])
    except (OSError, ValueError, KeyError):
        return None


async def queue_length(redis_url: str, key: str) -> int | None:
    """``XLEN key``: items pushed and not yet trained (or dropped); ``None`` if Redis does not answer."""
    from ludic_lab.pipeline.connection import close_client, connect_redis

    try:
        r = await connect_redis(redis_url, connect_timeout_s=2.0, role="monitor")
    except Exception:  # noqa: BLE001 - a monitor never stops the run
        return None
    try:
        return int(await r.xlen(key))
    finally:
        await close_client(r)


async def monitor(redis_url: str, queue_key: str, vllm_url: str | None, samples: list[dict[str, Any]], *,
                  every_s: float) -> None:  # fmt: skip
    """Until cancelled: every ``every_s`` seconds append ``{"xlen", "runtime_version"}`` to
    ``samples`` and log it."""
    while True:
        version = await asyncio.to_thread(runtime_version, vllm_url) if vllm_url else None
        row = {"xlen": await queue_length(redis_url, queue_key), "runtime_version": version}
        samples.append(row)
        log.info("queue %s: XLEN %s, server runtime_version %s", queue_key, row["xlen"], row["runtime_version"])
        await asyncio.sleep(every_s)
