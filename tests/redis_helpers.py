"""A real ``redis-server`` per test module: start on a free loopback port, restart, stop.

The server runs with AOF persistence (``appendonly yes``, ``appendfsync always``) in a
temporary folder, so a restart (even after ``kill -9``) comes back with every acknowledged
write. ``require_redis_server()`` skips when ``redis-server`` is missing — and fails under
``CI``, where every real part must be installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ludic_lab.net import free_port

REDIS_SERVER = shutil.which("redis-server")
REPO = Path(__file__).resolve().parents[1]


def require_redis_server() -> str:
    """Path of ``redis-server``; skips the test when missing (a failure under ``CI``)."""
    if REDIS_SERVER is None:
        msg = "redis-server is not installed (apt-get install -y redis-server)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return REDIS_SERVER


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 with AOF in ``data_dir``."""

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.binary = require_redis_server()
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 60.0) -> RedisServer:
        cmd = [
            self.binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            str(self.data_dir),
            "--protected-mode",
            "yes",
        ]
        log = open(self.data_dir / "redis.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {self.proc.returncode}; see {self.data_dir / 'redis.log'}"
                )
            if self.ping():
                return self
            time.sleep(0.05)
        raise TimeoutError(f"redis-server on port {self.port} did not answer within {timeout_s} s")

    def ping(self) -> bool:
        """True when the server answers PING (and has finished loading its AOF)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """``kill -9`` the server (no shutdown save; AOF with fsync always keeps every write)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop gracefully (SIGTERM), then kill if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def restart(self, *, hard: bool = True, down_s: float = 0.5) -> None:
        """Kill (``hard``) or stop the server, stay down ``down_s`` seconds, start it again on the same port."""
        self.kill() if hard else self.stop()
        time.sleep(down_s)
        self.start()

    def client(self):  # -> redis.Redis (sync; for test assertions only, never on an event loop)
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, db=0)


def redis_server_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """Body of a module-scoped fixture: a fresh server for the module, stopped afterwards."""
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


def python_cmd(module: str, *args: str) -> list[str]:
    """``python -m <module> args...`` with the interpreter running the tests."""
    return [sys.executable, "-m", module, *args]


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: offline switches, repo on PYTHONPATH, few threads."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env
