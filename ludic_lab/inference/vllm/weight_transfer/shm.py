"""Same-host shared-memory transport: safetensors files in ``/dev/shm``.

Two ways to use the folder, both plain safetensors (8-byte header length, JSON header, raw
little-endian bytes; no pickle):

- *one file per update* (``ShmSender()``): the sender writes the tensors to a fresh file and
  posts its path as ``location``; the server validates the header against the declared
  metadata, loads, and deletes the file (on error too).
- *a reused staging buffer* (``ShmSender(reuse=True)``, what :class:`VLLMChatClient` uses):
  the sender keeps one memory-mapped file per parameter layout and overwrites its bytes in
  place for every update (``"keep": true`` in the body: the server leaves the file alone).
  Its pages are faulted in once, so staging an update is one memcpy (with the cast to the
  server's dtype folded in). A buffer whose update timed out is never written again (the
  server may still be reading it); the sender deletes it once a later update has completed,
  and files of dead processes are removed by the next sender in the folder.

``/dev/shm`` is RAM, so the bytes never touch a disk. The file format itself (writing,
reading, the server's read-only map) is in :mod:`ludic_lab.inference.vllm.weight_transfer.safetensors_file`.
"""

from __future__ import annotations

import errno
import mmap
import os
import tempfile
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ludic_lab.inference.vllm.weight_transfer.base import ParamMeta, dtype_name, param_metas, update_body
from ludic_lab.inference.vllm.weight_transfer.safetensors_file import (  # noqa: F401 - re-exported: the format's readers
    SafetensorsMap,
    header_bytes,
    iter_safetensors,
    read_safetensors_header,
    typed_view,
    write_safetensors,
)

FILE_PREFIX = "ludic_weights_"
SUFFIX = ".safetensors"


def default_shm_dir() -> str:
    """Folder for update files: ``$LUDIC_SHM_DIR``, else ``/dev/shm``, else the temp folder."""
    env = os.environ.get("LUDIC_SHM_DIR")
    if env:
        return env
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def remove_quietly(path: str) -> bool:
    """Delete ``path`` if it exists; True if something was removed."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False


def is_inside(path: str, folder: str) -> bool:
    """Whether ``path`` (resolved, symlinks followed) lies inside ``folder``."""
    p, d = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([p, d]) == d and p != d


def _owner_pid(filename: str) -> int | None:
    """The pid in ``ludic_weights_<pid>_<id>...``; None for other names."""
    if not filename.startswith(FILE_PREFIX):
        return None
    head = filename[len(FILE_PREFIX) :].split("_", 1)[0]
    return int(head) if head.isdigit() else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def reap_stale_files(folder: str) -> list[str]:
    """Remove update files in ``folder`` left by processes that no longer run (e.g. a trainer
    killed with -9 while it held a staging buffer). Returns the removed paths."""
    removed: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in names:
        pid = _owner_pid(name)
        if pid is not None and pid != os.getpid() and not _pid_alive(pid):
            path = os.path.join(folder, name)
            try:
                if remove_quietly(path):
                    removed.append(path)
            except OSError:  # another user's file in a shared folder
                pass
    return removed


def _reserve(fd: int, size: int, path: str) -> None:
    """Allocate the file's pages up front; ``OSError`` with advice when the folder is full."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise OSError(
                e.errno,
                f"no room for a {size / 1e6:.0f} MB weight staging buffer in {os.path.dirname(path)} ({e.strerror}); "
                "free space there (containers often give /dev/shm only 64 MB: docker run --shm-size=...), point "
                "$LUDIC_SHM_DIR / --ludic-shm-dir at a bigger RAM folder, or pass reuse_staging_buffer=False",
            ) from None
        # a file system without fallocate: pages are allocated on first write instead


