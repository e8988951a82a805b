"""A real PostgreSQL server for the tests: initdb in a temporary directory, on a free loopback port.

Debian's ``postgresql`` package provides the binaries (``.ci/run`` installs it
on a fresh machine). initdb refuses to run as root, so as root the server
runs as the ``postgres`` user (``runuser -u postgres --``).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One throw-away server; :attr:`url` reaches its ``postgres`` database as the ``postgres`` user."""

    def __init__(self) -> None:
        bindir = _bindir()
        if bindir is None:
            raise RuntimeError("no PostgreSQL server binaries (apt-get install postgresql)")
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        self.port = _free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._as: list[str] = []
        self._started = False
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.root / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self._as, str(self.bindir / tool), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed: {(proc.stderr or proc.stdout).strip()[-500:]}")

    def start(self) -> None:
        """Start the server (it listens on 127.0.0.1 only; fsync off: a test server).

        The first start moves to another free port when its own was taken
        between :func:`_free_port` and the server's bind (up to 3 times); a
        restart keeps the port, which the clients' URL names.
        """
        for attempt in range(4):
            options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
            try:
                self._run("pg_ctl", "-D", str(self.root / "data"), "-o", options, "-l", str(self.root / "log"), "-w", "-t", "60", "start")
            except RuntimeError:
                log = (self.root / "log").read_text(errors="replace") if (self.root / "log").exists() else ""
                if self._started or attempt == 3 or "could not bind" not in log:
                    raise
                self.port = _free_port()
                self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
                (self.root / "log").unlink()
                continue
            self._started = True
            return

    def stop(self) -> None:
        """Stop it at once (clients see their connections drop)."""
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        """Stop it if running and delete its directory."""
        try:
            self.stop()
        except RuntimeError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
