"""Storage: the files of checkpoints, savepoints, state snapshots and job control under one
fsspec URL. It sits at the bottom of the package graph (next to `streamer.exceptions`) because
`state.snapshot`, `checkpoint`, `savepoint` and `runtime.job.control` all write through it.

`Storage(url)` works on any URL fsspec knows (`file://`, a plain local path, `memory://`, `s3://`,
`hdfs://`, ... and `faulty://` of `streamer.testing.storage_faults` in tests). It is cheap to build,
so a Spark task rebuilds it from the URL string it was given (fsspec caches file-system objects
per process).

**Nothing at a final name is ever partial.** A local write goes to a temporary file in the same
directory, is fsynced and renamed into place (then the directory is fsynced); any other file
system gets exactly one `pipe_file` (a single PUT, atomic on object stores) or, for files above
`SINGLE_PUT_LIMIT`, the store's own `put_file` (multipart uploads only become visible when they
complete). Downloads land in a temporary name next to the target and are renamed into place only
after their size and sha256 have been verified.

Errors: every failure of the underlying file system is raised as `StorageError` (naming the URL
and file, chained to the cause); a missing file as `MissingFileError`; a download whose size or
checksum does not match as `CorruptFileError`. They live here, next to the only code that raises
them.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import posixpath
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

import fsspec
from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from streamer.exceptions import StreamerError

#: Read and write in chunks of this many bytes.
CHUNK = 1 << 20
#: Files up to this size are uploaded to non-local stores as one PUT from memory (hashed while
#: read once); larger ones are hashed, then handed to the store's `put_file`.
SINGLE_PUT_LIMIT = 64 << 20


#: The keys of a pipeline's `storage_options:` block (for `s3://` URLs).
S3_OPTIONS = ("endpoint_url", "key", "secret", "token", "region", "anon")
#: The environment variable fsspec reads the default options of every `s3://` file system
#: from (JSON), in this process and in the processes it starts (Spark's Python workers).
S3_OPTIONS_ENV = "FSSPEC_S3"


def s3fs_arguments(options: Mapping[str, Any]) -> dict[str, Any]:
    """A `storage_options:` block as s3fs's `S3FileSystem` arguments (`region` becomes the
    client's `region_name`)."""
    out: dict[str, Any] = {k: options[k] for k in S3_OPTIONS
                           if k != "region" and options.get(k) is not None}
    if options.get("region"):
        out["client_kwargs"] = {"region_name": str(options["region"])}
    return out


def use_s3_options(options: Mapping[str, Any]) -> dict[str, str]:
    """Make a pipeline's `storage_options:` the defaults of every `s3://` file system this
    process opens (storage, files sources and sinks) and of the processes it starts: fsspec's
    config and `FSSPEC_S3` in the environment, which Spark's local Python workers inherit.
    Returns the variable for executors elsewhere (`spark.executorEnv.FSSPEC_S3`); {} when
    there are no options. Explicit options win over the `AWS_*` variables botocore reads."""
    if not options:
        return {}
    arguments = s3fs_arguments(options)
    fsspec.config.conf.setdefault("s3", {}).update(arguments)
    with contextlib.suppress(ValueError):
        current = json.loads(os.environ.get(S3_OPTIONS_ENV) or "{}")
        arguments = {**(current if isinstance(current, dict) else {}), **arguments}
    os.environ[S3_OPTIONS_ENV] = json.dumps(arguments)
    with contextlib.suppress(ImportError):  # instances made before use the old options
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
    return {S3_OPTIONS_ENV: os.environ[S3_OPTIONS_ENV]}


class StorageError(StreamerError):
    """Raised when checkpoint storage cannot be read or written (the message names the URL and
    file, the cause is chained); check that the storage URL is reachable and writable.
    """


class MissingFileError(StorageError):
    """Raised when a file that should be in checkpoint storage is not there; the checkpoint that
    references it cannot be used: restore from another one.
    """


class CorruptFileError(StorageError):
    """Raised when a downloaded file does not have the size or sha256 recorded for it (storage
    damage, or a file overwritten by something other than streamer). The message names the file
    and what differs; restore from another checkpoint.
    """


@dataclass(frozen=True)
class FileRef:
    """A file in storage: its storage-relative path, size in bytes and sha256 (hex). `written`
    says whether `put_file` transferred it (False when an identical file was already there).
    """

    path: str
    size: int
    sha256: str
    written: bool = True


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a local file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: str, data: bytes) -> None:
    """Write `data` to the new local file `path` and flush it to disk."""
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _temp_name(path: str) -> str:
    """A temporary name in the directory of `path`, never equal to a final name (dot-prefixed,
    `.tmp`-suffixed).
    """
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.{uuid.uuid4().hex[:12]}.tmp")


#: The names `_temp_name` gives.
_TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.tmp")


