"""Live weight sync into the bundled vLLM server: the client side of ``/update_param_batch``.

:class:`WeightSync` opens the weight-update channel (``POST /init_communicator``: a
shared-memory folder on CPU, an NCCL group on CUDA), checks a state dict against the server's
``GET /param_spec`` before sending, stages it (a safetensors file in ``/dev/shm``, or an NCCL
broadcast) and asks the server to load it between engine steps. Every HTTP call goes through
:class:`~ludic_lab.inference.vllm.client.http.VLLMHttp`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from ludic_lab.inference.tied_weights import check_tied_values
from ludic_lab.inference.vllm.client.http import (
    RequestTimeout,
    VLLMError,
    VLLMHttp,
    VLLMServerUnavailable,
    WeightUpdateRejected,
)


class WeightSync:
    """The weight-update channel of one client to one server.

    ``device="cpu"`` uses the shared-memory transport (server on the same host), with one
    reused staging file when ``reuse_staging_buffer``; a CUDA device the NCCL transport, the
    trainer joining as rank 0 of ``nccl_world_size`` on ``group_host:group_port``.
    ``control_token`` authorizes the control routes.
    """

    def __init__(
        self,
        http: VLLMHttp,
        *,
        device: str = "cpu",
        control_token: str | None = None,
        group_host: str = "127.0.0.1",
        group_port: int = 51216,
        nccl_world_size: int = 2,
        reuse_staging_buffer: bool = True,
    ) -> None:
        self.http = http
        self.server_url = http.server_url
        self.device = str(device)
        self.control_token = control_token
        self.group_host = str(group_host)
        self.group_port = int(group_port)
        self.nccl_world_size = int(nccl_world_size)
        self.reuse_staging_buffer = bool(reuse_staging_buffer)
        self.spec: Any = None  # the server's ModelParamSpec (GET /param_spec), cached
        self.sender: Any = None  # the open transport's WeightSender
        self.shm_dir: str | None = None

    @property
    def connect_timeout_s(self) -> float:
        return self.http.connect_timeout_s

    def headers(self) -> dict[str, str]:
        """``Authorization`` for the control routes: the control token, else the API key."""
        tok = self.control_token or self.http.api_key
        return {"Authorization": f"Bearer {tok}"} if tok else {}

    async def param_spec(self, *, refresh: bool = False) -> Any:
        """What an update must match (``GET /param_spec``): a
        :class:`~ludic_lab.inference.vllm.weight_transfer.spec.ModelParamSpec` (cached)."""
        from ludic_lab.inference.vllm.weight_transfer.spec import ModelParamSpec

        if self.spec is None or refresh:
            try:
                r = await self.http.request(
                    "GET", f"{self.server_url}/param_spec", timeout_s=self.connect_timeout_s + 30
                )
            except VLLMError as e:
                if e.status == 404:
                    raise VLLMError(
                        f"{self.server_url} has no weight-update routes (GET /param_spec: 404): serve the model with "
                        "python -m ludic_lab.inference.vllm_server (or start_vllm_server) to push weights",
                        status=404,
                    ) from None
                raise
            d = r.json()
            self.spec = ModelParamSpec(
                shapes={k: tuple(v) for k, v in d["params"].items()},
                dtype=d["dtype"],
                aliases=dict(d.get("aliases") or {}),
                packed_modules={k: tuple(v) for k, v in (d.get("packed_modules") or {}).items()},
            )
        return self.spec

    def make_sender(self) -> Any:
        if self.device == "cpu":
            from ludic_lab.inference.vllm.weight_transfer.shm import ShmSender

            return ShmSender(self.shm_dir, reuse=self.reuse_staging_buffer)
        from ludic_lab.inference.vllm.weight_transfer.nccl import NcclSender

        return NcclSender(self.group_host, self.group_port, self.nccl_world_size)

    async def init_communicator(self) -> None:
        """Open the weight-update channel (``POST /init_communicator``): shared memory on
        CPU; on a CUDA ``device`` an NCCL group on ``group_host:group_port`` (joined here
        while the server's workers join)."""
        if self.sender is not None:
            return
        if self.device == "cpu":
            r = await self.http.request(
                "POST",
                f"{self.server_url}/init_communicator",
                json={"transport": "shm"},
                timeout_s=60.0,
                headers=self.headers(),
            )
            self.shm_dir = r.json().get("shm_dir") or None
            self.sender = self.make_sender()
            return
        sender = self.make_sender()
        post = asyncio.ensure_future(
            self.http.request(
                "POST",
                f"{self.server_url}/init_communicator",
                json=sender.init_body(),
                timeout_s=300.0,
                headers=self.headers(),
                retry="connect",
            )
        )
        try:
            await asyncio.to_thread(sender.connect)
            await post
        except BaseException:
            post.cancel()
            sender.close()
            raise
        self.sender = sender

    async def close_communicator(self) -> None:
        """Close the weight-update channel (``POST /close_communicator``); idempotent."""
        sender, self.sender = self.sender, None
        if sender is None:
            return
        if sender.transport == "shm":  # nothing is held open on the server for files
            sender.close()
            return
        try:
            await self.http.request(
                "POST", f"{self.server_url}/close_communicator", timeout_s=60.0, headers=self.headers(), retry="connect"
            )
        finally:
            sender.close()

    def prepare(self, params: Mapping[str, Any], spec: Any, *, cast: bool = True) -> dict[str, Any]:
        """Detached tensors in wire order; with ``cast``, floating tensors cast to the server's
        dtype (the shm sender casts while staging instead; others are sent as they are, for the
        server to accept or refuse). A tied alias (``lm_head.weight``) sent with its embedding
        must hold the same value (else :class:`~ludic_lab.inference.tied_weights.TiedWeightsMismatch`,
        the rule ``LocalChatClient`` applies too) and is not sent twice."""
        import torch

        target = getattr(torch, spec.dtype)
        check_tied_values(params, [[canon, alias] for alias, canon in spec.aliases.items()], who="sync_weights")
        out: dict[str, Any] = {}
        for k, v in params.items():
            if not isinstance(k, str):
                raise TypeError(f"sync_weights: parameter names must be strings, got {k!r}")
            canon = spec.aliases.get(k)
            if canon is not None and canon in params:
                continue  # one tensor, checked equal above: the server loads the embedding
            t = v if isinstance(v, torch.Tensor) else torch.as_tensor(v)
            t = t.detach()
            if cast and t.is_floating_point() and t.dtype != target:
                t = t.to(target)
            out[k] = t
        return out

    async def push(
        self,
        params: Mapping[str, Any],
        *,
        timeout_s: float = 600.0,
        version: str | int | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """Load ``params`` into the server; returns the version it now serves and the timings
        of the update (see :meth:`VLLMChatClient.sync_weights`)."""
        new_version = _check_version(version)
        if not params:
            raise ValueError("sync_weights: no parameters given")
        t0 = time.perf_counter()
        spec = await self.param_spec()
        await self.init_communicator()
        sender = self.sender
        t_prep = time.perf_counter()
        shm = sender.transport == "shm"
        tensors = self.prepare(params, spec, cast=not shm)
        t_stage = time.perf_counter()
        if shm:  # the cast to the server's dtype happens while copying into shared memory
            body = await asyncio.to_thread(sender.stage, tensors, version=new_version, dtype=spec.dtype)
        else:
            body = await asyncio.to_thread(sender.stage, tensors, version=new_version)
        t_staged = time.perf_counter()
        url = f"{self.server_url}/update_param_batch"
        hdr = self.headers()
        # the server removes the one-shot file of every request it received (also a refused
        # one); the client removes it only when the server surely never got the request. A
        # reused staging buffer is written again only after the server answered.
        undelivered, answered = False, False
        try:
            if sender.transport == "nccl":  # a refused update must not leave us broadcasting
                await self.http.request(
                    "POST", f"{self.server_url}/validate_param_batch", json=body, headers=hdr, retry="connect"
                )
            post = asyncio.ensure_future(
                self.http.request("POST", url, json=body, timeout_s=timeout_s, headers=hdr, retry="connect")
            )
            if sender.transport == "nccl":
                await asyncio.to_thread(sender.send, tensors)
            resp = await post
            answered = True
        except VLLMError as e:
            answered = e.status is not None
            if e.status == 400:
                raise WeightUpdateRejected(
                    f"sync_weights refused by {self.server_url}: {e.reason}", status=400
                ) from None
            raise
        except RequestTimeout as e:
            undelivered = not e.sent  # sent: the server may still be applying it
            raise RequestTimeout(
                f"sync_weights: no answer from {self.server_url} within {timeout_s:g}s; the update is applied "
                "whole or not at all (check get_policy_version())",
                sent=e.sent,
            ) from e
        except VLLMServerUnavailable as e:
            undelivered = not (e.maybe_received and await self.http.health())  # a live server may be applying it
            raise
        finally:
            if undelivered:
                sender.discard(body)  # nobody will read it
            elif answered:
                sender.release(body)
            else:
                sender.abandon(body)  # the server may still be reading it
        data = resp.json()
        n = int(data.get("num_params", -1))
        if n != len(tensors):
            raise VLLMError(f"sync_weights: the server applied {n} of {len(tensors)} parameters ({self.server_url})")
        version_now = int(data["version"])
        return version_now, {
            "seconds": time.perf_counter() - t0,
            "prepare_seconds": t_stage - t_prep,  # detach / cast to the server's dtype
            "stage_seconds": t_staged - t_stage,  # shm: writing the file; nccl: ~0
            "server_seconds": float(data.get("seconds", float("nan"))),
            "load_seconds": float(data.get("load_seconds", float("nan"))),
            "load_mode": data.get("load_mode"),  # "inplace", "reload" (+ "reason"), ...
            "pack_seconds": float(data.get("pack_seconds", float("nan"))),  # vLLM re-packing its CPU GEMM weights
            "num_params": n,
            "load_reason": data.get("reason"),  # why not in place, when it was not
            "server_phases": dict(data.get("phases") or {}),  # drain, pause, load, resume, reset_prefix_cache
            "drained_requests": data.get("drained_requests"),  # generations the update waited for
            "bytes": _body_bytes(body),
            "version": version_now,
        }


def _body_bytes(body: Mapping[str, Any]) -> int:
    """Bytes of the tensors an update body declares (in their wire dtypes)."""
    from ludic_lab.inference.vllm.weight_transfer.base import ParamMeta

    return sum(ParamMeta.from_json(p).nbytes for p in body.get("params", []))


def _check_version(version: str | int | None) -> int | None:
    if version is None:
        return None
    try:
        return int(version)
    except (TypeError, ValueError):
        raise ValueError(f"sync_weights: version must be an integer (or its string), got {version!r}") from None
