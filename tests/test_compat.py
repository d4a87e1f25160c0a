"""Moved module paths keep importing (``ludic_lab.compat``): each old path of ``MOVED`` is the
new module itself, with a ``DeprecationWarning`` naming where to import it from; names not in
the table fail as before, and the hook costs ``import ludic_lab`` no torch."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import ludic_lab  # noqa: F401 - installs the finder
from ludic_lab.compat import MOVED

ROOT = Path(__file__).resolve().parent.parent


def _forget(old: str) -> None:
    """Drop the old path's alias (and its submodules' aliases) so the next import asks the finder."""
    for name in [n for n in sys.modules if n == old or n.startswith(old + ".")]:
        if name in MOVED:
            del sys.modules[name]


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_is_the_new_module_with_a_warning(old: str, new: str) -> None:
    _forget(old)
    with pytest.warns(DeprecationWarning, match=re.escape(f"{old} moved to {new}; import it from there")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new) is sys.modules[old]
    assert module.__name__ == module.__spec__.name == new  # the new module's own spec is kept


def test_the_table_names_only_paths_that_are_gone_and_targets_that_exist() -> None:
    def is_module(name: str) -> bool:
        path = ROOT.joinpath(*name.split("."))
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

    assert not [old for old in MOVED if is_module(old)], "an old path that still has a file would be shadowed"
    assert not [new for new in MOVED.values() if not is_module(new)]
    assert not [new for new in MOVED.values() if new in MOVED], "point at the final module, not another old path"


def test_from_an_old_path_import_a_name() -> None:
    _forget("ludic_lab.training.rollout_engine")
    with pytest.warns(DeprecationWarning):
        from ludic_lab.training.rollout_engine import RolloutEngine
    from ludic_lab.rollouts.engine import RolloutEngine as new

    assert RolloutEngine is new


def test_a_moved_package_s_submodules_load_once() -> None:
    _forget("ludic_lab.training.credit")
    with pytest.warns(DeprecationWarning):
        import ludic_lab.training.credit.returns as old
    import ludic_lab.rollouts.credit.returns as new

    assert old is new


def test_the_former_batch_sources_names_import_from_their_old_path() -> None:
    _forget("ludic_lab.training.batch_sources")
    with pytest.warns(DeprecationWarning, match="ludic_lab.training.batching"):
        from ludic_lab.training.batch_sources import (
            BatchSource,
            DataExhaustedError,
            EmptyBatchError,
            OfflineBatchSource,
            RolloutBatchSource,
            item_stats,
            load_offline_items,
            rollout_stats,
            sft_item_from_messages,
        )
    from ludic_lab.rollouts import batch_source, batch_stats, rollout_source
    from ludic_lab.training.batching import chat_sft, offline_data, offline_source

    assert (BatchSource, DataExhaustedError, EmptyBatchError) == (
        batch_source.BatchSource,
        batch_source.DataExhaustedError,
        batch_source.EmptyBatchError,
    )
    assert (item_stats, rollout_stats) == (batch_stats.item_stats, batch_stats.rollout_stats)
    assert RolloutBatchSource is rollout_source.RolloutBatchSource
    assert OfflineBatchSource is offline_source.OfflineBatchSource
    assert load_offline_items is offline_data.load_offline_items
    assert sft_item_from_messages is chat_sft.sft_item_from_messages


def test_the_warning_points_at_the_import() -> None:
    _forget("ludic_lab.token_html")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import ludic_lab.token_html  # noqa: F401
    (warning,) = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert warning.filename == __file__


def test_unknown_paths_still_fail() -> None:
    assert any(type(f).__name__ == "MovedModuleFinder" for f in sys.meta_path)  # installed by ludic_lab
    for name in ("ludic_lab.nonexistent", "ludic_lab.training.nonexistent", "ludic_lab.inference.weight_transfer.nope"):
        with pytest.raises(ModuleNotFoundError, match=re.escape(repr(name))):
            importlib.import_module(name)


def test_import_ludic_lab_loads_no_torch_and_installs_one_finder() -> None:
    code = (
        "import importlib, sys, ludic_lab; importlib.reload(ludic_lab); "
        "from ludic_lab.compat import MovedModuleFinder; "
        "print(sum(isinstance(f, MovedModuleFinder) for f in sys.meta_path), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "False"]
