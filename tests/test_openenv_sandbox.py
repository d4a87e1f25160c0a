"""A launched OpenEnv server runs in ludic_lab's bubblewrap sandbox, against openenv-core and bwrap.

The code env (``tests/openenv_servers/code_env``) hands each action's code to openenv-core's own
``MCPEnvironment.execute_code`` (an ``exec``), as a coding or CodeAct env does. Launched by
default, the code runs in the sandbox: a file it writes on the host's paths is not there, a
listener on the host's 127.0.0.1 gets no connection, a process it leaves in the background is
gone after close, the host's environment is not visible. ``sandbox="unsafe_local"`` is the
positive control: the same action creates the file and reaches the listener. The host reaches
the sandboxed server through the proxy over both of openenv-core's transports: HTTP (``/health``,
``/schema``, ``POST /reset``) and the WebSocket session of ``GenericEnvClient``.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openenv")
import psutil
from sandbox_probes import host_listener, marked_processes

from ludic_lab.envs.code_exec.sandbox import SandboxUnavailableError
from ludic_lab.integrations.openenv_server import OpenEnvServer

pytestmark = pytest.mark.timeout(180)

SERVERS = str(Path(__file__).parent / "openenv_servers")
APP = "code_env.server.app:app"


async def _run(server: OpenEnvServer, code: str) -> str:
    """One episode on ``server``: reset, one step running ``code``; -> its output."""
    from openenv.core.generic_client import GenericEnvClient

    async with GenericEnvClient(base_url=server.base_url) as client:
        await client.reset()
        result = await client.step({"code": code})
    return str(result.observation["output"])


def _touch(path: Path) -> str:
    return f"import subprocess\nresult = subprocess.run(['touch', {str(path)!r}]).returncode"


def _connect(port: int) -> str:
    return (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).close(); result = 'connected'\n"
        "except OSError as e:\n"
        "    result = type(e).__name__"
    )


async def test_an_action_that_runs_code_stays_in_the_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LUDIC_TEST_HOST_SECRET", "s3cret")
    sock, accepted = host_listener()
    marker = f"{time.time_ns() % 10**6}.5"  # a sleep no other process runs
    try:
        async with OpenEnvServer.launch(APP, cwd=SERVERS) as server:
            assert server.sandbox == "bubblewrap"
            # a file on the host's paths: tmp_path, and the app's own folder (bound read-only)
            assert await _run(server, _touch(tmp_path / "pwned")) == "1"
            assert await _run(server, _touch(Path(SERVERS) / "pwned")) == "1"
            assert await _run(server, _connect(sock.getsockname()[1])) == "'ConnectionRefusedError'"
            out = await _run(server, "import os\nresult = sorted(os.environ)")
            assert "LUDIC_TEST_HOST_SECRET" not in out and "PATH" in out
            assert await _run(server, "import os\nresult = os.getuid()") == "1000"
            # a process left in the background, in a session of its own, its parent gone
            code = f"import subprocess\nresult = subprocess.Popen(['sh', '-c', 'sleep {marker} &'], start_new_session=True).wait()"
            assert await _run(server, code) == "0"
            assert marked_processes(marker, alive=True), "the background process should run until the server is closed"
            tree = [server.pid, *(p.pid for p in psutil.Process(server.pid).children(recursive=True))]
        assert not (tmp_path / "pwned").exists() and not (Path(SERVERS) / "pwned").exists()
        assert accepted == []
        assert marked_processes(marker, alive=False) == []
        assert _still_running(tree) == []
    finally:
        sock.close()


def _still_running(pids: list[int], wait_s: float = 10.0) -> list[int]:
    """Those of ``pids`` that still run (not gone, not a zombie) after up to ``wait_s``: a killed
    process takes a moment to finish its exit on a busy machine, and one may be reaped between
    a check that it exists and the read of its status (psutil's NoSuchProcess)."""
    deadline = time.monotonic() + wait_s
    while True:
        running = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    running.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


async def test_unsafe_local_runs_the_same_actions_on_this_machine(tmp_path: Path) -> None:
    """The positive control: without the sandbox the same actions reach the host."""
    sock, accepted = host_listener()
    try:
        async with OpenEnvServer.launch(APP, cwd=SERVERS, sandbox="unsafe_local") as server:
            assert await _run(server, _touch(tmp_path / "pwned")) == "0"
            assert await _run(server, _connect(sock.getsockname()[1])) == "'connected'"
        assert (tmp_path / "pwned").exists()
        deadline = time.monotonic() + 5
        while not accepted and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(accepted) == 1
    finally:
        sock.close()


async def test_the_proxy_carries_http_and_websocket_sessions() -> None:
    async with OpenEnvServer.launch(APP, cwd=SERVERS) as server:
        assert server.action_schema is not None and "code" in server.action_schema["properties"]  # GET /schema
        request = urllib.request.Request(
            server.base_url + "/reset", data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            assert json.loads(r.read())["observation"]["output"].startswith("Write Python")
        # several WebSocket sessions at once, each with its own environment
        import asyncio

        outs = await asyncio.gather(*(_run(server, f"result = add({i}, {i})") for i in range(4)))
        assert outs == [str(2 * i) for i in range(4)]
        big = await _run(server, "result = 'x' * 300_000")  # a message larger than one proxy chunk
        assert len(big) == 300_002  # its repr


_FORK_BOMB = """import os, time
kids, err = [], None
try:
    for _ in range(2000):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        kids.append(pid)
except OSError as e:
    err = e.errno
for pid in kids:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
result = [len(kids), err]"""


async def test_a_fork_bomb_stops_at_the_servers_process_limit() -> None:
    """RLIMIT_NPROC inside the user namespace, or the pids cgroup as root (where the kernel exempts
    uid 0 from RLIMIT_NPROC): forks past ``ServerLimits.processes`` fail with EAGAIN, the server answers on."""
    from ludic_lab.integrations.openenv_sandbox import ServerLimits

    async with OpenEnvServer.launch(APP, cwd=SERVERS, limits=ServerLimits(processes=64)) as server:
        forked, errno = json.loads(await _run(server, _FORK_BOMB))
        assert errno == 11 and 0 < forked < 64, (forked, errno)  # EAGAIN; the server's threads count too
        assert await _run(server, "result = add(2, 3)") == "5"


def test_a_bad_sandbox_or_a_missing_bwrap_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="'bubblewrap'.*'unsafe_local'"):
        OpenEnvServer.launch(APP, cwd=SERVERS, sandbox="none")  # type: ignore[arg-type]
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SandboxUnavailableError, match="sandbox='unsafe_local'"):
        OpenEnvServer.launch(APP, cwd=SERVERS)
    OpenEnvServer.launch(APP, cwd=SERVERS, sandbox="unsafe_local")  # the explicit opt-out needs no bwrap
    OpenEnvServer.at("http://127.0.0.1:1")  # nor does a server given by URL


def test_a_folder_that_shows_the_whole_machine_is_refused() -> None:
    server = OpenEnvServer.launch(APP, cwd=SERVERS, readable=["/"], startup_timeout_s=10)
    with pytest.raises(Exception, match="whole machine or home folder"):
        server.start_sync()
    server.close_sync()
