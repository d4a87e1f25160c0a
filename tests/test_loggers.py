"""Metric loggers: console rows, JSONL round trip (NaN/inf included), wandb offline, fan-out."""

from __future__ import annotations

import json
import math
import struct
import time
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ludic_lab.training.loggers import (
    ConsoleLogger,
    JSONLLogger,
    MetricLogger,
    MultiLogger,
    WandbLogger,
    completion_table,
    format_value,
    read_jsonl_metrics,
)
from ludic_lab.types import Rollout, Step


def capture_console() -> tuple[Console, StringIO]:
    buf = StringIO()
    return Console(file=buf, width=160, color_system=None), buf


# -- console ---------------------------------------------------------------------------------
def test_format_value():
    assert format_value(0.5) == "0.5000"
    assert format_value(3) == "3" and format_value(True) == "True"
    assert format_value(1.5e-5) == "1.500e-05" and format_value(123456.0) == "1.235e+05"
    assert format_value(math.nan) == "nan" and format_value(-math.inf) == "-inf"
    assert format_value(0.0) == "0.0000"


def test_console_logger_prints_one_row_per_step_with_the_values():
    console, buf = capture_console()
    lg = ConsoleLogger(["loss", "reward/mean", "lr"], console=console, header_every=100)
    lg.log(1, {"loss": 0.123456, "reward/mean": 0.75, "lr": 1e-5, "ignored": 9.0})
    lg.log(2, {"loss": math.nan, "reward/mean": 0.8})
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    header, rows = lines[0], [ln for ln in lines if ln.split()[0].isdigit()]
    assert header.split() == ["step", "loss", "reward/mean", "lr"]
    assert rows[0].split() == ["1", "0.1235", "0.7500", "1.000e-05"]
    assert rows[1].split() == ["2", "nan", "0.8000", "-"]  # a missing key shows '-'
    assert "ignored" not in buf.getvalue()
    assert sum("step" in ln for ln in lines) == 1  # header once
    # rows line up under the header
    assert rows[0].index("0.1235") + len("0.1235") == rows[1].index("nan") + len("nan")


