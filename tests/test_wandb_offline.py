"""The wandb logger for real, offline: the test extra installs wandb (so CI runs these tests
instead of skipping them), and a Trainer's metrics land in an offline run directory chosen by
``WANDB_MODE=offline`` and ``WANDB_DIR``, read back from the run file wandb wrote."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
from test_loggers import _parse, _wandb_records
from trainer_helpers import ListBatchSource, load_model, random_items

from ludic_lab.rollouts.saw import SAWBatch
from ludic_lab.training.algorithm import make_grpo
from ludic_lab.training.config import TrainerConfig
from ludic_lab.training.loggers import JSONLLogger, WandbLogger, read_jsonl_metrics
from ludic_lab.training.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent


def _extra(name: str, extras: dict[str, list[str]]) -> set[str]:
    """Requirement names of an extra, its ``ludic_lab[...]`` self-references expanded."""
    names: set[str] = set()
    for req in extras[name]:
        base = req.split(";")[0].strip()
        if base.startswith("ludic_lab["):
            for sub in base[len("ludic_lab[") : base.index("]")].split(","):
                names |= _extra(sub.strip(), extras)
        else:
            names.add(
                base.split("[")[0].split("=")[0].split(">")[0].split("<")[0].split("!")[0].split("~")[0].strip().lower()
            )
    return names


def test_the_test_extra_installs_wandb() -> None:
    """`make test` installs `.[test,...]`: wandb must be in it, or the wandb tests skip in CI."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert "wandb" in _extra("test", extras), f"the test extra resolves to {sorted(_extra('test', extras))}"


def _wandb() -> Any:
    """wandb, or a skip outside CI (under CI the test extra installs it: missing is a failure)."""
    if os.environ.get("CI"):
        import wandb  # noqa: F401 - a missing wandb fails the test here

        return sys.modules["wandb"]
    return pytest.importorskip("wandb")


def _read_run(run_file: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(history rows, config)`` of a finished ``run-*.wandb`` file (waits, bounded, for its exit
    record: wandb-core writes the file asynchronously and ``finish()`` may return first)."""
    from wandb.proto import wandb_internal_pb2 as pb

    deadline = time.monotonic() + 60
    while True:
        records = [_parse(pb, raw) for raw in _wandb_records(run_file)]
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert any(r.WhichOneof("record_type") == "exit" for r in records), f"{run_file} never got its exit record"
    history = [
        {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    config = {  # the run record carries the config given to wandb.init; config records update it
        item.key: json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") in ("run", "config")
        for item in (r.run.config.update if r.WhichOneof("record_type") == "run" else r.config.update)
    }
    return history, config


def test_trainer_metrics_land_in_an_offline_run_under_wandb_dir(
    tiny_model_dir: str, tmp_path: Path, monkeypatch
) -> None:
    _wandb()
    wandb_dir = tmp_path / "wandb-dir"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)

    config = TrainerConfig(lr=1e-3, max_seq_len=64)
    # dir= explicitly: wandb reads WANDB_DIR once per process (wandb.setup), so in a full test
    # session an earlier wandb user would otherwise decide where this run goes (seen in CI)
    wb = WandbLogger("ludic-lab-test", "trainer-offline", config={"lr": config.lr, "algo": "grpo"}, dir=wandb_dir)
    run_dir = Path(wb.run_dir)
    jsonl = JSONLLogger(tmp_path / "metrics.jsonl")
    trainer = Trainer(
        load_model(tiny_model_dir), make_grpo(), ListBatchSource([SAWBatch(tuple(random_items(8, vocab_size=2000)))]),
        config=config, loggers=[wb, jsonl],
    )  # fmt: skip
    trainer.train_sync(3, progress=False)
    trainer.close()  # finishes the wandb run

    # a real offline run directory, where WANDB_DIR said
    assert run_dir.parent == wandb_dir / "wandb" and run_dir.name.startswith("offline-run-"), run_dir
    (run_file,) = run_dir.glob("run-*.wandb")
    history, run_config = _read_run(run_file)
    expected = read_jsonl_metrics(tmp_path / "metrics.jsonl")
    assert [h["_step"] for h in history] == expected["step"].tolist() == [1, 2, 3]
    for key in ("loss", "grad_norm", "lr"):
        got, want = [h[key] for h in history], expected[key].tolist()
        assert got == pytest.approx(want, rel=1e-6), f"{key}: wandb {got} vs JSONL {want}"
        assert all(math.isfinite(v) for v in got)
    # every metric the trainer logged reached wandb, not only the ones checked above
    assert set(expected.columns) - {"step", "time"} <= set(history[0]), sorted(set(expected.columns) - set(history[0]))
    # the run's config went into the run file too
    assert run_config.get("algo") == "grpo" and run_config.get("lr") == config.lr, run_config