def _modified_at(info: dict[str, Any]) -> float | None:
    """When a file listed by fsspec was last written (seconds since the epoch), or None: each
    file system names it differently (`mtime` local, `LastModified` s3, `updated` gcs...)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, str):
            with contextlib.suppress(ValueError):
                return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


def _precondition_failed(exc: BaseException) -> bool:
    """Whether `exc` is an S3 server's 412 Precondition Failed (of `If-None-Match: *`): s3fs
    makes it `FileExistsError` only when the answer names its condition, as AWS's does."""
    seen: BaseException | None = exc
    while seen is not None:
        if "PreconditionFailed" in str(seen) or "412" in str(getattr(seen, "response", "")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _multipart_uploads(fs: Any, bucket: str) -> Iterator[dict[str, Any]]:
    """Every unfinished multipart upload of `bucket`, page by page: listed without a prefix,
    since MinIO matches `Prefix` only against whole keys."""
    markers: dict[str, str] = {}
    while True:
        page = fs.call_s3("list_multipart_uploads", Bucket=bucket, **markers)
        yield from page.get("Uploads", []) or []
        if not page.get("IsTruncated"):
            return
        markers = {"KeyMarker": page.get("NextKeyMarker", ""),
                   "UploadIdMarker": page.get("NextUploadIdMarker", "")}


def abort_stale_uploads(fs: Any, path: str, older_than_s: float) -> list[str]:
    """Abort the unfinished multipart uploads under `path` (an `s3://` file system's path)
    started more than `older_than_s` seconds ago: what uploads killed midway left behind (the
    store keeps their parts, invisible but billed, until aborted). Other file systems have
    none: []. Returns the keys of the aborted uploads."""
    if not hasattr(fs, "list_multipart_uploads"):
        return []
    bucket, _, prefix = fs._strip_protocol(path).partition("/")
    prefix = prefix.strip("/")
    prefix = f"{prefix}/" if prefix else ""
    cutoff = time.time() - older_than_s
    aborted = []
    for upload in _multipart_uploads(fs, bucket):
        key, started = str(upload.get("Key", "")), upload.get("Initiated")
        when = started.timestamp() if isinstance(started, datetime.datetime) else None
        if key.startswith(prefix) and (when is None or when < cutoff):
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key,
                       UploadId=upload["UploadId"])
            aborted.append(key)
    return aborted


