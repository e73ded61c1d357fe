"""A real S3 API server (MinIO) on 127.0.0.1, for the object-storage tests and the benchmark.
No docker and no mocking library: MinIO is built from its Go module with the Go toolchain of
the machine (`go install github.com/minio/minio@latest`, about 5 minutes of CPU on 2 cores)
into a cache directory, once, and runs as a child process with a temporary data directory.

    .venv/bin/python tests/s3_server.py build          # build MinIO if not cached (CI does this)
    .venv/bin/python tests/s3_server.py fetch-s3a      # Spark's S3A jars (CI does this)
    .venv/bin/python tests/s3_server.py run [--port 9000] [--dir DIR] [--bucket NAME]

`S3Server.env()` is what a `streamer` process needs to reach it (the `AWS_*` variables that
botocore, and so s3fs, read); `S3Server.storage_options()` the same as a pipeline file's
`storage_options:` block.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

#: The Go module MinIO is built from, pinned to what the tests were written against (the
#: module proxy's `latest` on 2026-11-23), so that CI builds the same server.
MODULE = "github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c"
#: Where the built binary is cached (`STREAMER_TEST_MINIO` names another binary).
CACHE = Path(os.environ.get("STREAMER_CACHE", Path.home() / ".cache" / "streamer")) / "minio"
ACCESS_KEY, SECRET_KEY = "streamer-test", "streamer-test-secret"


def go() -> str:
    """The Go toolchain: `go` on PATH, else the usual install location."""
    found = shutil.which("go") or "/usr/local/go/bin/go"
    if not os.path.exists(found):
        msg = "no Go toolchain (go on PATH or /usr/local/go/bin/go) to build MinIO with"
        raise RuntimeError(msg)
    return found


def minio_binary(build: bool = True) -> Path:
    """The MinIO server binary: `STREAMER_TEST_MINIO`, else the cached build (built when missing
    and `build`; idempotent: a cached binary is used as is)."""
    if os.environ.get("STREAMER_TEST_MINIO"):
        return Path(os.environ["STREAMER_TEST_MINIO"])
    binary = CACHE / "bin" / "minio"
    if binary.exists() or not build:
        return binary
    (CACHE / "bin").mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(CACHE / "bin"), "CGO_ENABLED": "0",
           "GOFLAGS": "-trimpath"}
    print(f"building MinIO ({MODULE}) into {binary} (about 5 minutes of CPU)", flush=True)
    subprocess.run(["nice", "-n", "15", go(), "install", MODULE], env=env, check=True)
    return binary


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """One MinIO server process on 127.0.0.1 with its data in `directory`."""

    def __init__(self, directory: str | Path, port: int | None = None) -> None:
        self.directory = Path(directory)
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The server's URL."""
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment a process needs to reach the server through botocore / s3fs."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}

    def storage_options(self) -> dict[str, str]:
        """The same, as a pipeline file's `storage_options:` block."""
        return {"endpoint_url": self.endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}

    def filesystem(self) -> Any:
        """A fresh s3fs file system on the server (no listing cache shared with streamer)."""
        import s3fs

        return s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, use_listings_cache=False,
                                 skip_instance_cache=True,
                                 client_kwargs={"endpoint_url": self.endpoint})

    def start(self, timeout: float = 60.0) -> S3Server:
        """Start the server and wait until it answers its health check."""
        binary = minio_binary()
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY,
               "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_CI_CD": "1"}
        log = open(self.directory / "minio.log", "ab")  # noqa: SIM115 (the child keeps it)
        console = free_port()
        self.process = subprocess.Popen(
            [str(binary), "server", "--quiet", "--address", f"127.0.0.1:{self.port}",
             "--console-address", f"127.0.0.1:{console}", str(data)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout
        while not self._ready():
            if self.process.poll() is not None:
                tail = (self.directory / "minio.log").read_text(errors="replace")[-2000:]
                msg = f"MinIO exited with {self.process.returncode}:\n{tail}"
                raise RuntimeError(msg)
            if time.monotonic() > deadline:
                self.stop()
                msg = f"MinIO did not answer on {self.endpoint} within {timeout:.0f} s"
                raise RuntimeError(msg)
            time.sleep(0.2)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def create_bucket(self, name: str) -> str:
        """Create bucket `name` (fine if it exists); returns `s3://<name>`."""
        fs = self.filesystem()
        if not fs.exists(name):
            fs.mkdir(name)
        return f"s3://{name}"

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build MinIO into the cache if it is not there")
    sub.add_parser("fetch-s3a", help="have Spark resolve its S3A jars (hadoop-aws, AWS SDK "
                   "bundle) from Maven Central into its Ivy cache if they are not there")
    run = sub.add_parser("run", help="run a MinIO server until Ctrl-C")
    run.add_argument("--port", type=int, default=9000)
    run.add_argument("--dir", default=None, help="data directory (default: a temporary one)")
    run.add_argument("--bucket", default="streamer")
    args = parser.parse_args()
    if args.command == "build":
        print(minio_binary())
        return
    if args.command == "fetch-s3a":
        from streamer.connectors.files.s3a import s3a_packages
        from streamer.connectors.maven import resolve_now

        print("\n".join(resolve_now(s3a_packages())))
        return
    directory = Path(args.dir or tempfile.mkdtemp(prefix="streamer-minio-"))
    server = S3Server(directory, args.port).start()
    # sigwait needs the signals blocked (after the start: a child would inherit the mask).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    server.create_bucket(args.bucket)
    print(f"MinIO on {server.endpoint}, bucket s3://{args.bucket}, data in {directory}")
    for key, value in server.env().items():
        print(f"export {key}={value}")
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
