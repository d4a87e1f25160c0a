"""The library's declared API stays small and true.

A package's ``__all__`` lists the names a user imports from it, once: leaf modules declare
none (their package does), and a name re-exported elsewhere for an older import path is bound
there (``name as name``) without being listed again. The count is taken at run time over every
module, in a fresh interpreter, so computed lists (``training``'s lazy names, ``pipeline``'s
table) count what they hold.
"""

from __future__ import annotations

import json
import subprocess
import sys

MAX_EXPORTED = 320
# 300 until the workspace subsystem (envs.workspace, 15 names) and the bug-fix tasks (data.bugfix,
# 4) arrived (issue 45); a new subsystem lists what a user imports from it, no more

_COUNT = r"""
import importlib, json, pkgutil
import ludic_lab
lists, missing, unimportable = {}, [], []
mods = ["ludic_lab"] + [m.name for m in pkgutil.walk_packages(ludic_lab.__path__, "ludic_lab.")]
for name in mods:
    try:
        mod = importlib.import_module(name)
    except ImportError as e:  # an optional extra that is not installed
        unimportable.append(f"{name}: {e}")
        continue
    names = getattr(mod, "__all__", None)
    if names is None:
        continue
    lists[name] = len(names)
    missing += [f"{name}.{n}" for n in names if not hasattr(mod, n)]
print(json.dumps({"lists": lists, "missing": missing, "unimportable": unimportable}))
"""


def _exports() -> dict:
    proc = subprocess.run([sys.executable, "-c", _COUNT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_exported_names_are_few_and_each_one_exists() -> None:
    got = _exports()
    total = sum(got["lists"].values())
    biggest = sorted(got["lists"].items(), key=lambda kv: -kv[1])[:8]
    assert total <= MAX_EXPORTED, f"{total} names in __all__ lists (at most {MAX_EXPORTED}); the largest: {biggest}"
    assert not got["missing"], "names listed in __all__ that the module does not have: " + ", ".join(got["missing"])
    # leaf modules declare no list of their own: their package does
    leaves = [m for m in got["lists"] if m.count(".") >= 1 and not _is_package(m) and m not in REEXPORT_PATHS]
    assert not leaves, f"leaf modules with an __all__ of their own (list the names in the package): {leaves}"


REEXPORT_PATHS: set[str] = set()
"""Leaf modules allowed a list (none today: reference-path shims bind their names instead)."""


def _is_package(module: str) -> bool:
    import importlib.util

    spec = importlib.util.find_spec(module)
    return bool(spec and spec.submodule_search_locations is not None)
