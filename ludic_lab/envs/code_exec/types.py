"""Data of code execution: what one sandboxed run returned, tests, and per-test results.

All frozen dataclasses with JSON-able fields, so results travel in ``StepOutcome.info`` and
through the result cache unchanged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

StopReason = Literal[
    "exited",  # the program ended by itself (any exit status)
    "timeout",  # wall-clock limit: the whole process tree was killed
    "cpu_limit",  # RLIMIT_CPU
    "memory_limit",  # RLIMIT_AS (MemoryError or a failed allocation)
    "output_limit",  # stdout grew past the cap: killed, stdout truncated
    "file_size_limit",  # RLIMIT_FSIZE
    "stopped",  # the caller stopped it early (e.g. stop_on_first_failure)
    "sandbox_error",  # the sandbox itself failed (not the program's fault)
]


@dataclass(frozen=True)
class ExecutionResult:
    """One execution in a sandbox: outputs, exit, resources and why it stopped."""

    stdout: str
    """Standard output (UTF-8, invalid bytes replaced), at most the sandbox's cap."""
    stderr: str
    """Standard error, the *last* bytes up to the cap (tracebacks end there)."""
    exit_code: int | None
    """Exit status, or ``None`` when a signal ended the process."""
    signal: int | None
    """The signal that ended the process, or ``None``."""
    wall_s: float
    """Wall-clock seconds from start to the end of the process tree."""
    cpu_s: float
    """User + system CPU seconds of the process tree (reaped processes)."""
    peak_memory_bytes: int
    """Largest resident set of any process in the tree."""
    stop_reason: StopReason
    """Why it stopped; ``"exited"`` when it ended by itself."""
    stdout_truncated: bool = False
    """stdout passed the cap (the process was then killed: ``stop_reason="output_limit"``)."""
    stderr_truncated: bool = False
    """stderr passed its cap (only its tail is kept)."""

    @property
    def ok(self) -> bool:
        """Exited by itself with status 0."""
        return self.stop_reason == "exited" and self.exit_code == 0

    @property
    def timed_out(self) -> bool:
        """Stopped by the wall-clock or CPU limit."""
        return self.stop_reason in ("timeout", "cpu_limit")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TestCase:
    """One test: stdin -> expected stdout (``kind="stdio"``, APPS), a call expression whose
    value must equal ``expected`` (``kind="call"``, e.g. ``"add(1, 2)"``, MBPP), or an
    assert statement that must not raise (``kind="assert"``, the fallback for MBPP asserts
    whose expected side is not a literal)."""

    __test__ = False  # not a pytest class

    kind: Literal["stdio", "call", "assert"]
    input: str
    """stdin text (stdio), the call expression (call) or the assert statement (assert)."""
    expected: Any = None
    """Expected stdout (stdio) or value (call, plain data); unused for assert."""
    id: str = ""

    def __post_init__(self) -> None:
        if self.kind not in ("stdio", "call", "assert"):
            raise ValueError(f"TestCase.kind must be 'stdio', 'call' or 'assert', got {self.kind!r}")
        if not isinstance(self.input, str):
            raise TypeError(
                f"TestCase.input must be a str (stdin, call expression or assert), got {type(self.input).__name__}"
            )

    def sandbox_view(self) -> dict[str, str]:
        """What enters the sandbox: the input only, never the expected output."""
        key = {"stdio": "stdin", "call": "call", "assert": "assert"}[self.kind]
        return {"kind": self.kind, key: self.input}


def hash_code(code: str) -> str:
    """SHA-256 of the program text (the cache's first key)."""
    return hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()


def hash_tests(tests: Sequence[TestCase], **settings: Any) -> str:
    """SHA-256 of the tests *and* the settings that change results (timeouts, matching)."""
    from ludic_lab.envs.code_exec.harness import canonical

    def stable(value: Any) -> Any:
        try:
            return canonical(value)
        except TypeError:
            return repr(value)

    blob = json.dumps(
        {"tests": [[t.kind, t.input, stable(t.expected)] for t in tests], "settings": settings},
        sort_keys=True,
        default=repr,
    )
    return hashlib.sha256(blob.encode("utf-8", "surrogatepass")).hexdigest()


TestStatus = Literal[
    "passed",
    "wrong_answer",
    "runtime_error",
    "timeout",
    "memory_limit",
    "output_limit",
    "compile_error",
    "not_run",
    "sandbox_error",
]


@dataclass(frozen=True)
class TestResult:
    """The outcome of one test."""

    __test__ = False

    id: str
    status: TestStatus
    passed: bool
    actual: str | None = None
    """What the program printed (stdio) or returned (call, as JSON), truncated."""
    expected: str | None = None
    """The expected output, as text, truncated (for feedback and tables)."""
    stderr: str = ""
    """The tail of stderr (the traceback, if any)."""
    wall_s: float = 0.0
    cpu_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BatchTestResult:
    """All tests of one program: per-test results, counts, and how the run ended."""

    results: tuple[TestResult, ...]
    compiled: bool = True
    compile_error: str | None = None
    timed_out: bool = False
    """Some test hit the per-test or the whole run's time limit."""
    wall_s: float = 0.0
    """Wall-clock time of the sandboxed run (0 for a cache hit)."""
    cached: bool = False
    execution: ExecutionResult | None = field(default=None, compare=False)
    """The sandbox run (stdout holds the harness's records, not the program's output)."""

    @property
    def passed_count(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def total_count(self) -> int:
        return len(self.results)

    @property
    def all_passed(self) -> bool:
        return self.total_count > 0 and self.passed_count == self.total_count

    @property
    def pass_rate(self) -> float:
        return self.passed_count / self.total_count if self.results else 0.0

    @property
    def first_failure(self) -> TestResult | None:
        return next((r for r in self.results if not r.passed and r.status != "not_run"), None)