def _copy_hashing(source: IO[bytes], target: IO[bytes]) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    while chunk := source.read(CHUNK):
        digest.update(chunk)
        target.write(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


class Storage:
    """Checkpoint storage under one fsspec URL: atomic writes, verified downloads, listings.
    Paths given to the methods are relative to the URL (`/`-separated).
    """

    def __init__(self, url: str | os.PathLike[str]) -> None:
        text = os.fspath(url)
        if "://" not in text:  # a plain local path; tasks may run elsewhere: make it absolute
            text = "file://" + os.path.abspath(text)
        try:
            fs, root = url_to_fs(text)
        except Exception as exc:
            msg = f"cannot use checkpoint storage {text!r}: {exc}"
            raise StorageError(msg) from exc
        self.fs: fsspec.AbstractFileSystem = fs
        self.root: str = root.rstrip("/") or "/"
        self._local = type(fs) is LocalFileSystem
        if self._local:
            self.root = os.path.abspath(self.root)
        #: The URL that rebuilds this storage in any process (absolute for local paths).
        self.url: str = text if "::" in text else fs.unstrip_protocol(self.root)

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    # ------------------------------------------------------------------ paths
    def path(self, *parts: str) -> str:
        """The file-system path of `parts` joined under the root."""
        rel = posixpath.join(*parts) if parts else ""
        rel = rel.strip("/")
        if any(part == ".." for part in rel.split("/")):
            msg = f"storage path {rel!r} leaves the storage root {self.url!r}"
            raise StorageError(msg)
        return f"{self.root.rstrip('/')}/{rel}" if rel else self.root

    def child(self, *parts: str) -> Storage:
        """The storage rooted at `parts` under this one (e.g. a job's checkpoint directory)."""
        rel = posixpath.join(*parts).strip("/")
        return Storage(f"{self.url.rstrip('/')}/{rel}")

    def _describe(self, rel: str) -> str:
        return f"{self.url.rstrip('/')}/{rel.strip('/')}"

    @contextlib.contextmanager
    def _errors(self, action: str, rel: str) -> Iterator[None]:
        """Turn file-system failures into `StorageError` / `MissingFileError`."""
        try:
            yield
        except StreamerError:
            raise
        except Exception as exc:
            cls = MissingFileError if isinstance(exc, FileNotFoundError) else StorageError
            msg = f"cannot {action} {self._describe(rel)!r}: {type(exc).__name__}: {exc}"
            raise cls(msg) from exc

    # ------------------------------------------------------------------ small files
    def write_atomic(self, rel: str, data: bytes) -> None:
        """Write `data` as the file `rel`, all or nothing (replacing an existing file)."""
        path = self.path(rel)
        with self._errors("write", rel):
            if self._local:
                parent = os.path.dirname(path)
                os.makedirs(parent, exist_ok=True)
                tmp = _temp_name(path)
                try:
                    _write_synced(tmp, data)
                    os.replace(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
                _fsync_dir(parent)
            else:
                self.fs.makedirs(self.fs._parent(path), exist_ok=True)
                self.fs.pipe_file(path, data)

    def create_exclusive(self, rel: str, data: bytes) -> bool:
        """Create the file `rel` with `data` only if no file has that name: True when this
        call created it, False when it existed. Two processes creating one name at once get
        one True between them. Local (and NFS) paths link a complete temporary file into place
        (`link` fails atomically on an existing name, so a reader never sees a partial file);
        other stores open the file in mode `xb` (a conditional PUT where the store has one,
        e.g. s3fs and gcsfs), and the file is read back, so a store that only checks before
        writing still leaves one winner unless two writes interleave within the read-back.
        """
        path = self.path(rel)
        with self._errors("create", rel):
            if self._local:
                return self._create_local(path, data)
            self.fs.makedirs(self.fs._parent(path), exist_ok=True)
            self.fs.invalidate_cache(path)
            try:
                with self.fs.open(path, "xb") as fh:
                    fh.write(data)
            except FileExistsError:
                return False
            except OSError as exc:
                if not _precondition_failed(exc):
                    raise
                return False  # a conditional PUT refused without naming its condition
            except (ValueError, NotImplementedError):  # no exclusive mode: check, then write
                if self.fs.exists(path):
                    return False
                self.fs.pipe_file(path, data)
            self.fs.invalidate_cache(path)
            return bytes(self.fs.cat_file(path)) == data

    @staticmethod
    def _create_local(path: str, data: bytes) -> bool:
        parent = os.path.dirname(path)
        os.makedirs(parent, exist_ok=True)
        tmp = _temp_name(path)
        try:
            _write_synced(tmp, data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        _fsync_dir(parent)
        return True

    def read_bytes(self, rel: str) -> bytes:
        """The content of the file `rel` (`MissingFileError` if absent)."""
        with self._errors("read", rel):
            data = self.fs.cat_file(self.path(rel))
        return bytes(data)

    def exists(self, rel: str) -> bool:
        """Whether `rel` exists (a file or a directory)."""
        path = self.path(rel)
        with self._errors("look up", rel):
            self.fs.invalidate_cache(path)
            return bool(self.fs.exists(path))

    def info(self, rel: str) -> int | None:
        """The size in bytes of the file `rel`, or None when it does not exist."""
        path = self.path(rel)
        with self._errors("look up", rel):
            self.fs.invalidate_cache(path)
            try:
                info = self.fs.info(path)
            except FileNotFoundError:
                return None
        size = info.get("size")
        return None if size is None else int(size)

    def ls(self, rel: str = "") -> list[str]:
        """The names (not paths) of the entries of directory `rel`, sorted; [] when missing."""
        path = self.path(rel)
        with self._errors("list", rel):
            self.fs.invalidate_cache(path)
            try:
                entries = self.fs.ls(path, detail=False)
            except FileNotFoundError:
                return []
        names = {posixpath.basename(str(entry).rstrip("/")) for entry in entries}
        names.discard("")
        if len(entries) == 1 and str(entries[0]).rstrip("/") == path.rstrip("/"):
            return []  # `rel` is a file, not a directory
        return sorted(names)

    def remove_stale_temporaries(self, rel: str, older_than_s: float) -> list[str]:
        """Delete the temporary files (`_temp_name`: `.<name>.<hex>.tmp`) under `rel` last
        modified more than `older_than_s` seconds ago: what writes and uploads killed midway
        left behind (a live one is younger), and abort an object store's multipart uploads
        as old (`abort_stale_uploads`). Files without a known time are kept. Returns the
        deleted paths (relative to the root; an aborted upload as `(upload) <key>`)."""
        base = self.path("").rstrip("/") + "/"
        with self._errors("list", rel):
            try:
                found = self.fs.find(self.path(rel), detail=True)
            except FileNotFoundError:
                return []
        cutoff = time.time() - older_than_s
        with self._errors("abort the unfinished uploads under", rel):
            deleted = [f"(upload) {key}" for key in
                       abort_stale_uploads(self.fs, self.path(rel), older_than_s)]
        for full, info in found.items():
            name = posixpath.basename(full)
            changed = _modified_at(info)
            if _TEMP_NAME.fullmatch(name) and changed is not None and changed < cutoff:
                rel_path = full[len(base):] if full.startswith(base) else full
                self.rm(rel_path)
                deleted.append(rel_path)
        return deleted

    def rm(self, rel: str, recursive: bool = False) -> None:
        """Delete the file (or, with `recursive`, the directory) `rel`; missing is fine."""
        path = self.path(rel)
        with self._errors("delete", rel):
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(path, recursive=recursive)
            self.fs.invalidate_cache(path)

    # ------------------------------------------------------------------ large files
    def put_file(self, local_path: str | os.PathLike[str], rel: str, *,
                 name_from_hash: Callable[[str], str] | None = None,
                 overwrite: bool = True) -> FileRef:
        """Upload a local file as `rel` and return its `FileRef` (size and sha256 of the bytes
        sent, computed while reading the file once). With `name_from_hash`, `rel` is the
        directory and the file is named `name_from_hash(sha256)` (content-named files). With
        `overwrite=False` an existing file of the same size at the final path is kept
        (`written=False`): use that only for content-named files.
        """
        label = rel if name_from_hash is None else f"{rel}/<{os.path.basename(local_path)}>"
        with self._errors("upload to", label):
            if self._local:
                return self._put_local(os.fspath(local_path), rel, name_from_hash, overwrite)
            return self._put_remote(os.fspath(local_path), rel, name_from_hash, overwrite)

    def _put_local(self, local_path: str, rel: str, name_from_hash: Callable[[str], str] | None,
                   overwrite: bool) -> FileRef:
        directory = rel if name_from_hash is not None else posixpath.dirname(rel)
        parent = self.path(directory)
        os.makedirs(parent, exist_ok=True)
        tmp = _temp_name(os.path.join(parent, os.path.basename(local_path)))
        try:
            with open(local_path, "rb") as source, open(tmp, "wb") as target:
                size, digest = _copy_hashing(source, target)
                target.flush()
                os.fsync(target.fileno())
            final_rel = rel if name_from_hash is None \
                else posixpath.join(directory, name_from_hash(digest))
            final = self.path(final_rel)
            if not overwrite and os.path.isfile(final) and os.path.getsize(final) == size:
                os.unlink(tmp)
                return FileRef(final_rel, size, digest, written=False)
            os.replace(tmp, final)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(parent)
        return FileRef(final_rel, size, digest)

    def _put_remote(self, local_path: str, rel: str,
                    name_from_hash: Callable[[str], str] | None, overwrite: bool) -> FileRef:
        size = os.path.getsize(local_path)
        data: bytes | None = None
        if size <= SINGLE_PUT_LIMIT:
            with open(local_path, "rb") as fh:
                data = fh.read()
            size, digest = len(data), hashlib.sha256(data).hexdigest()
        else:
            digest = sha256_file(local_path)
        final_rel = rel if name_from_hash is None else posixpath.join(rel, name_from_hash(digest))
        final = self.path(final_rel)
        if not overwrite:
            self.fs.invalidate_cache(final)
            with contextlib.suppress(FileNotFoundError):
                if int(self.fs.info(final).get("size", -1)) == size:
                    return FileRef(final_rel, size, digest, written=False)
        self.fs.makedirs(self.fs._parent(final), exist_ok=True)
        if data is not None:
            self.fs.pipe_file(final, data)
        else:
            self.fs.put_file(local_path, final)
            if sha256_file(local_path) != digest:
                msg = f"{local_path!r} changed while it was uploaded"
                raise StorageError(msg)
        return FileRef(final_rel, size, digest)

    def get_file(self, ref_or_rel: FileRef | str, local_path: str | os.PathLike[str], *,
                 size: int | None = None, sha256: str | None = None) -> None:
        """Download a file to `local_path`, verifying its size and sha256 (from the `FileRef`,
        or given for a path) before renaming it into place; `CorruptFileError` on a mismatch.
        """
        if isinstance(ref_or_rel, FileRef):
            rel = ref_or_rel.path
            size = ref_or_rel.size if size is None else size
            sha256 = ref_or_rel.sha256 if sha256 is None else sha256
        else:
            rel = ref_or_rel
        if size is None or sha256 is None:
            msg = f"downloading {rel!r} needs its expected size and sha256"
            raise TypeError(msg)
        target = os.fspath(local_path)
        tmp = _temp_name(target)
        try:
            with self._errors("download", rel):
                os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
                with self.fs.open(self.path(rel), "rb") as source, open(tmp, "wb") as sink:
                    got_size, got_sha = _copy_hashing(source, sink)
            if got_size != size or got_sha != sha256:
                what = (f"size {got_size} instead of {size}" if got_size != size
                        else f"sha256 {got_sha} instead of {sha256}")
                msg = f"{self._describe(rel)!r} is corrupt: {what}"
                raise CorruptFileError(msg)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

