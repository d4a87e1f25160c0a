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

``/dev/shm`` is RAM, so the bytes never touch a disk.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import struct
import tempfile
import uuid
import warnings
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ludic_lab.inference.weight_transfer.base import ITEMSIZE, ParamMeta, dtype_name, param_metas, update_body

_CODES = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
FILE_PREFIX = "ludic_weights_"
SUFFIX = ".safetensors"
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def default_shm_dir() -> str:
    """Folder for update files: ``$LUDIC_SHM_DIR``, else ``/dev/shm``, else the temp folder."""
    env = os.environ.get("LUDIC_SHM_DIR")
    if env:
        return env
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def _header(metas: Sequence[ParamMeta]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """The safetensors header (length prefix included) and each tensor's byte range in the file."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "writer": "ludic_lab"}}
    ranges, offset = {}, 0
    for m in metas:
        nbytes = m.nbytes
        header[m.name] = {"dtype": _CODES[m.dtype], "shape": list(m.shape), "data_offsets": [offset, offset + nbytes]}
        ranges[m.name] = (offset, offset + nbytes)
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    start = 8 + len(raw)
    return struct.pack("<Q", len(raw)) + raw, {k: (b + start, e + start) for k, (b, e) in ranges.items()}


def write_safetensors(path: str, params: Mapping[str, Any]) -> list[ParamMeta]:
    """Write ``params`` (CPU or GPU tensors) to ``path`` as safetensors, in iteration order.

    Writes to a temporary name and renames, so a reader never sees a half-written file; a
    failure (e.g. the folder is full) removes the partial file and re-raises.
    """
    metas = param_metas(params)
    head, _ = _header(metas)
    import torch

    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(head)
            for t in params.values():
                data = t.detach()
                if data.device.type != "cpu":
                    data = data.cpu()
                data = data.contiguous().reshape(-1)
                if data.numel():
                    f.write(memoryview(data.view(torch.uint8).numpy()))
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    return metas


def _parse_header(raw: bytes, data_size: int, path: str) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """``{name: (wire dtype, shape, begin, end)}`` from a JSON header (offsets relative to the
    data section of ``data_size`` bytes); ``ValueError`` for a malformed or truncated file."""
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{path} is not a safetensors file (bad JSON header: {e})") from None
    out: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        meta = ParamMeta(name, dtype_name(info["dtype"]), tuple(int(d) for d in info["shape"]))
        begin, end = (int(x) for x in info["data_offsets"])
        wrong_len = meta.dtype in ITEMSIZE and end - begin != meta.nbytes
        if wrong_len or end > data_size or begin < 0:
            raise ValueError(f"{path}: the bytes of {name!r} do not fit its header (truncated or malformed file)")
        out[name] = (meta.dtype, meta.shape, begin, end)
    return out


def _header_length(head: bytes, file_size: int, path: str) -> int:
    if len(head) != 8:
        raise ValueError(f"{path} is not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", head)
    if n > min(_MAX_HEADER_BYTES, file_size - 8):
        raise ValueError(f"{path} is not a safetensors file (header length {n})")
    return n


def read_safetensors_header(path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (wire dtype, shape)}`` of a safetensors file, in file order, from its header only
    (read by ``safetensors.safe_open``; no tensor is loaded).

    ``ValueError`` when the file is not safetensors or is shorter than its header says.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            out = {}
            for name in f.offset_keys():
                sl = f.get_slice(name)
                out[name] = (dtype_name(sl.get_dtype()), tuple(int(d) for d in sl.get_shape()))
    except SafetensorError as e:
        raise ValueError(f"{path} is not a readable safetensors file ({e})") from None
    return out


def iter_safetensors(
    path: str, names: Sequence[str], rename: Mapping[str, str] | None = None
) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, tensor)`` for ``names`` from a safetensors file (memory-mapped, CPU).

    ``rename`` maps a file name to the name yielded (e.g. a tied ``lm_head.weight`` alias).
    """
    from safetensors import safe_open

    rename = rename or {}
    with safe_open(path, framework="pt", device="cpu") as f:
        for name in names:
            yield rename.get(name, name), f.get_tensor(name)


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


def _typed_view(u8: Any, begin: int, end: int, dtype: str, shape: Sequence[int]) -> Any | None:
    """A zero-copy ``dtype`` view of bytes ``[begin, end)`` of a uint8 tensor; ``None`` when
    ``begin`` is not a multiple of the item size (torch cannot view it then)."""
    import torch

    tdt = getattr(torch, dtype)
    if begin % ITEMSIZE[dtype]:
        return None
    return u8[begin:end].view(tdt).view(tuple(shape))


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
        head, self.ranges = _header(self.metas)
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
        self.views = {m.name: _typed_view(self._u8, *self.ranges[m.name], m.dtype, m.shape) for m in self.metas}

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


class SafetensorsMap:
    """Server side: a safetensors file mapped read-only (pages faulted in up front), its
    tensors as zero-copy views. Valid while the file's inode and size are unchanged.

    It reads the header's byte offsets itself: ``safetensors.safe_open`` gives names, dtypes
    and shapes but not where each tensor lies, which :meth:`concat_rows` needs to return
    back-to-back tensors (q/k/v, gate/up) as one view.
    """

    def __init__(self, path: str) -> None:
        import torch

        fd = os.open(path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            self.key = (st.st_dev, st.st_ino, st.st_size)
            if st.st_size < 8:
                raise ValueError(f"{path} is not a safetensors file (shorter than 8 bytes)")
            self._mm = mmap.mmap(
                fd, st.st_size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ
            )
        finally:
            os.close(fd)
        self.path = path
        try:
            n = _header_length(self._mm[:8], st.st_size, path)
            start = 8 + n
            self.entries = {
                k: (dt, shape, b + start, e + start)
                for k, (dt, shape, b, e) in _parse_header(bytes(self._mm[8:start]), st.st_size - start, path).items()
            }
        except BaseException:
            self._mm.close()
            raise
        with warnings.catch_warnings():  # read-only memory: these views are never written
            warnings.simplefilter("ignore", UserWarning)
            self._u8: Any = torch.frombuffer(self._mm, dtype=torch.uint8)

    def still_valid(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino, st.st_size) == self.key

    def tensor(self, name: str) -> Any:
        """Zero-copy view of ``name`` (a private copy when its bytes are misaligned)."""
        import torch

        dt, shape, b, e = self.entries[name]
        v = _typed_view(self._u8, b, e, dt, shape)
        if v is None:
            v = self._u8[b:e].clone().view(getattr(torch, dt)).view(shape)
        return v

    def concat_rows(self, names: Sequence[str]) -> Any:
        """The tensors ``names`` stacked along dim 0: a zero-copy view when they lie back to
        back in the file (as a state dict's q/k/v or gate/up do), else a concatenated copy."""
        import torch

        first = self.entries[names[0]]
        dt, shape0 = first[0], first[1]
        rows, contiguous, pos = 0, True, first[2]
        for n in names:
            d, shape, b, e = self.entries[n]
            if d != dt or len(shape) != len(shape0) or tuple(shape[1:]) != tuple(shape0[1:]):
                raise ValueError(f"cannot stack {list(names)}: dtypes or trailing shapes differ")
            contiguous = contiguous and b == pos
            pos, rows = e, rows + (shape[0] if shape else 1)
        if contiguous:
            v = _typed_view(self._u8, first[2], pos, dt, (rows, *shape0[1:]))
            if v is not None:
                return v
        return torch.cat([self.tensor(n) for n in names], dim=0)

    def contains(self, ptr: int) -> bool:
        """Whether address ``ptr`` lies inside this mapping."""
        base = self._u8.data_ptr() if self._u8 is not None else 0
        return base <= ptr < base + len(self._mm) if base else False

    def close(self) -> None:
        self._u8 = None
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass
