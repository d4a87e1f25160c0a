"""reasoning-gym's scorers run in a child process, so model text cannot hang an episode.

Some scorers evaluate what the model wrote (``countdown`` hands the answer to sympy's
``parse_expr``): ``9**9**9`` there computes for hours while holding the interpreter lock, and a
thread with a timeout cannot stop it. :class:`ScorerProcess` keeps one child Python
(``python -m ludic_lab.task.external.reasoning_gym_scorer``) with reasoning-gym imported and
sends it ``(name, dataset kwargs, answer, entry)``; a call that outlives its timeout kills the
child (the next call starts a fresh one) and raises :class:`ScorerTimeout`. The child is our
own process on private pipes (frames of a 4-byte length and a pickle of the request), never a
network wire.
"""

from __future__ import annotations

import atexit
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from typing import Any

_HEADER = struct.Struct(">I")
START_TIMEOUT_S = 120.0
"""How long the child may take to import reasoning-gym and say it is ready."""


class ScorerTimeout(TimeoutError):
    """The scorer ran past its time limit on one answer (the child process was killed)."""


class ScorerError(RuntimeError):
    """The scorer raised on one answer; the message is the scorer's own error."""


class NotSendable(TypeError):
    """The request cannot be pickled for the child (an entry holding a function, ...); score in-process."""


def _write(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    """``n`` bytes from ``fd``; ``None`` at end of file; :class:`ScorerTimeout` past ``deadline``."""
    chunks: list[bytes] = []
    while n > 0:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ScorerTimeout("the scorer did not answer in time")
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read(fd: int, deadline: float | None) -> Any:
    head = _read_exact(fd, _HEADER.size, deadline)
    if head is None:
        return None
    body = _read_exact(fd, _HEADER.unpack(head)[0], deadline)
    return None if body is None else pickle.loads(body)


class ScorerProcess:
    """A child process scoring answers with reasoning-gym's ``score_answer`` (thread-safe,
    one call at a time); started on the first :meth:`score`, restarted after a timeout."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def score(self, name: str, dataset_kwargs: dict[str, Any], answer: str | None, entry: Any, *,
              timeout_s: float) -> float:  # fmt: skip
        """``create_dataset(name, **dataset_kwargs).score_answer(answer, entry)`` in the child.

        Raises :class:`ScorerTimeout` after ``timeout_s`` (the child is killed), :class:`ScorerError`
        when the scorer raises, :class:`NotSendable` when the request does not pickle."""
        try:
            request = pickle.dumps((name, dataset_kwargs, answer, entry), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # pickling fails in many ways (TypeError, AttributeError, ...)
            raise NotSendable(f"cannot send this entry to the scorer process: {type(e).__name__}: {e}") from e
        with self._lock:
            proc = self._ensure_started()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(_HEADER.pack(len(request)) + request)
                proc.stdin.flush()
                reply = _read(proc.stdout.fileno(), time.monotonic() + timeout_s)
            except ScorerTimeout:
                self._kill()
                raise ScorerTimeout(f"reasoning-gym's {name} scorer ran past {timeout_s:g}s on this answer") from None
            except OSError as e:  # the child died under us
                self._kill()
                raise ScorerError(f"the scorer process died: {e}") from e
            if reply is None:
                self._kill()
                raise ScorerError("the scorer process exited without answering")
        kind, value = reply
        if kind == "error":
            raise ScorerError(value)
        return float(value)

    def _ensure_started(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True
        )
        assert proc.stdout is not None
        try:
            ready = _read(proc.stdout.fileno(), time.monotonic() + START_TIMEOUT_S)
        except ScorerTimeout:
            ready = None
        if ready != ("ready", None):
            proc.kill()
            proc.wait()
            raise ScorerError(
                f"the reasoning-gym scorer process did not start (got {ready!r}); is reasoning-gym installed?"
            )
        self._proc = proc
        return proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()

    def close(self) -> None:
        """Stop the child (a later :meth:`score` starts a new one). Safe to call twice."""
        with self._lock:
            self._kill()


_SHARED: ScorerProcess | None = None


def shared_scorer() -> ScorerProcess:
    """The process-wide :class:`ScorerProcess` (closed at interpreter exit)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = ScorerProcess()
        atexit.register(_SHARED.close)
    return _SHARED


def _serve() -> None:
    """The child's loop: read a request, answer ``("ok", score)`` or ``("error", text)``."""
    import reasoning_gym

    out, fd = sys.stdout.buffer, sys.stdin.fileno()
    sys.stdout = sys.stderr  # a scorer that prints must not write into the channel
    datasets: dict[str, Any] = {}
    _write(out, ("ready", None))
    while True:
        request = _read(fd, None)
        if request is None:
            return
        name, kwargs, answer, entry = request
        try:
            key = repr((name, sorted(kwargs.items())))
            if key not in datasets:
                datasets[key] = reasoning_gym.create_dataset(name, **kwargs)
            _write(out, ("ok", float(datasets[key].score_answer(answer, entry))))
        except Exception as e:  # noqa: BLE001 - the scorer's error goes back to the caller
            _write(out, ("error", f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    _serve()
