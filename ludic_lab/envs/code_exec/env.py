"""``CodeExecEnv``: write a program, run it against the problem's tests in the sandbox.

One problem per episode (``seed % len(data)``, or the next one for ``seed=None``). The
agent's reply goes through a parser (:func:`code_block_parser`: the last fenced block); the
env's async ``env_step`` runs that program against the tests in the shared
:class:`SandboxPool` (results cached across episodes) and rewards it:

* all tests pass -> ``1.0``; otherwise the pass rate with ``partial_credit`` (else ``0.0``);
* a program that does not compile -> ``compile_failure_reward``;
* a program that timed out (and did not pass) -> ``timeout_reward`` when set.

The step's info holds the counts and every test's result. With ``max_attempts > 1`` a
failing attempt is not the end: the observation shows the first failing test (input,
expected, got, error) and the agent tries again, until it passes or runs out of attempts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ludic_lab.envs.code_exec.adapters import TestAdapter, auto_adapter, load_problems
from ludic_lab.envs.code_exec.parsing import code_block_parser
from ludic_lab.envs.code_exec.pool import SandboxPool
from ludic_lab.envs.code_exec.runners import RunConfig, run_tests
from ludic_lab.envs.code_exec.sandbox import SandboxCrashError
from ludic_lab.envs.code_exec.types import BatchTestResult, TestCase
from ludic_lab.envs.single_agent_env import SingleAgentEnv
from ludic_lab.parsers import Parser
from ludic_lab.types import Info, StepOutcome

DEFAULT_CODE_SYSPROMPT = (
    "You are a careful Python programmer. Solve the task with a short, correct Python program. "
    "Reply with the code only, in one fenced block:\n```python\n...\n```"
)


@dataclass(frozen=True)
class CodeExecConfig:
    """Rewards, attempts and how tests run."""

    run: RunConfig = field(default_factory=RunConfig)
    """Per-test timeout, stop_on_first_failure, output matching."""
    partial_credit: bool = True
    """Reward the pass rate (True) or only a full pass (False)."""
    compile_failure_reward: float = -0.1
    """Reward of a program that does not compile."""
    timeout_reward: float | None = None
    """Reward of a program that timed out and did not pass (None: the usual pass-rate reward)."""
    max_attempts: int = 1
    """Attempts per episode; > 1 feeds the failing test back for another try."""
    max_tests: int | None = None
    """Use only the first ``max_tests`` tests of each problem."""
    use_cache: bool = True
    """Reuse the pool's cached result for an identical program and tests."""
    feedback_chars: int = 400
    """Characters of input/expected/got/error shown in the retry feedback."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be an int >= 1, got {self.max_attempts!r}")
        for name in ("compile_failure_reward", "timeout_reward"):
            v = getattr(self, name)
            if v is not None and not math.isfinite(v):
                raise ValueError(f"{name} must be a finite number, got {v!r}")
        if self.max_tests is not None and self.max_tests < 1:
            raise ValueError(f"max_tests must be >= 1 or None, got {self.max_tests}")


class CodeExecEnv(SingleAgentEnv):
    """Programming problems from ``data`` (a JSONL path, list of rows or ``datasets.Dataset``
    in APPS or MBPP format), judged in ``pool``. ``adapter`` defaults to the row's format."""

    def __init__(
        self,
        data: Any,
        *,
        pool: SandboxPool,
        adapter: TestAdapter | None = None,
        config: CodeExecConfig | None = None,
        system_prompt: str | None = DEFAULT_CODE_SYSPROMPT,
    ) -> None:
        super().__init__()
        if not isinstance(pool, SandboxPool):
            raise TypeError(
                f"pool must be a SandboxPool (started once and shared by the envs), got {type(pool).__name__}"
            )
        self.pool = pool
        self.config = config or CodeExecConfig()
        self._data = load_problems(data)
        if len(self._data) == 0:
            raise ValueError("CodeExecEnv: no problems; pass at least one row")
        self._adapter = adapter
        self._system_prompt = system_prompt
        self._cursor = 0
        self._index: int | None = None
        self._tests: list[TestCase] = []
        self._prompt = ""
        self._obs = ""
        self._attempt = 0

    def __len__(self) -> int:
        return len(self._data)

    def adapter_for(self, row: Any) -> TestAdapter:
        return self._adapter if self._adapter is not None else auto_adapter(row)

    @property
    def suggested_sysprompt(self) -> str | None:  # type: ignore[override]  # a property, as on SingleAgentEnv
        return self._system_prompt

    @classmethod
    def recommended_parser(cls, *, allow_bare: bool = True, error_reward: float = -0.1) -> Parser:
        """The parser the default system prompt asks for: the last fenced code block."""
        return code_block_parser(allow_bare=allow_bare, error_reward=error_reward)

    @property
    def tests(self) -> list[TestCase]:
        """The current problem's tests."""
        return list(self._tests)

    async def env_reset(self, *, seed: int | None = None) -> tuple[str, Info]:
        n = len(self._data)
        index = (int(seed) % n) if seed is not None else self._cursor % n
        if seed is None:
            self._cursor = index + 1
        row = self._data[index]
        adapter = self.adapter_for(row)
        tests = adapter.tests(row)
        if not tests:
            raise ValueError(f"problem {adapter.problem_id(row, index)} has no tests; drop it from the data")
        self._tests = tests[: self.config.max_tests] if self.config.max_tests else tests
        self._index, self._attempt = index, 0
        self._problem_id = adapter.problem_id(row, index)
        self._prompt = self._obs = adapter.prompt(row)
        return self._obs, {"index": index, "problem_id": self._problem_id, "num_tests": len(self._tests)}

    def reward(self, result: BatchTestResult) -> float:
        """The reward of one attempt's results (see the module docstring)."""
        cfg = self.config
        if not result.compiled:
            return float(cfg.compile_failure_reward)
        if result.all_passed:
            return 1.0
        if result.timed_out and cfg.timeout_reward is not None:
            return float(cfg.timeout_reward)
        return result.pass_rate if cfg.partial_credit else 0.0

    async def env_step(self, action: str) -> StepOutcome:
        if self._index is None:
            raise RuntimeError("CodeExecEnv.env_step called before env_reset(); reset the env first")
        self._attempt += 1
        result = await run_tests(self.pool, action, self._tests, self.config.run, use_cache=self.config.use_cache)
        if any(r.status == "sandbox_error" for r in result.results):
            # the sandbox failed, not the program: no reward can be given (a 0 would teach the model)
            ex = result.execution
            detail = (ex.stderr.strip()[-300:] if ex is not None else "") or "no output"
            raise SandboxCrashError(
                f"the sandbox failed while testing problem {self._problem_id} (attempt {self._attempt}): {detail}; "
                "the episode is recorded as failed (failure_cause 'sandbox_error'), not scored. Check the pool "
                "(SandboxPool.stats(), scripts/install_system_deps.sh) if this repeats"
            )
        reward = self.reward(result)
        done = result.all_passed or self._attempt >= self.config.max_attempts
        self._obs = self.feedback(result, retry=not done)
        info: Info = {
            "problem_id": self._problem_id,
            "index": self._index,
            "attempt": self._attempt,
            "passed": result.passed_count,
            "total": result.total_count,
            "pass_rate": result.pass_rate,
            "all_passed": result.all_passed,
            "compile_failed": not result.compiled,
            "timed_out": result.timed_out,
            "cache_hit": result.cached,
            "exec_wall_s": round(result.wall_s, 4),
            "test_results": [r.to_dict() for r in result.results],
        }
        if result.compile_error:
            info["compile_error"] = result.compile_error[:500]
        return StepOutcome(obs=self._obs, reward=reward, truncated=False, terminated=done, info=info)

    def feedback(self, result: BatchTestResult, *, retry: bool) -> str:
        """What the agent reads after an attempt: pass, or the first failure and what to do."""
        if result.all_passed:
            return f"All {result.total_count} tests passed."
        keep = self.config.feedback_chars
        head = f"{result.passed_count}/{result.total_count} tests passed."
        if not result.compiled:
            head = f"The program does not compile: {(result.compile_error or '')[:keep]}"
        elif (fail := result.first_failure) is not None:
            test = next((t for t in self._tests if t.id == fail.id), None)
            what = {
                "wrong_answer": "gave a wrong answer",
                "timeout": "ran out of time",
                "runtime_error": "raised an error",
                "memory_limit": "ran out of memory",
                "output_limit": "printed too much",
            }.get(fail.status, fail.status)
            lines = [head, f"Test {fail.id} {what}."]
            if test is not None and test.kind != "assert":
                lines.append(f"Input: {test.input[:keep]!r}")
                lines.append(f"Expected: {(fail.expected or '')[:keep]}")
                lines.append(f"Got: {(fail.actual or '')[:keep]}")
            elif test is not None:
                lines.append(f"Check: {test.input[:keep]}")
            if fail.stderr.strip():
                lines.append(f"Error: {fail.stderr.strip()[-keep:]}")
            head = "\n".join(lines)
        return head + ("\nFix the program and reply with the whole corrected code." if retry else "")

    def env_current_obs(self) -> str:
        return self._obs
