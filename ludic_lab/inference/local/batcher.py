"""Request batching for :class:`~ludic_lab.inference.local.client.LocalChatClient`.

One :class:`LoopBatcher` per event loop gathers the requests that concurrent episodes submit
and hands them to the client's generation thread: to the running continuous batch
(:mod:`ludic_lab.inference.local.continuous`, the default), or as one static batch; each request's
future gets its own result, or its own exception when only that request was bad.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ludic_lab.inference.request import ChatCompletionRequest
from ludic_lab.types import ChatResponse

if TYPE_CHECKING:
    from ludic_lab.inference.local.client import LocalChatClient


@dataclass
class _Pending:
    request: ChatCompletionRequest
    future: asyncio.Future[tuple[ChatResponse, dict[str, Any]]]


class LoopBatcher:
    """Per-event-loop queue: gathers concurrent requests and runs them as one batch."""

    def __init__(self, client: LocalChatClient) -> None:
        self.client = client
        self.pending: list[_Pending] = []
        self.worker: asyncio.Task | None = None

    def submit(self, req: ChatCompletionRequest) -> asyncio.Future[tuple[ChatResponse, dict[str, Any]]]:
        """Queue ``req`` for the next batch; the future resolves when that batch is done."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self.pending.append(_Pending(req, fut))
        if self.worker is None or self.worker.done():
            self.worker = loop.create_task(self._run())
        return fut

    async def _run(self) -> None:
        try:
            while self.pending:
                await self._run_one_batch()
        finally:
            # drop every reference to this loop (the client keeps batchers in a weak mapping);
            # when the loop is shutting down (we were cancelled), nobody is left waiting
            if asyncio.current_task() is self.worker:
                self.worker = None
            for p in self.pending:
                p.future.cancel()
            self.pending.clear()

    async def _run_one_batch(self) -> None:
        # let every coroutine that is about to submit do so before the batch is cut
        for _ in range(self.client.gather_ticks):
            await asyncio.sleep(0)
        if self.client.batch_wait_s > 0:
            await asyncio.sleep(self.client.batch_wait_s)
        if self.client.scheduling == "continuous":  # the running batch admits them as rows free up
            batch, self.pending = [p for p in self.pending if not p.future.done()], []
            self.client._continuous.submit([_job(p.request, p.future) for p in batch])
            return
        batch = [p for p in self.pending[: self.client.max_batch_size] if not p.future.done()]
        del self.pending[: self.client.max_batch_size]
        if not batch:
            return
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self.client._executor, self.client._generate_isolated, [p.request for p in batch]
            )
        except BaseException as e:
            for p in batch:
                if not p.future.done():
                    p.future.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
            if not isinstance(e, Exception):
                raise
            return
        for p, r in zip(batch, results, strict=True):
            if p.future.done():
                continue
            if isinstance(r, BaseException):
                p.future.set_exception(r)  # a bad request fails alone
            else:
                p.future.set_result(r)


def _job(request: ChatCompletionRequest, future: asyncio.Future) -> Any:
    """A continuous-batching job whose reply (or exception) resolves ``future`` on its loop."""
    from ludic_lab.inference.local.rows import Job

    loop = future.get_loop()

    def resolve(result: Any) -> None:
        if future.done():
            return
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    def deliver(result: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting any more
            loop.call_soon_threadsafe(resolve, result)

    return Job(request, deliver, future.done)
