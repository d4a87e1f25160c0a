"""Runners: a program against its tests, in one sandboxed interpreter per program.

:func:`run_tests` sends the test *inputs* (never the expected outputs) to the harness, which
compiles the program once and runs each test in a forked child (~5 ms a test instead of a
fresh interpreter). Records stream back one per test; the comparison happens here, in the
parent, and with ``stop_on_first_failure`` the sandbox is stopped at the first failure.
Results are cached by (hash of code, hash of tests + settings) in the pool's
:class:`~ludic_lab.envs.code_exec.cache.ResultCache`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from ludic_lab.envs.code_exec.harness import canonical
from ludic_lab.envs.code_exec.pool import SandboxPool
from ludic_lab.envs.code_exec.types import BatchTestResult, TestCase, TestResult, TestStatus, hash_code, hash_tests

Match = Literal["exact", "lines", "tokens"]

_STATUS = {
    "ok": "passed",
    "error": "runtime_error",
    "timeout": "timeout",
    "cpu_limit": "timeout",
    "memory": "memory_limit",
    "output_limit": "output_limit",
    "file_size_limit": "runtime_error",
}


@dataclass(frozen=True)
class RunConfig:
    """How tests run and are judged (all of it is part of the cache key)."""

    per_test_timeout_s: float = 2.0
    """Wall-clock (and CPU) limit of each test."""
    stop_on_first_failure: bool = False
    """Stop at the first failing test; the rest are ``not_run`` (and count as failed)."""
    stop_after_timeout: bool = True
    """Stop at the first test that times out (a program that loops once usually loops again;
    this bounds a run to about one per-test timeout)."""
    match: Match = "lines"
    """stdio comparison: ``exact``; ``lines`` (trailing spaces and blank lines ignored);
    ``tokens`` (whitespace-separated, numbers equal within ``float_tolerance``)."""
    float_tolerance: float = 1e-6
    """Relative/absolute tolerance for floats (call values, and tokens)."""
    max_output_bytes: int = 64 * 2**10
    """Output a test may print (or return, as JSON) before it is stopped."""
    keep_chars: int = 300
    """Characters of actual/expected/stderr kept in each :class:`TestResult`."""

    def __post_init__(self) -> None:
        if not (self.per_test_timeout_s > 0 and math.isfinite(self.per_test_timeout_s)):
            raise ValueError(
                f"per_test_timeout_s must be a positive number of seconds, got {self.per_test_timeout_s!r}"
            )
        if self.match not in ("exact", "lines", "tokens"):
            raise ValueError(f"match must be 'exact', 'lines' or 'tokens', got {self.match!r}")
        if self.max_output_bytes <= 0:
            raise ValueError(f"max_output_bytes must be > 0, got {self.max_output_bytes}")

    def total_timeout_s(self, n_tests: int) -> float:
        """The whole run's limit: every test's limit plus one second for the interpreter."""
        return self.per_test_timeout_s * max(1, n_tests) + 1.0


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _close(a: Any, b: Any, tol: float) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or math.isclose(a, b, rel_tol=tol, abs_tol=tol)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], tol) for k in a)
    return a == b


def _token_equal(a: str, b: str, tol: float) -> bool:
    if a == b:
        return True
    try:
        return math.isclose(float(a), float(b), rel_tol=tol, abs_tol=tol)
    except ValueError:
        return False


def outputs_match(actual: str, expected: str, match: Match = "lines", tol: float = 1e-6) -> bool:
    """Whether a stdio test's output is right under the ``match`` rule."""
    if match == "exact":
        return actual == expected
    if match == "lines":
        return _lines(actual) == _lines(expected)
    a, b = actual.split(), expected.split()
    return len(a) == len(b) and all(_token_equal(x, y, tol) for x, y in zip(a, b, strict=True))


