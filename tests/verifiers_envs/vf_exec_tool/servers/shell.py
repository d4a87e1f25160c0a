"""The tool servers of vf-exec-tool: ``shell_exec`` runs its argument as a shell command,
``shell_connect`` opens a TCP connection to a port of 127.0.0.1 -- what model-written tool
arguments reach in a tool server that executes them. ``ShellToolset`` is served once per
taskset (shared); ``task_shell.TaskShellToolset`` once per episode."""

import socket
import subprocess

import verifiers.v1 as vf


class _Shell:
    TOOL_PREFIX = "shell"

    @vf.tool
    async def exec(self, command: str) -> str:
        """Run a shell command; its exit code and output."""
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
        return f"exit={done.returncode}\n{done.stdout}{done.stderr}"

    @vf.tool
    async def connect(self, port: int) -> str:
        """Open a TCP connection to 127.0.0.1:port."""
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return "connected"
        except OSError as e:
            return type(e).__name__


class ShellToolset(_Shell, vf.Toolset[vf.SharedToolsetConfig]):
    pass


if __name__ == "__main__":
    ShellToolset.run()
