"""`faulty://`: the local file system with storage faults injected by rules, for tests.

`faulty://<absolute local path>` reads and writes that local path, except that operations chosen
by rules fail with `OSError` (errno EIO). fsspec finds the protocol through the `fsspec.specs`
entry point `faulty` (pyproject.toml) in every process, Spark's Python workers too, and importing
this module registers it as well. Those workers see `STREAMER_TEST_FAULTS` only if it was set
before the SparkSession (its JVM) started, or passed as `spark.executorEnv.STREAMER_TEST_FAULTS`
(measured: a variable set later is absent in local-mode workers). So point the variable at a
fixed file early and change the rules by rewriting that file.

**Rules** are read from the JSON file named by the environment variable `STREAMER_TEST_FAULTS`,
again on every operation, so a test can change them while a job runs (no variable or no file: no
faults). Example::

    {"rules": [{"op": "write", "match": "*/shared/*", "times": 2},
               {"op": "read", "match": "*chk-3/_metadata"},
               {"op": "write", "match": "*/chk-4/*", "after": 1, "partial": true}]}

- `op`: `write` (open for writing, `pipe_file`, `put_file`, the target of `cp_file` / `mv`,
  `touch`), `read` (open for reading, `cat_file`, `get_file`, the source of `cp_file`),
  `delete` (`rm`, `rm_file`, `rmdir`, the source of `mv`), `list` (`ls`, `find`, `glob`, `info`,
  `exists`, `isfile`, `isdir`) or `any`. Creating directories is never faulted.
- `match`: an `fnmatch` pattern on the absolute local path (`/`-separated).
- `after` (default 0): let the first N matching operations pass, then fail.
- `times` (default: no limit): fail this many times, then pass again.
- `partial` (writes of `pipe_file` / `put_file` only): before failing, leave half of the data in a
  temporary file next to the target, as a writer that died mid-upload would; it is never at the
  final name.

Every matching operation counts, failed or not. Counts are kept in `<rules file>.counts.json`,
updated under an exclusive `flock` on `<rules file>.lock`, so they are shared by every process;
a rule is counted by its position and content (editing a rule starts its count afresh). Only the
outermost operation of a call is checked (`ls` calling `info` per entry counts once).

A failing write fails before the target is touched, a failing read before any data is returned.
Successful writes of `pipe_file` and `put_file` are atomic (temporary file and rename), like one
PUT to an object store.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

#: The environment variable naming the rules file.
FAULTS_ENV = "STREAMER_TEST_FAULTS"
#: The operation kinds a rule can name.
OPS = ("write", "read", "delete", "list", "any")

_depth = threading.local()


class InjectedFaultError(OSError):
    """The `OSError` a faulted operation raises (errno EIO); its message names the rule."""


def _rules_file() -> str | None:
    path = os.environ.get(FAULTS_ENV)
    return path if path and os.path.isfile(path) else None


def _load_rules(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    if not text.strip():
        return []
    document = json.loads(text)
    rules = document.get("rules", []) if isinstance(document, dict) else None
    if not isinstance(rules, list):
        msg = f"{path!r} must hold {{'rules': [...]}}"
        raise ValueError(msg)
    for rule in rules:
        if not isinstance(rule, dict) or rule.get("op") not in OPS \
                or not isinstance(rule.get("match"), str):
            msg = (f"fault rule {rule!r} in {path!r} needs 'op' (one of {', '.join(OPS)}) and "
                   "'match' (an fnmatch pattern)")
            raise ValueError(msg)
    return rules


@contextlib.contextmanager
def _locked(rules_path: str) -> Iterator[None]:
    fd = os.open(rules_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _bump(rules_path: str, key: str) -> int:
    """Count one more matching operation of rule `key`; returns how many came before it."""
    counts_path = rules_path + ".counts.json"
    with _locked(rules_path):
        try:
            with open(counts_path, encoding="utf-8") as fh:
                counts = json.load(fh)
        except (FileNotFoundError, ValueError):
            counts = {}
        seen = int(counts.get(key, 0))
        counts[key] = seen + 1
        tmp = f"{counts_path}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(counts, fh)
        os.replace(tmp, counts_path)
    return seen


def reset_counts() -> None:
    """Forget how often each rule matched (the counts file of the current rules file)."""
    path = os.environ.get(FAULTS_ENV)
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + ".counts.json")


def check(op: str, path: str) -> InjectedFaultError | None:
    """Raise `InjectedFaultError` if a rule fails operation `op` on `path`; for a `partial`
    write, return the error instead (the caller leaves the partial file, then raises it).
    """
    rules_path = _rules_file()
    if rules_path is None:
        return None
    for index, rule in enumerate(_load_rules(rules_path)):
        if rule["op"] not in (op, "any") or not fnmatch.fnmatchcase(path, rule["match"]):
            continue
        after = int(rule.get("after", 0))
        times = rule.get("times")
        if after == 0 and times is None:
            failing = True
        else:
            seen = _bump(rules_path, f"{index}:{json.dumps(rule, sort_keys=True)}")
            failing = seen >= after and (times is None or seen < after + int(times))
        if failing:
            error = fault(op, path, index)
            if rule.get("partial") and op == "write":
                return error
            raise error
    return None


def fault(op: str, path: str, index: int) -> InjectedFaultError:
    """The error of an injected fault."""
    return InjectedFaultError(errno.EIO, f"injected fault (rule {index}): {op} failed", path)


class FaultyFileSystem(LocalFileSystem):
    """The local file system, with the faults of `STREAMER_TEST_FAULTS` injected (protocol
    `faulty`).
    """

    protocol = "faulty"
    root_marker = "/"

    @contextlib.contextmanager
    def _guard(self, *checks: tuple[str, Any]) -> Iterator[InjectedFaultError | None]:
        """Check `(op, path)` pairs unless an outer faulty operation already did."""
        depth = getattr(_depth, "value", 0)
        partial = None
        if depth == 0:
            for op, path in checks:
                partial = check(op, self._strip_protocol(path)) or partial
        _depth.value = depth + 1
        try:
            yield partial
        finally:
            _depth.value = depth

    def unstrip_protocol(self, name: str) -> str:
        """`faulty://<path>`."""
        return f"faulty://{self._strip_protocol(name)}"

    # ------------------------------------------------------------------ reads and writes
    def _open(self, path: Any, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        op = "read" if set(mode) <= {"r", "b", "t"} else "write"
        with self._guard((op, path)) as partial:
            if partial is not None:
                raise partial
            return super()._open(path, mode, block_size, **kwargs)

    def _write_atomic(self, path: Any, write: Any, partial: InjectedFaultError | None) -> None:
        path = self._strip_protocol(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path),
                           f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
        if partial is not None:
            with open(tmp, "wb") as fh:
                write(fh, True)
            raise partial
        try:
            with open(tmp, "wb") as fh:
                write(fh, False)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def pipe_file(self, path: Any, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Write `value` as the file `path`, atomically."""
        with self._guard(("write", path)) as partial:
            def write(fh: Any, half: bool) -> None:
                fh.write(value[:len(value) // 2] if half else value)

            self._write_atomic(path, write, partial)

    def put_file(self, lpath: Any, rpath: Any, callback: Any = None, **kwargs: Any) -> None:
        """Copy the local file `lpath` to `rpath`, atomically."""
        with self._guard(("write", rpath)) as partial:
            def write(fh: Any, half: bool) -> None:
                with open(lpath, "rb") as source:
                    if half:
                        fh.write(source.read(max(os.path.getsize(lpath) // 2, 0)))
                    else:
                        shutil.copyfileobj(source, fh)

            self._write_atomic(rpath, write, partial)

    def cat_file(self, path: Any, start: Any = None, end: Any = None, **kwargs: Any) -> bytes:
        """The bytes of `path` (or of a range of it)."""
        with self._guard(("read", path)):
            return bytes(super().cat_file(path, start=start, end=end, **kwargs))

    def get_file(self, rpath: Any, lpath: Any, callback: Any = None, **kwargs: Any) -> None:
        """Copy `rpath` to the local `lpath`."""
        with self._guard(("read", rpath)):
            super().get_file(rpath, lpath, callback=callback, **kwargs)

    def cp_file(self, path1: Any, path2: Any, **kwargs: Any) -> None:
        """Copy `path1` to `path2`."""
        with self._guard(("read", path1), ("write", path2)) as partial:
            if partial is not None:
                raise partial
            super().cp_file(path1, path2, **kwargs)

    def mv(self, path1: Any, path2: Any, recursive: bool = True, **kwargs: Any) -> None:
        """Move `path1` to `path2`."""
        with self._guard(("delete", path1), ("write", path2)) as partial:
            if partial is not None:
                raise partial
            super().mv(path1, path2, recursive=recursive, **kwargs)

    def touch(self, path: Any, truncate: bool = True, **kwargs: Any) -> None:
        """Create `path` or update its modification time."""
        with self._guard(("write", path)) as partial:
            if partial is not None:
                raise partial
            super().touch(path, truncate=truncate, **kwargs)

    # ------------------------------------------------------------------ deletes
    def rm_file(self, path: Any) -> None:
        """Delete the file `path`."""
        with self._guard(("delete", path)):
            super().rm_file(path)

    def rm(self, path: Any, recursive: bool = False, maxdepth: Any = None) -> None:
        """Delete `path` (a list of paths, or a directory tree with `recursive`)."""
        paths = path if isinstance(path, list) else [path]
        with self._guard(*(("delete", p) for p in paths)):
            super().rm(path, recursive=recursive, maxdepth=maxdepth)

    def rmdir(self, path: Any) -> None:
        """Delete the empty directory `path`."""
        with self._guard(("delete", path)):
            super().rmdir(path)

    # ------------------------------------------------------------------ listings
    def ls(self, path: Any, detail: bool = False, **kwargs: Any) -> Any:
        """The entries of `path`."""
        with self._guard(("list", path)):
            return super().ls(path, detail=detail, **kwargs)

    def info(self, path: Any, **kwargs: Any) -> Any:
        """The metadata of `path`."""
        with self._guard(("list", path)):
            return super().info(path, **kwargs)

    def exists(self, path: Any, **kwargs: Any) -> bool:
        """Whether `path` exists (a fault raises, where fsspec's `exists` would say False)."""
        with self._guard(("list", path)):
            return bool(super().exists(path, **kwargs))

    def find(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        """Every file under `path`."""
        with self._guard(("list", path)):
            return super().find(path, *args, **kwargs)

    def isfile(self, path: Any) -> bool:
        """Whether `path` is a file."""
        with self._guard(("list", path)):
            return bool(super().isfile(path))

    def isdir(self, path: Any) -> bool:
        """Whether `path` is a directory."""
        with self._guard(("list", path)):
            return bool(super().isdir(path))


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)
