"""Run a repository's tests in each of several folders; print each test's outcome as JSON.

``python runner.py FOLDER [FOLDER ...]`` (run as a script, by path: it imports nothing of
ludic_lab, so it works from any working directory). pytest's plugins are not auto-loaded, so
what runs is the repository's own tests and pytest; each folder's run happens in a forked child
of this process (pytest is imported once), stopped after ``--cpu-seconds`` of CPU or
``--timeout`` seconds. The output is one JSON list with, per folder: ``outcomes`` (node id ->
``"passed"``, ``"failed"`` or ``"skipped"``), ``symptoms`` (failed node id -> what went wrong,
as a bug report would say it: ``sentence`` and the ``setup`` it needs), ``errors`` (collection
errors) and ``timeout``.

A symptom is read from the failing statement of the test: ``assert f(x) == y`` that fails is
re-run to capture both sides (``"`f(x)` returns `1`, expected `2`."``), an exception is named
with the call that raised it, ``pytest.raises`` that saw nothing says so. Local variables of
the test with literal values are written in as literals; when others are needed, the test's
earlier statements come first as the set-up.
"""

from __future__ import annotations

import argparse
import ast
import copy as copy_module
import json
import operator
import os
import resource
import signal
import sys
import tempfile
import textwrap
import time
from typing import Any

MAX_REPR = 120
# no report on the terminal, no plugins the outcomes do not need: half the time of a plain run
PYTEST_ARGS = ["-q", "--tb=no", "-p", "no:cacheprovider"] + [
    arg
    for name in ("unraisableexception", "threadexception", "faulthandler", "logging", "warnings", "doctest", "junitxml")
    for arg in ("-p", f"no:{name}")
]
_OPS: dict[type, Any] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}

_OPS_BY_NAME = {op.__name__: fn for op, fn in _OPS.items()}


class _Captured(Exception):
    """The operands of a failing assert, raised in its place by the re-run."""

    def __init__(self, values: tuple[Any, ...]) -> None:
        self.values = values


def _check_compare(op: str, left: Any, right: Any) -> None:
    if not _OPS_BY_NAME[op](left, right):
        raise _Captured((left, right))


def _check_truth(negated: bool, value: Any) -> None:
    if bool(value) == negated:
        raise _Captured((value,))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_REPR else text[: MAX_REPR - 3] + "..."


def _literal(value: Any) -> ast.expr | None:
    text = repr(value)
    if len(text) > 80:
        return None
    try:
        if ast.literal_eval(text) != value:
            return None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return ast.parse(text, mode="eval").body


