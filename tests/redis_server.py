"""A real redis-server (Debian's) for the tenancy tests: on a free loopback port in a temporary
directory, with an append-only file synced on every write, so a restart keeps the counters."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """`start()`, `kill()` (SIGKILL: an outage), `start()` again on the same port and files."""

    def __init__(self, directory: Path) -> None:
        exe = shutil.which("redis-server")
        assert exe, "redis-server is not installed (CI installs Debian's redis-server: .ci/run)"
        self.exe, self.dir, self.port = exe, directory, free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--protected-mode", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            assert self.proc.poll() is None, "redis-server exited"
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.02)
        client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=2)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory):
    """A redis-server for one test module (import this fixture into the module)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()
