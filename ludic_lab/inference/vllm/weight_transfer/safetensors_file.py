"""The safetensors format, written and read without pickle: an 8-byte little-endian header
length, a JSON header (dtype, shape and byte range of each tensor), then the raw bytes.

Writing (:func:`write_safetensors`, and :func:`header_bytes` for a buffer filled in place)
is done here; reading goes through ``safetensors`` itself (:func:`read_safetensors_header`,
:func:`iter_safetensors`) except where a tensor's byte range is needed:
:class:`SafetensorsMap` maps a file read-only and gives zero-copy views, back-to-back tensors
as one. torch and safetensors are imported only when called (this module is imported by the
vLLM server process).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import struct
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ludic_lab.inference.vllm.weight_transfer.base import ITEMSIZE, ParamMeta, dtype_name, param_metas

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
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def header_bytes(metas: Sequence[ParamMeta]) -> tuple[bytes, dict[str, tuple[int, int]]]:
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
    head, _ = header_bytes(metas)
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
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
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


def typed_view(u8: Any, begin: int, end: int, dtype: str, shape: Sequence[int]) -> Any | None:
    """A zero-copy ``dtype`` view of bytes ``[begin, end)`` of a uint8 tensor; ``None`` when
    ``begin`` is not a multiple of the item size (torch cannot view it then)."""
    import torch

    tdt = getattr(torch, dtype)
    if begin % ITEMSIZE[dtype]:
        return None
    return u8[begin:end].view(tdt).view(tuple(shape))


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
        v = typed_view(self._u8, b, e, dt, shape)
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
            v = typed_view(self._u8, first[2], pos, dt, (rows, *shape0[1:]))
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
