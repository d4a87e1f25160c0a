"""The model cache: where materialised model folders live and how they are made once.

Cache layout: ``<root>/models/<name>/`` where ``<root>`` is ``cache_dir``, else
``$LUDIC_LAB_CACHE``, else ``$XDG_CACHE_HOME/ludic_lab`` (``~/.cache/ludic_lab``), else a
per-user temp folder when the home cache is not writable. Folders are built in a temp dir
and renamed into place under a file lock (``filelock``); a manifest written last marks them
complete, so a half-written folder is never used.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Union

from filelock import FileLock, Timeout

PathLike = Union[str, "os.PathLike[str]"]

MANIFEST_FILE = "ludic_lab_manifest.json"
"""Written last into a materialised folder; its presence (and matching file sizes) means complete."""
_FORMAT_VERSION = 1
_LOCK_TIMEOUT_S = 1800.0


class ModelNotAvailableError(RuntimeError):
    """A model cannot be resolved or materialised; the message says what to do."""


# ---------------------------------------------------------------------------------------------
# cache folder
# ---------------------------------------------------------------------------------------------


def cache_root(cache_dir: PathLike | None = None) -> Path:
    """The cache root: ``cache_dir``, ``$LUDIC_LAB_CACHE``, ``~/.cache/ludic_lab``, or a temp dir.

    The home default falls back to ``<tmp>/ludic_lab-cache-<user>`` when it is not writable
    (read-only CI homes); an explicitly given folder that is not writable is an error.
    """
    explicit = cache_dir if cache_dir is not None else os.environ.get("LUDIC_LAB_CACHE") or None
    if explicit is not None:
        root = Path(explicit).expanduser()
        if not _ensure_writable(root):
            raise ModelNotAvailableError(
                f"cache folder {root} is not writable; pass cache_dir= or set LUDIC_LAB_CACHE to a writable folder"
            )
        return root
    xdg = os.environ.get("XDG_CACHE_HOME")
    home_root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "ludic_lab"
    if _ensure_writable(home_root):
        return home_root
    user = os.environ.get("USER") or str(getattr(os, "getuid", lambda: "user")())
    tmp_root = Path(tempfile.gettempdir()) / f"ludic_lab-cache-{user}"
    if _ensure_writable(tmp_root):
        return tmp_root
    raise ModelNotAvailableError(
        f"neither {home_root} nor {tmp_root} is writable; set LUDIC_LAB_CACHE to a writable folder"
    )


def _ensure_writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK | os.X_OK)


def is_materialized(folder: PathLike) -> bool:
    """True when ``folder`` holds a complete materialised model (manifest + every listed file).

    Checks file sizes against the manifest, so a truncated or half-copied folder is rejected.
    """
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        if manifest.get("format_version") != _FORMAT_VERSION:
            return False
        files = manifest["files"]
        if not files:
            return False
        return all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_manifest(folder: Path, info: dict[str, Any]) -> None:
    files = {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST_FILE
    }
    manifest = {"format_version": _FORMAT_VERSION, "created": time.time(), **info, "files": files}
    tmp = folder / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    os.replace(tmp, folder / MANIFEST_FILE)


@contextlib.contextmanager
def _file_lock(lock_path: Path, timeout_s: float) -> Iterator[bool]:
    """Exclusive inter-process lock (``filelock``); yields True once held.

    The operating system drops the lock when its holder dies, so a crashed builder never
    blocks others. Threads of one process exclude each other too (one lock object each).
    """
    lock = FileLock(str(lock_path), timeout=timeout_s, thread_local=False)
    try:
        lock.acquire()
    except Timeout:
        raise TimeoutError(
            f"waited {timeout_s:.0f} s for {lock_path} held by another process that is "
            "building the same model; if no such process is running, delete the lock file"
        ) from None
    try:
        yield True
    finally:
        lock.release()


def _remove_tree(folder: Path) -> None:
    """Rename ``folder`` aside (atomic), then delete it, so no reader sees it half-deleted."""
    if not folder.exists():
        return
    trash = folder.parent / f".{folder.name}.trash-{os.getpid()}-{random.randrange(1 << 30)}"
    try:
        os.rename(folder, trash)
    except OSError:
        trash = folder
    shutil.rmtree(trash, ignore_errors=True)


def materialize(
    dest: PathLike,
    build: Callable[[Path], Any],
    info: dict[str, Any] | None = None,
    *,
    lock_timeout_s: float = _LOCK_TIMEOUT_S,
) -> str:
    """Return ``dest`` after making it, once: ``build(tmp_dir)`` then an atomic rename.

    Safe against concurrent callers (threads or processes): one builds under a file lock, the
    others wait and reuse it; an incomplete ``dest`` (no valid manifest) is replaced.
    """
    dest = Path(dest)
    if is_materialized(dest):
        return str(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(dest.parent / f".{dest.name}.lock", lock_timeout_s) as locked:
        if is_materialized(dest):
            return str(dest)
        if locked:  # we hold the lock: leftovers of crashed builders are garbage
            for pattern in (f".{dest.name}.tmp-*", f".{dest.name}.trash-*"):
                for stale in dest.parent.glob(pattern):
                    shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            build(tmp)
            _write_manifest(tmp, dict(info or {}))
            os.chmod(tmp, 0o755)  # mkdtemp makes it private; a model folder is for every reader
            if dest.exists() and not is_materialized(dest):
                _remove_tree(dest)  # half-written or from an older format
            try:
                os.rename(tmp, dest)
            except OSError:
                if not is_materialized(dest):  # lost a lock-less race to a broken folder
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # no-op when the rename succeeded
    return str(dest)


def normalize_tokenizer_config(folder: Path, *, model_max_length: int) -> None:
    """Make tokenizer_config.json portable: a generic fast-tokenizer class, no load-time keys."""
    path = folder / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg["model_max_length"] = int(model_max_length)
    cfg["clean_up_tokenization_spaces"] = False
    for key in ("is_local", "local_files_only", "name_or_path"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
