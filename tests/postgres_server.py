"""A real PostgreSQL server on 127.0.0.1 for the `postgres` tests, the benchmark and the docs'
example, from Debian's `postgresql` package (no docker): `initdb` a data directory in a fresh
temporary directory, `pg_ctl start` it on a free port, `pg_ctl stop` it at the end.

PostgreSQL refuses to run as root. When this runs as root (CI, the tests here), the data
directory is given to the `postgres` OS user and `initdb` and `pg_ctl` run as that user through
`runuser`; otherwise they run as the current user. The server trusts local TCP connections of
the superuser `streamer` (a test server, reachable from 127.0.0.1 only).

    .venv/bin/python tests/postgres_server.py run [--port 5432]     # until Ctrl-C
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

#: The superuser the server is initialized with, and the database tests use.
USER, DATABASE = "streamer", "postgres"


def postgres_bin() -> Path:
    """The newest `/usr/lib/postgresql/<version>/bin` with `initdb` and `pg_ctl`."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                   key=lambda p: int(Path(p).parent.parent.name)
                   if Path(p).parent.parent.name.isdigit() else 0)
    if not found:
        msg = ("PostgreSQL's server binaries are not installed (/usr/lib/postgresql/*/bin); "
               "install them with `apt-get install -y postgresql` (.ci/run does)")
        raise RuntimeError(msg)
    return Path(found[-1]).parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """One PostgreSQL server in its own temporary directory; `start()` returns once it
    accepts connections, `stop()` stops it and removes the directory."""

    def __init__(self, port: int | None = None, *, durable: bool = False) -> None:
        self.port = port or free_port()
        #: False (tests): fsync and synchronous commit off, since only clients are killed.
        self.durable = durable
        self.bin = postgres_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="streamer-pg-"))
        self.data = self.dir / "data"
        self.log_file = self.dir / "server.log"
        self._as_postgres = os.geteuid() == 0
        self.started = False

    @property
    def dsn(self) -> str:
        """A libpq connection string for the superuser and database tests use."""
        return f"host=127.0.0.1 port={self.port} user={USER} dbname={DATABASE}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin / args[0]), *args[1:]]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, check=False,
                              stdin=subprocess.DEVNULL)

    def start(self, timeout: float = 60.0) -> PostgresServer:
        """initdb (trust authentication, superuser `streamer`), then start and wait."""
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        init = self._run("initdb", "-D", str(self.data), "-U", USER, "-A", "trust", "-E",
                         "UTF8", "--locale=C", "--no-sync")
        if init.returncode != 0:
            msg = f"initdb failed:\n{init.stdout}{init.stderr}"
            raise RuntimeError(msg)
        settings = [f"-p {self.port}", "-c listen_addresses=127.0.0.1",
                    f"-c unix_socket_directories={self.dir}", "-c max_connections=50"]
        if not self.durable:
            settings += ["-c fsync=off", "-c synchronous_commit=off",
                         "-c full_page_writes=off"]
        started = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_file),
                            "-o", " ".join(settings), "-w", "-t", str(int(timeout)), "start")
        if started.returncode != 0:
            log = self.log_file.read_text() if self.log_file.exists() else ""
            msg = f"pg_ctl start failed:\n{started.stdout}{started.stderr}\n{log[-2000:]}"
            self.stop()
            raise RuntimeError(msg)
        self.started = True
        return self

    def stop(self) -> None:
        """Stop the server (fast shutdown: open sessions are ended) and remove its files."""
        if self.started:
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------ helpers for tests
    def connect(self) -> Any:
        """An autocommit psycopg connection as the superuser."""
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def query(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """The rows of one statement (none for a statement that returns no rows)."""
        with self.connect() as conn, conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description is not None else []


def main() -> None:
    """`run`: a server until Ctrl-C, printing its connection string."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a server until Ctrl-C")
    run.add_argument("--port", type=int, default=None)
    run.add_argument("--durable", action="store_true",
                     help="keep fsync and synchronous commit on (for benchmarks)")
    args = parser.parse_args()
    server = PostgresServer(args.port, durable=args.durable).start()
    print(f"PostgreSQL on 127.0.0.1:{server.port}: dsn \"{server.dsn}\" (Ctrl-C stops it)",
          flush=True)
    stop = False

    def interrupt(signum: int, frame: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    with contextlib.suppress(KeyboardInterrupt):
        while not stop:
            time.sleep(0.5)
    server.stop()


if __name__ == "__main__":
    main()
