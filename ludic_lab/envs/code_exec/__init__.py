"""Code execution: run model-written Python in a sandbox and reward it by its tests.

Layers, bottom to top: :class:`Sandbox` (protocol) with the :class:`BubblewrapSandbox`
backend (and :class:`UnsafeLocalSandbox` for trusted code, only by name); the
:class:`SandboxPool` (bounded concurrency, result cache, clean shutdown); runners
(:func:`run_tests`: stdin/stdout and function-call tests batched in one interpreter); and
the env (:class:`CodeExecEnv`). See docs/code_exec.md.
"""

from ludic_lab.envs.code_exec.adapters import (
    APPSAdapter,
    MBPPAdapter,
    TestAdapter,
    assert_to_test as assert_to_test,
    auto_adapter as auto_adapter,
    load_problems,
    shipped_problems as shipped_problems,
)
from ludic_lab.envs.code_exec.bwrap import BubblewrapSandbox, find_bwrap as find_bwrap
from ludic_lab.envs.code_exec.cache import ResultCache as ResultCache
from ludic_lab.envs.code_exec.env import DEFAULT_CODE_SYSPROMPT as DEFAULT_CODE_SYSPROMPT, CodeExecConfig, CodeExecEnv
from ludic_lab.envs.code_exec.local import UnsafeLocalSandbox
from ludic_lab.envs.code_exec.parsing import code_block_parser, extract_code as extract_code
from ludic_lab.envs.code_exec.pool import SandboxPool
from ludic_lab.envs.code_exec.runners import RunConfig as RunConfig, outputs_match as outputs_match, run_tests
from ludic_lab.envs.code_exec.sandbox import (
    Interpreter as Interpreter,
    Sandbox,
    SandboxCrashError,
    SandboxLimits,
    SandboxUnavailableError,
)
from ludic_lab.envs.code_exec.tool import run_python_tool
from ludic_lab.envs.code_exec.types import (
    BatchTestResult as BatchTestResult,
    ExecutionResult as ExecutionResult,
    TestCase,
    TestResult as TestResult,
)

__all__ = [
    "CodeExecEnv",
    "CodeExecConfig",
    "Sandbox",
    "BubblewrapSandbox",
    "UnsafeLocalSandbox",
    "SandboxPool",
    "SandboxLimits",
    "SandboxUnavailableError",
    "SandboxCrashError",
    "TestCase",
    "TestAdapter",
    "APPSAdapter",
    "MBPPAdapter",
    "run_tests",
    "run_python_tool",
    "load_problems",
    "code_block_parser",
]