def judge(test: TestCase, record: dict, config: RunConfig) -> TestResult:
    """One harness record (what the sandbox saw) -> a :class:`TestResult` (compared here)."""
    keep = config.keep_chars
    status: TestStatus = _STATUS.get(record.get("status", ""), "runtime_error")  # type: ignore[assignment]
    actual: str | None = record.get("stdout", "")
    expected = (
        None if test.kind == "assert" else (test.expected if isinstance(test.expected, str) else repr(test.expected))
    )
    if status == "passed":
        if test.kind == "stdio":
            ok = outputs_match(record.get("stdout", ""), str(test.expected), config.match, config.float_tolerance)
        elif test.kind == "call":
            actual = record.get("value")
            try:
                ok = _close(json.loads(actual or "null"), canonical(test.expected), config.float_tolerance)
            except (ValueError, TypeError):
                ok = False
        else:
            ok = True
        status = "passed" if ok else "wrong_answer"
    return TestResult(
        id=test.id,
        status=status,
        passed=status == "passed",
        actual=(actual or "")[:keep],
        expected=None if expected is None else expected[:keep],
        stderr=record.get("stderr", "")[-keep:],
        wall_s=float(record.get("wall_s", 0.0)),
        cpu_s=float(record.get("cpu_s", 0.0)),
    )


def tests_key(tests: Sequence[TestCase], config: RunConfig) -> str:
    """Cache key of the tests under these settings."""
    return hash_tests(tests, **{k: v for k, v in asdict(config).items() if k != "keep_chars"})


async def run_tests(
    pool: SandboxPool,
    code: str,
    tests: Sequence[TestCase],
    config: RunConfig | None = None,
    *,
    use_cache: bool = True,
) -> BatchTestResult:
    """Run ``code`` against ``tests`` in one sandbox; a cache hit returns at once (``cached=True``)."""
    config = config or RunConfig()
    tests = list(tests)
    code_hash, t_hash = hash_code(code), tests_key(tests, config)
    if use_cache:
        hit = pool.cache.get(code_hash, t_hash)
        if hit is not None:
            return replace(hit, cached=True, wall_s=0.0)
    compile_rec: dict = {}
    results: list[TestResult] = []

    def on_line(line: bytes) -> bool:
        try:
            rec = json.loads(line.decode("utf-8", "replace"))
        except ValueError:
            return False
        if rec.get("type") == "compile":
            compile_rec.update(rec)
        elif rec.get("type") == "test" and len(results) < len(tests):
            res = judge(tests[len(results)], rec, config)
            results.append(res)
            return (config.stop_on_first_failure and not res.passed) or (
                config.stop_after_timeout and res.status == "timeout"
            )
        return False

    t0 = time.monotonic()
    async with pool.sandbox() as sb:
        ex = await sb.run_harness(
            code,
            [t.sandbox_view() for t in tests],
            timeout_s=config.total_timeout_s(len(tests)),
            per_test_timeout_s=config.per_test_timeout_s,
            max_output_bytes=config.max_output_bytes,
            on_line=on_line,
        )
    compiled = bool(compile_rec.get("ok", True)) if compile_rec else ex.stop_reason != "sandbox_error"
    missing: TestStatus  # what the first test without a record gets (the rest: not_run)
    if compile_rec and not compile_rec.get("ok"):
        missing = "compile_error"
    elif ex.stop_reason == "stopped":
        missing = "not_run"
    elif ex.stop_reason in ("timeout", "cpu_limit"):
        missing = "timeout"
    elif ex.stop_reason == "sandbox_error" or not compile_rec:
        missing = "sandbox_error"  # the sandbox did not start: not the program's fault
    else:
        missing = "runtime_error"  # the harness died under the program (it killed it, or a limit did)
    done = list(results)
    for i, t in enumerate(tests[len(done) :]):
        status: TestStatus = missing if (i == 0 or missing in ("compile_error", "sandbox_error")) else "not_run"
        done.append(
            TestResult(
                id=t.id,
                status=status,
                passed=False,
                stderr=compile_rec.get("error", "") if missing == "compile_error" else "",
            )
        )
    result = BatchTestResult(
        results=tuple(done),
        compiled=compiled,
        compile_error=compile_rec.get("error") if not compiled else None,
        timed_out=any(r.status == "timeout" for r in done),
        wall_s=time.monotonic() - t0,
        execution=ex,
    )
    # neither a sandbox failure nor a timeout (which a loaded machine can cause) is cached
    if use_cache and not any(r.status in ("sandbox_error", "timeout") for r in done):
        pool.cache.put(code_hash, t_hash, result)
    return result
