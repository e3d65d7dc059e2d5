"""The ``fake_server`` example of ``flare-helios`` as a test fixture: Helios's real
HTTP server (router, scheduler worker, socket, graceful shutdown) over the
deterministic test executor, on a free port. Built with cargo on first use."""

from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "target" / "debug" / "examples" / "fake_server"


def build_fake_server() -> Path:
    """Builds the example (fast when it is up to date) and returns its path."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.fail("cargo is needed to build the fake_server example (see scripts/test.sh)")
    subprocess.run(
        [cargo, "build", "-q", "-p", "flare-helios", "--example", "fake_server"],
        cwd=ROOT,
        check=True,
        timeout=1800,
    )
    return EXAMPLE


def build_flare() -> Path:
    """Builds the ``flare`` binary (fast when it is up to date) and returns its path."""
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.fail("cargo is needed to build the flare binary (see scripts/test.sh)")
    subprocess.run([cargo, "build", "-q", "-p", "flare"], cwd=ROOT, check=True, timeout=1800)
    return ROOT / "target" / "debug" / "flare"


def _read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


class FakeServer:
    """A running fake_server process: ``url``, ``host``, ``port``, ``metrics()``,
    ``stop()``."""

    def __init__(self, binary: Path, *args: str) -> None:
        self.process = subprocess.Popen(
            [str(binary), "--port", "0", *args],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.log: list[str] = []
        deadline = time.monotonic() + 60
        assert self.process.stderr is not None
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                break
            self.log.append(line)
            match = re.search(r"serving on http://(\S+)", line)
            if match:
                host, port = match.group(1).rsplit(":", 1)
                self.host, self.port = host, int(port)
                self.url = f"http://{host}:{port}"
                # Keep reading: a server whose stderr pipe fills blocks on its
                # next log line (each failed request logs one).
                threading.Thread(target=self._drain, daemon=True).start()
                return
        self.process.kill()
        raise AssertionError("fake_server did not start: " + "".join(self.log))

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)

    def stop(self) -> int:
        """SIGTERM, as a service manager stops it; the exit status."""
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()

    def metrics(self) -> dict[str, float]:
        """``GET /metrics`` as name -> value (histogram buckets keep their labels)."""
        with socket.create_connection((self.host, self.port), timeout=10) as conn:
            conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = _read_all(conn)
        body = data.split(b"\r\n\r\n", 1)[1].decode()
        values = {}
        for line in body.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values