def test_console_logger_every_and_default_keys():
    console, buf = capture_console()
    lg = ConsoleLogger(console=console, every=2, max_columns=2)
    for step in range(1, 6):
        lg.log(step, {"a": float(step), "b": step * 10, "c": "x"})
    out = buf.getvalue()
    rows = [ln.split() for ln in out.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    assert rows == [["2", "2.0000", "20"], ["4", "4.0000", "40"]]
    assert " c " not in out
    with pytest.raises(ValueError, match="every"):
        ConsoleLogger(console=console, every=0)


def test_console_logger_does_not_interpret_markup_and_prints_completion_tables():
    console, buf = capture_console()
    lg = ConsoleLogger(["note"], console=console)
    lg.log(0, {"note": "[b]x[/b]"})
    r = Rollout(
        steps=(Step(index=0, prev_obs="How many apples?\nAnswer:", action="<answer>[red]7[/red]</answer>",
                    parsed_action="7", next_obs="ok", reward=1.0),),
    )  # fmt: skip
    failed = Rollout(steps=(), error="OSError: gone")
    lg.print(completion_table([r, failed, r], n=2, advantages={(r.id, 0): -0.25}))
    out = buf.getvalue()
    assert "[b]x[/b]" in out
    assert "How many apples? Answer:" in out and "<answer>[red]7[/red]</answer>" in out
    assert "-0.2500" in out and "1.0000" in out and "OSError: gone" in out
    assert out.count("<answer>") == 1  # n=2: the third rollout is not shown
    assert "advantage" in out


def test_completion_table_cuts_long_text():
    r = Rollout(steps=(Step(index=0, prev_obs="p" * 100 + "END", action="a" * 500, parsed_action=None,
                            next_obs=None, reward=0.0),))  # fmt: skip
    console, buf = capture_console()
    console.print(completion_table([r], prompt_chars=20, completion_chars=30))
    out = buf.getvalue()
    assert "END" in out and "a" * 30 not in out and "advantage" not in out


# -- JSONL -----------------------------------------------------------------------------------
def test_jsonl_round_trip_with_nonfinite_values(tmp_path: Path):
    path = tmp_path / "deep" / "dir" / "metrics.jsonl"
    with JSONLLogger(path) as lg:
        lg.log(1, {"loss": 0.5, "reward": math.nan, "ratio_max": math.inf, "ratio_min": -math.inf, "algo": "grpo"})
        lg.log(2, {"loss": 0.25, "skipped": 1, "ok": True})
        # each line is on disk as soon as it is logged
        assert len(path.read_text().splitlines()) == 2
    for line in path.read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    df = read_jsonl_metrics(path)
    assert df["step"].tolist() == [1, 2]
    assert df["loss"].tolist() == [0.5, 0.25]
    assert (
        math.isnan(df.loc[0, "reward"]) and df.loc[0, "ratio_max"] == math.inf and df.loc[0, "ratio_min"] == -math.inf
    )
    assert df.loc[0, "algo"] == "grpo" and math.isnan(df.loc[1, "reward"])  # missing -> NaN
    assert df.loc[1, "skipped"] == 1 and bool(df.loc[1, "ok"]) is True
    assert (df["time"] > 1.6e9).all() and df["time"].is_monotonic_increasing


def test_jsonl_appends_closes_and_rejects_reserved_names(tmp_path: Path):
    path = tmp_path / "m.jsonl"
    lg = JSONLLogger(path)
    lg.log(1, {"x": 1.0})
    with pytest.raises(ValueError, match="reserved"):
        lg.log(2, {"step": 3})
    lg.close()
    lg.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        lg.log(3, {"x": 2.0})
    JSONLLogger(path).log(2, {"x": 2.0})  # default: append
    assert read_jsonl_metrics(path)["x"].tolist() == [1.0, 2.0]
    JSONLLogger(path, append=False).close()
    assert path.read_text() == ""


def test_read_jsonl_metrics_errors(tmp_path: Path):
    with pytest.raises(FileNotFoundError):
        read_jsonl_metrics(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\n{oops\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        read_jsonl_metrics(bad)
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')
    with pytest.warns(UserWarning, match="truncated"):
        assert read_jsonl_metrics(torn)["step"].tolist() == [1]


# -- fan-out -----------------------------------------------------------------------------------
class ListLogger:
    def __init__(self, fail_close: bool = False) -> None:
        self.records: list[tuple[int, dict[str, Any]]] = []
        self.closed = False
        self.fail_close = fail_close

    def log(self, step: int, metrics: Any) -> None:
        self.records.append((step, dict(metrics)))

    def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise OSError("disk full")


def test_multilogger_fans_out_and_closes_all(tmp_path: Path):
    a, b = ListLogger(fail_close=True), ListLogger()
    jl = JSONLLogger(tmp_path / "m.jsonl")
    multi = MultiLogger([a, jl, b])
    assert isinstance(multi, MetricLogger) and isinstance(jl, MetricLogger)
    multi.log(3, {"loss": 1.0})
    assert a.records == b.records == [(3, {"loss": 1.0})]
    with pytest.raises(RuntimeError, match="1 logger"):
        multi.close()
    assert a.closed and b.closed
    assert read_jsonl_metrics(tmp_path / "m.jsonl")["loss"].tolist() == [1.0]
    with pytest.raises(TypeError, match="MetricLogger"):
        MultiLogger([object()])  # type: ignore[list-item]


# -- wandb ---------------------------------------------------------------------------------------
def test_wandb_missing_or_bad_mode_errors(monkeypatch):
    with pytest.raises(ValueError, match="mode"):
        WandbLogger("p", mode="cloud")
    import builtins

    real_import = builtins.__import__

    def no_wandb(name: str, *args: Any, **kw: Any) -> Any:
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ImportError, match="pip install wandb"):
        WandbLogger("p")


def _wandb_records(path: Path) -> Iterator[bytes]:
    """Records of a ``.wandb`` run file (LevelDB-log framing: 32 KiB blocks, 7-byte headers)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a wandb run file"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding up to the block end
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:  # full
            yield chunk
        elif kind == 2:  # first
            pending = chunk
        elif kind == 3:  # middle
            pending += chunk
        elif kind == 4:  # last
            yield pending + chunk
            pending = b""


def _parse(pb: Any, raw: bytes) -> Any:
    rec = pb.Record()
    rec.ParseFromString(raw)
    return rec


def test_wandb_offline_run_holds_the_logged_history(tmp_path: Path, monkeypatch):
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2 as pb

    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    lg = WandbLogger("ludic-test", "run-1", mode="offline", config={"lr": 1e-3}, dir=tmp_path / "wb")
    for step in range(3):
        lg.log(step, {"loss": 1.0 / (step + 1), "reward": math.nan if step == 1 else 0.5 * step})
    run_dir = Path(lg.run_dir)
    lg.close()
    lg.close()  # idempotent
    assert run_dir.name.startswith("offline-run-") and run_dir.parent == tmp_path / "wb" / "wandb"
    (run_file,) = run_dir.glob("run-*.wandb")
    # wandb-core writes the run file asynchronously: finish() can return before the records
    # are on disk, so wait (bounded) for the final "exit" record
    deadline = time.monotonic() + 60
    while True:
        records = [_parse(pb, raw) for raw in _wandb_records(run_file)]
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    history = [
        {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert [h.get("_step") for h in history] == [0, 1, 2], history
    assert [h["loss"] for h in history] == pytest.approx([1.0, 0.5, 1 / 3])
    assert math.isnan(history[1]["reward"]) and history[2]["reward"] == 1.0


def test_wandb_disabled_mode_is_a_no_op(tmp_path: Path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    lg = WandbLogger("p", mode="disabled", dir=tmp_path)
    lg.log(0, {"a": 1.0})
    lg.close()


def test_wandb_mode_follows_wandb_mode_env_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from ludic_lab.training.loggers import resolve_wandb_mode

    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert resolve_wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_wandb_mode() == "disabled"
    assert resolve_wandb_mode("online") == "online"  # an explicit argument wins
    monkeypatch.setenv("WANDB_MODE", "dryrun")  # wandb's alias for offline
    assert resolve_wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "cloud")
    with pytest.raises(ValueError, match="WANDB_MODE must be one of"):
        resolve_wandb_mode()
