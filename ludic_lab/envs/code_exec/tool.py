"""``run_python_tool``: a ``ToolAgent`` tool that runs the model's Python in the sandbox pool.

    agent = ToolAgent(client, FullDialog(), parser, tools=[run_python_tool(pool)])

The tool is an ``async def`` with a Google-style docstring (its JSON schema comes from it);
every call is one :meth:`SandboxPool.execute`, so the same isolation, limits and timeout
apply as for graded programs. What the model reads back is the program's stdout, and, when
it failed, why (the stderr tail, a timeout, a limit) — never an unsandboxed fallback. A
failure of the sandbox itself raises :class:`SandboxCrashError`, which fails the episode
(``failure_cause`` ``sandbox_error``) instead of being shown to the model.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ludic_lab.envs.code_exec.pool import SandboxPool
from ludic_lab.envs.code_exec.sandbox import SandboxCrashError


def run_python_tool(
    pool: SandboxPool, *, timeout_s: float = 5.0, max_chars: int = 2000
) -> Callable[[str], Awaitable[str]]:
    """A ``run_python(code)`` tool bound to ``pool`` (started by the caller, shared by episodes)."""

    async def run_python(code: str) -> str:
        """Run a Python program in an isolated sandbox and return what it printed.

        Args:
            code: The complete Python program to run; print the values you want to see.
        """
        result = await pool.execute(code, timeout_s=timeout_s)
        if result.stop_reason == "sandbox_error":  # not the model's doing: fail the episode, do not score it
            raise SandboxCrashError(
                f"the sandbox failed running a tool call: {result.stderr.strip()[-300:] or 'no output'}; "
                "the episode is recorded as failed (failure_cause 'sandbox_error')"
            )
        out = result.stdout[:max_chars] + ("\n[output truncated]" if len(result.stdout) > max_chars else "")
        if result.ok:
            return out if out.strip() else "(the program printed nothing)"
        why = {
            "timeout": f"it ran longer than {timeout_s:g} s and was stopped",
            "cpu_limit": "it used too much CPU time and was stopped",
            "memory_limit": "it ran out of memory",
            "output_limit": "it printed too much and was stopped",
            "file_size_limit": "it wrote too large a file",
        }
        reason = why.get(result.stop_reason, f"it exited with status {result.exit_code}")
        tail = result.stderr.strip()[-max_chars // 2 :]
        return f"{out}\n[the program failed: {reason}]" + (f"\n{tail}" if tail else "")

    return run_python
