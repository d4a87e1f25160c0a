"""`make setup` picks the torch build from the machine (scripts/torch_pip_args.sh): the CPU build
without a CUDA device (the local wheel folder when there is one, else the PyTorch CPU index),
the CUDA build from the default index where `nvidia-smi -L` lists a GPU, `TORCH_BUILD` to
override; the choice is said in one line. A GPU cannot be had here: `nvidia-smi` is a script on
PATH that prints what the real one prints, or fails as it does on a machine without a driver."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "torch_pip_args.sh"


def pick(tmp_path: Path, *, gpu: bool | None, wheels: bool, build: str | None = None) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpu is not None:  # None: no nvidia-smi on PATH at all
        out = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)" if gpu else "NVIDIA-SMI has failed: no driver"
        smi.write_text(f"#!/bin/sh\necho '{out}'\nexit {0 if gpu else 9}\n")
        smi.chmod(0o755)
    wheel_dir = tmp_path / "wheels"
    if wheels:
        wheel_dir.mkdir(exist_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "TORCH_WHEELS_DIR": str(wheel_dir)}
    if build is not None:
        env["TORCH_BUILD"] = build
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("gpu", [None, False])
def test_no_cuda_device_gives_the_cpu_build_from_the_cpu_index(tmp_path: Path, gpu: bool | None) -> None:
    p = pick(tmp_path, gpu=gpu, wheels=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["--index-url", "https://download.pytorch.org/whl/cpu"]
    assert "the CPU build" in p.stderr and "no CUDA device found" in p.stderr


def test_a_local_wheel_folder_serves_the_cpu_build(tmp_path: Path) -> None:
    p = pick(tmp_path, gpu=None, wheels=True)
    assert p.stdout.split() == ["--find-links", str(tmp_path / "wheels")]
    assert "the CPU build, from the wheels in" in p.stderr


def test_a_gpu_gives_the_cuda_build_from_the_default_index(tmp_path: Path) -> None:
    p = pick(tmp_path, gpu=True, wheels=True)  # the local CPU wheel is not used for a GPU
    assert p.returncode == 0 and p.stdout.strip() == ""
    assert "the CUDA build" in p.stderr and "nvidia-smi lists a GPU" in p.stderr


def test_torch_build_overrides_and_a_bad_value_is_refused(tmp_path: Path) -> None:
    assert pick(tmp_path, gpu=True, wheels=False, build="cpu").stdout.split()[0] == "--index-url"
    p = pick(tmp_path, gpu=None, wheels=False, build="cuda")
    assert p.stdout.strip() == "" and "TORCH_BUILD=cuda" in p.stderr
    bad = pick(tmp_path, gpu=None, wheels=False, build="rocm")
    assert bad.returncode == 2 and "TORCH_BUILD must be auto, cpu or cuda" in bad.stderr


def test_make_setup_installs_torch_with_the_scripts_arguments() -> None:
    dry = subprocess.run(
        ["make", "-n", "--always-make", "setup", "VENV=/nonexistent-venv", "TORCH_BUILD=cpu"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ},
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    line = next(x for x in dry.stdout.splitlines() if "torch==2.13.0" in x and "torch_pip_args.sh" in x)
    assert "TORCH_BUILD=cpu bash scripts/torch_pip_args.sh" in line