def _expr_text(node: ast.expr, source: str, local: dict[str, Any]) -> tuple[str, bool]:
    """The source of ``node`` with the test's literal locals written in; whether other locals remain."""
    names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in local}
    subst = {name: lit for name in names if (lit := _literal(local[name])) is not None}
    needs_setup = bool(names - set(subst))
    if not subst:
        return ast.get_source_segment(source, node) or ast.unparse(node), needs_setup

    class Sub(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.AST:
            return subst.get(n.id, n)

    return ast.unparse(Sub().visit(ast.parse(ast.unparse(node), mode="eval")).body), needs_setup


def _innermost(fn: ast.FunctionDef, line: int) -> tuple[ast.stmt | None, ast.stmt | None]:
    """The innermost statement of ``fn`` holding ``line``, and the top-level one around it."""
    top = next((s for s in fn.body if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
    best = top
    if top is not None:
        for node in ast.walk(top):
            if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or node.lineno):
                best = node
    return best, top


def _rerun(item: Any, fn: ast.FunctionDef, stmt: ast.Assert) -> tuple[Any, ...] | None:
    """Run the test again with the failing assert replaced by a capture of its operands."""
    test = stmt.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = type(test.ops[0]).__name__, ast.unparse(test.left), ast.unparse(test.comparators[0])
        call = f"__bugfix_cmp__({op!r}, {left}, {right})"
    else:
        negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        inner = test.operand if isinstance(test, ast.UnaryOp) and negated else test
        call = f"__bugfix_truth__({negated}, {ast.unparse(inner)})"

    replacement = ast.parse(call).body[0]
    for node in ast.walk(replacement):  # the failing line's position, so a traceback points there
        if isinstance(node, ast.expr | ast.stmt):
            node.lineno = node.end_lineno = stmt.lineno
            node.col_offset = node.end_col_offset = stmt.col_offset

    class Swap(ast.NodeTransformer):
        def visit_Assert(self, n: ast.Assert) -> ast.AST:
            return replacement if (n.lineno, n.col_offset) == (stmt.lineno, stmt.col_offset) else n

    copy = Swap().visit(copy_module.deepcopy(fn))
    copy.decorator_list = []
    copy.name = "__bugfix_rerun__"
    namespace = dict(item.module.__dict__, __bugfix_cmp__=_check_compare, __bugfix_truth__=_check_truth)
    exec(compile(ast.Module([copy], []), str(item.path), "exec"), namespace)
    params = [a.arg for a in fn.args.args]
    try:
        namespace["__bugfix_rerun__"](**{p: item.funcargs[p] for p in params})
    except _Captured as c:
        return c.values
    except Exception:  # noqa: BLE001  (any other outcome: no capture, the caller falls back)
        return None
    return None


def describe(item: Any, excinfo: Any) -> dict[str, str]:
    """How ``item`` failed: ``sentence`` (from its failing statement, see the module doc) and
    ``setup`` (the test's statements before it, when the sentence needs them; else empty)."""
    exc, etype = excinfo.value, excinfo.type.__name__
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    fallback = {
        "setup": "",
        "sentence": f"`{item.name}` fails with {etype}" + (f": {message}" if message else "") + ".",
    }
    path = str(item.path)
    frame, line, tb = None, 0, excinfo.tb
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == path:
            frame, line = tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
    with open(path, encoding="utf-8") as f:
        source = f.read()
    fn = next(
        (n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == item.originalname), None
    )
    if frame is None or fn is None or frame.f_code.co_name != fn.name:
        return fallback
    stmt, top = _innermost(fn, line)
    if stmt is None or top is None:
        return fallback
    local = {k: v for k, v in frame.f_locals.items() if not k.startswith("@")}
    if isinstance(stmt, ast.With) and "DID NOT RAISE" in message and stmt.body:
        body = stmt.body[0]
        expr = body.value if isinstance(body, ast.Expr) else body
        text, setup = _expr_text(expr, source, local) if isinstance(expr, ast.expr) else (ast.unparse(expr), True)
        expected = message.split("DID NOT RAISE", 1)[1].strip()
        expected = expected.removeprefix("<class '").removesuffix("'>").rsplit(".", 1)[-1]
        sentence = f"`{text}` does not raise {expected}."
    elif isinstance(stmt, ast.Assert) and isinstance(exc, AssertionError):
        values = _rerun(item, fn, stmt)
        test = stmt.test
        if values is None:
            return fallback
        if isinstance(test, ast.Compare) and len(values) == 2:
            left, setup = _expr_text(test.left, source, local)
            verb = "returns" if isinstance(test.left, ast.Call) else "is"
            if isinstance(test.ops[0], ast.Eq | ast.Is):
                sentence = f"`{left}` {verb} `{_short(values[0])}`, expected `{_short(values[1])}`."
            else:
                whole, _ = _expr_text(test, source, local)
                sentence = f"`{whole}` does not hold: `{left}` {verb} `{_short(values[0])}`."
        else:
            whole, setup = _expr_text(test, source, local)
            sentence = f"`{whole}` does not hold (the value is `{_short(values[0])}`)."
    else:
        target = stmt.test if isinstance(stmt, ast.Assert) else stmt
        if isinstance(target, ast.Compare):
            target = target.left
        if isinstance(target, ast.Expr | ast.Assign):
            target = target.value
        text, setup = _expr_text(target, source, local) if isinstance(target, ast.expr) else (ast.unparse(target), True)
        sentence = f"`{text}` raises {etype}" + (f": {message}" if message else "") + "."
    setup_text = ""
    if setup:
        before = [
            ast.get_source_segment(source, s, padded=True) or ast.unparse(s) for s in fn.body[: fn.body.index(top)]
        ]
        setup_text = "\n".join(textwrap.dedent(b) for b in before)
    return {"setup": setup_text, "sentence": sentence}


class Recorder:
    """A pytest plugin that keeps each test's outcome and, for failures, its symptom."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}
        self.symptoms: dict[str, dict[str, str]] = {}
        self.errors: list[str] = []

    def pytest_runtest_makereport(self, item: Any, call: Any) -> None:
        excinfo = call.excinfo
        if excinfo is None or type(excinfo.value).__name__ == "Skipped" or item.nodeid in self.symptoms:
            return  # None: pytest's own hook makes the report
        try:
            self.symptoms[item.nodeid] = describe(item, excinfo)
        except Exception as e:  # noqa: BLE001  (a symptom is a nicety; the outcome still counts)
            sentence = f"`{item.name}` fails ({type(e).__name__} while describing it)."
            self.symptoms[item.nodeid] = {"setup": "", "sentence": sentence}

    def pytest_runtest_logreport(self, report: Any) -> None:
        previous = self.outcomes.get(report.nodeid, "passed")
        if report.failed:
            self.outcomes[report.nodeid] = "failed"
        elif report.skipped and previous != "failed":
            self.outcomes[report.nodeid] = "skipped"
        elif report.nodeid not in self.outcomes:
            self.outcomes[report.nodeid] = "passed"

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.errors.append(f"{report.nodeid}: {str(report.longrepr)[-500:]}")


def _child(folder: str, out_path: str) -> None:
    os.chdir(folder)
    sys.path.insert(0, folder)
    sys.dont_write_bytecode = True  # leave the folder as it was (no __pycache__)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    import pytest

    rec = Recorder()
    pytest.main([*PYTEST_ARGS, "tests"], plugins=[rec])
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump({"outcomes": rec.outcomes, "symptoms": rec.symptoms, "errors": rec.errors}, f)


def run_folder(folder: str, cpu_seconds: float, timeout: float) -> dict[str, Any]:
    """The tests of ``folder`` run in a forked child; its outcomes, symptoms and errors.

    The child may use ``cpu_seconds`` of CPU (a limit that does not depend on how busy the
    machine is, so a mutant that loops is dropped the same way everywhere) and ``timeout``
    seconds of wall time (for one that sleeps)."""
    sys.stdout.flush()
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "result.json")
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the caller's code
            code = 0
            try:
                limit = max(1, round(cpu_seconds))
                resource.setrlimit(resource.RLIMIT_CPU, (limit, limit + 1))
                _child(folder, out_path)
            except BaseException:  # noqa: BLE001  (whatever happened, the child must exit here)
                code = 1
            os._exit(code)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() - t0 > timeout:
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.005)
        empty: dict[str, Any] = {"folder": folder, "outcomes": {}, "symptoms": {}, "errors": []}
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) in (signal.SIGXCPU, signal.SIGKILL):
            return {**empty, "timeout": True}
        if not os.path.exists(out_path):
            return {**empty, "errors": [f"the run ended without a result (status {status})"], "timeout": False}
        with open(out_path, encoding="utf-8") as f:
            result = json.load(f)
    return {"folder": folder, **result, "timeout": False}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--cpu-seconds", type=float, default=3.0, help="CPU seconds per folder's run")
    parser.add_argument("--timeout", type=float, default=60.0, help="wall seconds per folder's run")
    args = parser.parse_args(argv)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the repository's tests and pytest, nothing else
    import pytest  # noqa: F401  (imported once here, before the children fork)

    results = [run_folder(os.path.abspath(f), args.cpu_seconds, args.timeout) for f in args.folders]
    sys.stdout.write(json.dumps(results))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
