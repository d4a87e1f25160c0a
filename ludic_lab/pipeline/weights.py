"""Weights through Redis, for actors that sample in-process (``LocalChatClient``).

With vLLM the trainer pushes weights to the server (``BroadcastPolicyPublisher``) and the
server stamps each completion with its policy version. An actor that samples with an
in-process model has no server to receive weights, so the trainer also writes them to
Redis and the actor loads them between rollout rounds:

- :class:`RedisWeightsPublisher` (trainer side, a ``PolicyPublisher``): ``publish`` turns
  the state dict into safetensors bytes and hands them to a writer thread (the trainer's
  event loop never blocks on Redis; if the writer falls behind, only the newest version is
  written). The bytes go into chunks ``<key>:<version>:<i>`` (Redis strings stop at 512 MB)
  and then, atomically, a msgpack manifest ``<key>`` = ``{version, chunks, nbytes, sha256,
  aliases}`` (``aliases``: tied names such as ``lm_head.weight``, written once).
  The previous version's chunks are kept so a reader in mid-fetch still finds them.
- :class:`RedisWeightsSubscriber` (actor side): ``maybe_update(client)`` reads the manifest;
  when its version differs from ``client.policy_version`` (newer, or a restarted trainer's
  v0) it fetches the chunks, checks
  the hash, and calls ``client.sync_weights(state_dict, version=...)`` in a worker thread.
  Every completion sampled afterwards carries that version, which is what the trainer's
  ``max_lag`` compares against.

This moves the whole model through Redis on every publish: fine for small models and for
tests; on a cluster use vLLM and the broadcast publisher.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import queue
import threading
import time
from collections.abc import Mapping
from typing import Any

import msgpack

from ludic_lab.pipeline.connection import check_redis_url, redact

log = logging.getLogger("ludic_lab.pipeline")

_CHUNK_BYTES = 64 * 2**20


def _weights_bytes(state_dict: Mapping[str, Any], dtype: Any = None) -> tuple[bytes, dict[str, str]]:
    """Safetensors bytes of ``state_dict`` and its aliases ``{name: name it repeats}``.

    A tensor that is the very same view as an earlier one (a tied ``lm_head.weight``) is
    written once and recorded as an alias, which the reader restores; ``save`` copies each
    tensor exactly once (no intermediate clone).
    """
    import torch
    from safetensors.torch import save

    out: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for k, v in state_dict.items():
        t = v.detach() if isinstance(v, torch.Tensor) else torch.as_tensor(v)
        # identity before the move to CPU: each .to("cpu") of a GPU tensor is a fresh copy
        ident = (t.device, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype) if t.numel() else None
        t = t.to("cpu")
        if ident is not None and ident in seen:
            aliases[k] = seen[ident]
            continue
        if ident is not None:
            seen[ident] = k
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[k] = t.contiguous()
    return save(out), aliases


class RedisWeightsPublisher:
    """A ``PolicyPublisher`` that writes the policy to Redis for local actors (see module doc).

    ``dtype`` (e.g. ``torch.bfloat16``) casts floating tensors before writing; ``wait=True``
    makes ``publish`` return only once Redis holds the version (tests, scripts). A write
    error is raised by the next ``publish``/``flush``.
    """

    def __init__(
        self,
        redis_url: str,
        key: str,
        *,
        dtype: Any = None,
        wait: bool = False,
        chunk_bytes: int = _CHUNK_BYTES,
        connect_timeout_s: float = 5.0,
        reconnect_timeout_s: float = 300.0,
    ) -> None:
        import redis

        self.redis_url = check_redis_url(redis_url)
        self.key = key
        self.dtype = dtype
        self.wait = wait
        self.chunk_bytes = int(chunk_bytes)
        self.reconnect_timeout_s = float(reconnect_timeout_s)
        self._r = redis.Redis.from_url(redis_url, socket_connect_timeout=connect_timeout_s, socket_timeout=60)
        try:
            self._r.ping()
        except redis.RedisError as e:
            from ludic_lab.pipeline.connection import PipelineConnectionError

            raise PipelineConnectionError(
                f"weights publisher: cannot reach Redis at {redact(redis_url)} ({type(e).__name__}: {e}); "
                "is redis-server running there?"
            ) from None
        self._q: queue.Queue[tuple[int, tuple[bytes, dict[str, str]]] | None] = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.last_written: int | None = None
        self._thread = threading.Thread(target=self._writer, name="ludic-weights-writer", daemon=True)
        self._thread.start()

    def publish(self, state_dict: Mapping[str, Any], version: int | None = None) -> None:
        """Queue ``state_dict`` as policy ``version`` (an int is required: actors compare versions)."""
        self._raise_pending()
        if version is None:
            raise ValueError("RedisWeightsPublisher.publish needs the policy version (an int)")
        data = _weights_bytes(state_dict, self.dtype)
        self._idle.clear()
        try:  # latest wins: drop a queued, not yet written older version
            self._q.get_nowait()
        except queue.Empty:
            pass
        self._q.put((int(version), data))
        if self.wait:
            self.flush()

    def flush(self, timeout_s: float = 300.0) -> None:
        """Wait until every queued version is written (raises the writer's error, if any)."""
        if not self._idle.wait(timeout_s):
            raise TimeoutError(f"weights writer did not finish within {timeout_s} s")
        self._raise_pending()

    def close(self) -> None:
        """Flush, stop the writer thread and close the connection."""
        try:
            self.flush()
        finally:
            self._q.put(None)
            self._thread.join(timeout=10)
            self._r.close()

    def _raise_pending(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise RuntimeError(f"writing weights to Redis failed: {e}") from e

    def _writer(self) -> None:
        import redis

        while True:
            job = self._q.get()
            if job is None:
                return
            version, data = job
            t0 = time.monotonic()
            delay = 0.05
            while True:
                try:
                    self._write(version, data)
                    self.last_written = version
                    break
                except (redis.ConnectionError, redis.TimeoutError) as e:
                    if time.monotonic() - t0 > self.reconnect_timeout_s:
                        self._error = e
                        break
                    time.sleep(delay)
                    delay = min(2.0, delay * 2)
                except Exception as e:  # noqa: BLE001 - reported by the next publish()
                    self._error = e
                    break
            if self._q.empty():
                self._idle.set()

    def _write(self, version: int, payload: tuple[bytes, dict[str, str]]) -> None:
        data, aliases = payload
        view = memoryview(data)  # chunks without copying
        chunks: list[memoryview | bytes] = [
            view[i : i + self.chunk_bytes] for i in range(0, len(data), self.chunk_bytes)
        ]
        chunks = chunks or [b""]
        p = self._r.pipeline(transaction=False)
        for i, c in enumerate(chunks):
            p.set(f"{self.key}:{version}:{i}", c)
        p.execute()
        old = self._r.get(self.key)
        manifest = {
            "version": version,
            "chunks": len(chunks),
            "nbytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "format": "safetensors",
            "aliases": aliases,
            "written_at": time.time(),
        }
        self._r.set(self.key, msgpack.packb(manifest))
        if old:  # drop the version before the previous one (readers may still be fetching the previous)
            prev = msgpack.unpackb(old)
            keep = {f"{self.key}:{prev['version']}:{i}" for i in range(prev["chunks"])}
            stale = [
                k
                for k in self._r.scan_iter(match=f"{self.key}:*", count=1000)
                if k.decode() not in keep and not k.decode().startswith(f"{self.key}:{version}:")
            ]
            if stale:
                self._r.delete(*stale)


class RedisWeightsSubscriber:
    """Loads newer weights written by :class:`RedisWeightsPublisher` into a local client.

    ``redis`` is a connected ``redis.asyncio`` client (the actor's); ``key`` the publisher's.
    """

    def __init__(self, redis: Any, key: str) -> None:
        self._r = redis
        self.key = key
        self.updates = 0

    async def latest_version(self) -> int | None:
        """The newest version in Redis (``None`` when nothing was published yet)."""
        raw = await self._r.get(self.key)
        return None if raw is None else int(msgpack.unpackb(raw)["version"])

    async def maybe_update(self, client: Any) -> int | None:
        """If Redis holds a version other than ``client.policy_version``, load it into
        ``client`` (``sync_weights`` in a worker thread) and return it; else ``None``."""
        raw = await self._r.get(self.key)
        if raw is None:
            return None
        m = msgpack.unpackb(raw)
        version = int(m["version"])
        current = getattr(client, "policy_version", None)
        # "differs", not "newer": a trainer restarted without a checkpoint publishes v0 again
        if current is not None and version == int(current):
            return None
        parts = await self._r.mget([f"{self.key}:{version}:{i}" for i in range(int(m["chunks"]))])
        if any(p is None for p in parts):  # superseded while we read: the next round picks the newer one
            return None
        data = b"".join(parts)
        if hashlib.sha256(data).hexdigest() != m["sha256"]:
            raise ValueError(f"weights v{version} under {self.key!r} fail their sha256 check (corrupt or foreign)")

        aliases = dict(m.get("aliases") or {})

        def load() -> None:
            from safetensors.torch import load as st_load

            params = st_load(data)
            for name, same in aliases.items():  # tied weights travel once
                if same not in params:
                    raise ValueError(f"weights v{version} under {self.key!r}: alias {name!r} -> missing {same!r}")
                params[name] = params[same]
            client.sync_weights(params, version=version)

        await asyncio.to_thread(load)
        self.updates += 1
        log.info("loaded policy v%d from Redis (%.1f MB)", version, len(data) / 2**20)
        return version