class StagingBuffer:
    """One memory-mapped safetensors file in shared memory, laid out for a fixed list of
    parameters and overwritten in place for every update."""

    def __init__(self, path: str, metas: Sequence[ParamMeta]) -> None:
        import torch

        self.path = path
        self.metas = tuple(metas)
        head, self.ranges = header_bytes(self.metas)
        self.size = max(len(head), max((e for _, e in self.ranges.values()), default=0))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, self.size)
            _reserve(fd, self.size, path)  # a full tmpfs is an error here, not a SIGBUS on first write
            self._mm = mmap.mmap(fd, self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            remove_quietly(path)
            raise
        os.close(fd)  # the mapping keeps the file's pages
        self._finalizer = weakref.finalize(self, remove_quietly, path)  # at GC or interpreter exit
        self._mm[: len(head)] = head
        self._u8: Any = torch.frombuffer(self._mm, dtype=torch.uint8)
        self.views = {m.name: typed_view(self._u8, *self.ranges[m.name], m.dtype, m.shape) for m in self.metas}

    def fill(self, params: Mapping[str, Any]) -> None:
        """Copy (and cast) ``params`` into the buffer, in the buffer's order."""
        import torch

        for m in self.metas:
            src = params[m.name].detach()
            dst = self.views[m.name]
            if dst is not None:
                dst.copy_(src.reshape(dst.shape) if src.shape != dst.shape else src)
            else:  # misaligned after an odd-sized tensor: cast first, then copy the bytes
                flat = src.to(getattr(torch, m.dtype)).contiguous().reshape(-1)
                b, e = self.ranges[m.name]
                self._u8[b:e].copy_(flat.cpu().view(torch.uint8))

    def close(self, *, unlink: bool = True) -> None:
        """Unmap (and delete the file, unless ``unlink=False``)."""
        self.views = {}
        self._u8 = None
        try:
            self._mm.close()
        except (BufferError, ValueError):  # a view is still alive somewhere: let GC unmap it
            pass
        if unlink:
            self._finalizer()
        else:
            self._finalizer.detach()


class ShmSender:
    """Trainer side of the shared-memory transport (the server must run on the same host).

    ``stage(params, dtype=...)`` puts the tensors (floating ones cast to ``dtype``) into
    ``<shm_dir>/ludic_weights_<pid>_<id>.safetensors`` and returns the
    ``/update_param_batch`` body. After the request the caller reports what happened:
    ``release(body)`` (the server answered: the file may be reused), ``abandon(body)`` (no
    answer but the server may be reading it: never write it again) or ``discard(body)`` (the
    request surely never arrived).

    ``reuse=False``: a fresh file per update, deleted by the server after loading (also when
    it refuses the update). ``reuse=True``: one staging buffer per parameter layout, kept and
    overwritten (see the module docstring); :meth:`close` deletes it.
    """

    transport = "shm"

    def __init__(self, shm_dir: str | None = None, *, reuse: bool = False) -> None:
        self.shm_dir = shm_dir or default_shm_dir()
        self.reuse = reuse
        Path(self.shm_dir).mkdir(parents=True, exist_ok=True)
        self._buffer: StagingBuffer | None = None
        self._in_flight: str | None = None  # path of the buffer a request is reading
        self._abandoned: list[StagingBuffer] = []
        if reuse:
            reap_stale_files(self.shm_dir)

    def init_body(self) -> dict[str, Any]:
        return {"transport": "shm", "host": None, "port": None, "world_size": None}

    def connect(self) -> None:
        """Nothing to join: the file system is the channel."""

    def _new_path(self) -> str:
        return os.path.join(self.shm_dir, f"{FILE_PREFIX}{os.getpid()}_{uuid.uuid4().hex}{SUFFIX}")

    def stage(
        self, params: Mapping[str, Any], *, version: int | None = None, dtype: str | None = None
    ) -> dict[str, Any]:
        """Write ``params`` to shared memory; floating tensors are cast to ``dtype`` on the way."""
        if not params:
            raise ValueError("no parameters to send")
        if self._in_flight is not None:
            raise RuntimeError("ShmSender.stage: the previous update was neither released, abandoned nor discarded")
        metas = param_metas(params)
        if dtype is not None:
            target = dtype_name(dtype)
            metas = [ParamMeta(m.name, target, m.shape) if _is_float(m.dtype) else m for m in metas]
        if not self.reuse:
            if dtype is not None:
                import torch

                params = {m.name: params[m.name].to(getattr(torch, m.dtype)) for m in metas}
            path = self._new_path()
            write_safetensors(path, params)
            return update_body(metas, transport="shm", version=version, location=path)
        buf = self._buffer
        if buf is None or buf.metas != tuple(metas):
            if buf is not None:
                self._buffer = None
                buf.close()
            buf = self._buffer = StagingBuffer(self._new_path(), metas)
        try:
            buf.fill(params)
        except BaseException:
            self._buffer = None
            buf.close()
            raise
        self._in_flight = buf.path
        return update_body(metas, transport="shm", version=version, location=buf.path, keep=True)

    def send(self, params: Mapping[str, Any]) -> None:
        """The bytes already travelled in :meth:`stage`."""

    def release(self, body: Mapping[str, Any]) -> None:
        """The server answered the request: its file is free again; earlier abandoned buffers
        are deleted (the server applies updates one at a time, in order)."""
        self._in_flight = None
        while self._abandoned:
            self._abandoned.pop().close()

    def abandon(self, body: Mapping[str, Any]) -> None:
        """No answer, but the server may still be reading the file: never write it again."""
        self._in_flight = None
        loc = body.get("location")
        if self._buffer is not None and self._buffer.path == loc:
            self._abandoned.append(self._buffer)
            self._buffer = None

    def discard(self, body: Mapping[str, Any]) -> None:
        """The request never reached the server: remove a one-shot file, keep a reused buffer."""
        self._in_flight = None
        loc = body.get("location")
        if isinstance(loc, str) and not body.get("keep"):
            remove_quietly(loc)

    def close(self) -> None:
        """Delete the staging buffer and every abandoned one."""
        self._in_flight = None
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None
        while self._abandoned:
            self._abandoned.pop().close()


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))
