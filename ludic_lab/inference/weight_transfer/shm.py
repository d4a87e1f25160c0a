"""Same-host shared-memory transport: one safetensors file in ``/dev/shm`` per update.

The sender writes the tensors (in the order of the update's ``params``) to a fresh file under
the shared-memory folder and posts its path as ``location``; the server validates the file's
header against the declared metadata, loads it in the worker, and deletes it (on error too).
``/dev/shm`` is RAM, so the bytes never touch a disk. No pickle: the file is plain
safetensors (8-byte header length, JSON header, raw little-endian bytes).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import uuid
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from ludic_lab.inference.weight_transfer.base import ParamMeta, dtype_name, param_metas, update_body

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
_ITEMSIZE = {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "int16": 2}
_ITEMSIZE.update({"int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1})
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


def write_safetensors(path: str, params: Mapping[str, Any]) -> list[ParamMeta]:
    """Write ``params`` (CPU or GPU tensors) to ``path`` as safetensors, in iteration order.

    Writes to a temporary name and renames, so a reader never sees a half-written file; a
    failure (e.g. the folder is full) removes the partial file and re-raises.
    """
    metas = param_metas(params)
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "writer": "ludic_lab"}}
    offset = 0
    for m, t in zip(metas, params.values()):
        nbytes = t.numel() * t.element_size()
        header[m.name] = {"dtype": _CODES[m.dtype], "shape": list(m.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    import torch

    tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)
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


def read_safetensors_header(path: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{name: (wire dtype, shape)}`` of a safetensors file, in file order, from its header only.

    ``ValueError`` when the file is not safetensors or is shorter than its header says.
    """
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError(f"{path} is not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER_BYTES:
            raise ValueError(f"{path} is not a safetensors file (header length {n})")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError(f"{path} is not a safetensors file (bad JSON header: {e})") from None
    size = os.path.getsize(path) - 8 - n
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt, shape = dtype_name(info["dtype"]), tuple(int(d) for d in info["shape"])
        begin, end = (int(x) for x in info["data_offsets"])
        numel = 1
        for d in shape:
            numel *= d
        wrong_len = dt in _ITEMSIZE and end - begin != numel * _ITEMSIZE[dt]
        if wrong_len or end > size or begin < 0:
            raise ValueError(f"{path}: the bytes of {name!r} do not fit its header (truncated or malformed file)")
        out[name] = (dt, shape)
    return out


def iter_safetensors(path: str, names: Sequence[str], rename: Optional[Mapping[str, str]] = None) -> Iterator[tuple[str, Any]]:
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


class ShmSender:
    """Trainer side of the shared-memory transport (the server must run on the same host).

    ``stage()`` writes the tensors to ``<shm_dir>/ludic_weights_<id>.safetensors`` and returns
    the ``/update_param_batch`` body; the server deletes the file after loading it (also when
    it refuses the update). ``discard(body)`` removes it if the request never reached the server.
    """

    transport = "shm"

    def __init__(self, shm_dir: Optional[str] = None) -> None:
        self.shm_dir = shm_dir or default_shm_dir()
        Path(self.shm_dir).mkdir(parents=True, exist_ok=True)

    def init_body(self) -> dict[str, Any]:
        return {"transport": "shm", "host": None, "port": None, "world_size": None}

    def connect(self) -> None:
        """Nothing to join: the file system is the channel."""

    def stage(self, params: Mapping[str, Any], *, version: Optional[int] = None) -> dict[str, Any]:
        if not params:
            raise ValueError("no parameters to send")
        path = os.path.join(self.shm_dir, f"{FILE_PREFIX}{os.getpid()}_{uuid.uuid4().hex}{SUFFIX}")
        metas = write_safetensors(path, params)
        return update_body(metas, transport="shm", version=version, location=path)

    def send(self, params: Mapping[str, Any]) -> None:
        """The bytes already travelled in :meth:`stage`."""

    def discard(self, body: Mapping[str, Any]) -> None:
        loc = body.get("location")
        if isinstance(loc, str):
            remove_quietly(loc)

    def close(self) -> None:
        pass

