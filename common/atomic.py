"""The one way this project writes a file: atomically, with one fsync policy and one permission
policy.

Atomic: the data goes to a temporary file in the same directory, which is renamed over the
target, so a reader (or a resumed job) sees the old file or the complete new one, never a part.
Durable (the default): the file is fsync'ed before the rename and its directory after it, so the
write also survives a power cut; files rewritten soon anyway (progress, a job's start) and the
results of jobs cheaper to rerun than to sync pass `durable=False`.
Two kinds of file are written otherwise, each atomic in its own way: a file that must never
replace another (`write_new`: the first of two racing processes wins), and a journal line
(`append_line`: a line cut short has no newline, and readers skip it).
Permissions: results are meant to be read by the group that shares a cluster store, so files are
created 0644 (less what the user's umask removes); a file that holds a secret passes
`mode=0o600`.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Optional, Union

import yaml

SHARED, SECRET = 0o644, 0o600
Writer = Callable[[IO[bytes]], None]  # writes the content to an open binary file


def write_atomic(path: Union[str, Path], data: Union[bytes, Writer], *, durable: bool = True,
                 mode: int = SHARED) -> None:
    """Write `data` (bytes, or a function that writes to a binary file) to `path` atomically."""
    _publish(path, data, durable, mode, link=False)


def write_new(path: Union[str, Path], data: bytes, *, durable: bool = True) -> bool:
    """Create `path` with `data` atomically, only if nothing has that name yet; False if
    something has (another process created it first). The temporary file is hard-linked to
    `path`, which never replaces a file and is atomic on NFS and Lustre as on a local disk, then
    removed. For files that are never rewritten, only superseded by a newer name (the store's
    index snapshots), so that two processes can race for a name and exactly one wins."""
    try:
        _publish(path, data, durable, SHARED, link=True)
    except FileExistsError:
        return False
    return True


def _publish(path: Union[str, Path], data: Union[bytes, Writer], durable: bool, mode: int, link: bool) -> None:
    """Write a temporary file in `path`'s directory and rename it to `path` (or link it there,
    which fails if `path` exists, then remove it)."""
    # Unique per writing thread, and cheaper than mkstemp's random names (thousands per sweep);
    # strings, because pathlib costs more than the system calls on the per-job path.
    directory, name = os.path.split(os.fspath(path))
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    try:
        try:
            fd = os.open(tmp, flags, mode)
        except FileNotFoundError:  # the first file of its directory
            os.makedirs(directory, exist_ok=True)
            fd = os.open(tmp, flags, mode)
        if isinstance(data, (bytes, bytearray, memoryview)):
            _write_all(fd, data, durable)
        else:
            with os.fdopen(fd, "wb") as file:
                data(file)
                file.flush()
                if durable:
                    os.fsync(file.fileno())
        (os.link if link else os.replace)(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if link:
        os.unlink(tmp)
    if durable:
        _sync_directory(directory or ".")


def append_line(path: Union[str, Path], line: bytes) -> None:
    """Append one record, a line ending in a newline, to `path`, a journal with one writer.

    Atomic as a record: a reader takes only the lines that end in a newline, so an append cut
    short (a killed process, a full disk) is a last line without one, skipped; its writer must
    then append to a new file, never after it. The file is opened and closed for each line:
    closing hands the line to an NFS server, so a reader that opens the file later sees it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    try:
        view = memoryview(line)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _write_all(fd: int, data: Union[bytes, bytearray, memoryview], durable: bool) -> None:
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _sync_directory(directory: str) -> None:
    """The rename itself survives a power cut once its directory is synced."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Union[str, Path], obj: Any, *, durable: bool = True) -> None:
    """One line: `indent` would turn json's C encoder off (3x slower, three writes a job);
    `jq . state.json` shows it indented."""
    write_atomic(path, (json.dumps(obj, sort_keys=True) + "\n").encode(), durable=durable)


# libyaml's C emitter and parser where PyYAML has them: the same text, 10x faster (a sweep's
# record lists every run id).
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def yaml_text(obj: Any) -> str:
    """`obj` as YAML, keys in their order (what `write_yaml` writes)."""
    return yaml.dump(obj, Dumper=DUMPER, sort_keys=False)


def write_yaml(path: Union[str, Path], obj: Any, *, durable: bool = True) -> None:
    """`obj` in YAML's JSON form (JSON is YAML), one item a line: any YAML reader reads it, and
    `read_yaml` parses it with json, 40x faster than libyaml (a sweep's record lists 100,000 run
    ids, and every `status` reads it). Files for people to edit are written by `yaml_text`."""
    write_atomic(path, (json.dumps(obj, indent=1) + "\n").encode(), durable=durable)


def write_text(path: Union[str, Path], text: str, *, durable: bool = True, mode: int = SHARED) -> None:
    write_atomic(path, text.encode(), durable=durable, mode=mode)


def write_parquet(path: Union[str, Path], frame: Any, *, durable: bool = True) -> None:
    """A pandas DataFrame as parquet, without its index."""
    write_atomic(path, lambda file: frame.to_parquet(file, index=False), durable=durable)


def read_json(path: Union[str, Path]) -> Optional[Any]:
    """None when missing; raises ValueError when unreadable (a truncated file)."""
    try:
        with open(path, "rb", buffering=0) as f:  # unbuffered: one read, no text layer
            data = f.read()
    except FileNotFoundError:
        return None
    try:
        return json.loads(data)
    except ValueError as e:  # not JSON, or not even UTF-8
        raise ValueError(f"{path}: unreadable JSON ({e})") from None


def read_yaml(path: Union[str, Path]) -> Any:
    """A YAML file as `yaml.safe_load` reads it (one in its JSON form, `write_yaml`'s, by json);
    raises FileNotFoundError and yaml.YAMLError."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:1] == b"{":
        with contextlib.suppress(ValueError):  # YAML's flow style that is not JSON
            return json.loads(data)
    return yaml.load(data, Loader=LOADER)
