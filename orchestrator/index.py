"""The store's index: every run's latest status in a few files instead of one directory per run,
so `status` of a 100,000-run sweep reads one snapshot and the tail of a journal.

    index/snapshot-<generation>.json   {"format", "generation", "folded": {journal: bytes of it
                                       the snapshot holds}, and the records as columns}
    index/journal/<writer>.jsonl       one record a line, {"run": run id, **record}; one writer each

A record is a run's state.json in brief, {"v", "status", "error", "jobs": {job: [status,
attempts]}}, appended after the state.json it summarises is written (orchestrator/store.py).
state.json stays the truth: the index is derived from it and rebuilt from it when lost. A
snapshot holds its records as columns (`_columns`), which json decodes ten times faster than a
mapping per run: 100,000 runs in a few tens of milliseconds.

Why it keeps the store's guarantees:

- Atomic. A snapshot is created whole under a new name and never rewritten (common/atomic.py
  `write_new`); a journal line is one append by its only writer, and a line cut short by a killed
  process has no newline, so readers skip it (and that writer is gone, so nothing follows it).
- Two drivers, or any number of jobs. Every process appends to a journal of its own, so no two
  writers share a file. The records of one run are ordered by `v`, the version its state.json
  carries, which grows with each write under the run's claim, so the newest record wins whatever
  order the journals are read in. Compaction folds the journals into the next snapshot
  generation; two compactors race for the same name and only one can create it; only the winner
  deletes what it folded, and a reader that sees a newer generation appear while it reads the
  journals starts over.
- Shared filesystems (NFS, Lustre). Only files are created, linked, renamed, appended to and
  read, and the one lock is the flock the store already takes on each run's claim: a journal's
  writer holds one on its journal for as long as it lives, so compaction deletes only journals
  whose writer is gone. Each append opens and closes the journal, which hands the line to an NFS
  server at once (close-to-open consistency), as each state.json write does.
- Rebuildable. `of_states` and `replace` make a snapshot from every run's state.json; `status`
  does it when the snapshot cannot be read or the index is gone, and says so
  (orchestrator/status.py)."""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

from common.atomic import append_line, write_new

INDEX, JOURNAL = "index", "journal"
FORMAT = 2  # the columns; 1 (a record per run) is still read
SNAPSHOT = re.compile(r"snapshot-(\d{12})\.json")
ERROR_CHARS = 300  # of a failed run's error, as `status` shows it
log = logging.getLogger(__name__)


class IndexDamaged(ValueError):
    """The newest snapshot cannot be read (damaged from outside: the writes are atomic)."""


def record(state: dict) -> dict:
    """A run's state in brief, as the index keeps it."""
    return {"v": state.get("version", 0), "status": state.get("status"),
            "error": (state.get("error") or "")[:ERROR_CHARS] or None,
            "jobs": {job: [entry.get("status"), entry.get("attempts", 0)]
                     for job, entry in state.get("jobs", {}).items()}}


@dataclass
class Index:
    """What the index says: the newest record of each run it knows."""
    generation: int  # of the snapshot read; -1 when there is none yet
    runs: dict[str, dict] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # journal -> bytes read (whole lines)
    unfolded: int = 0  # journal lines read past the snapshot

    def add(self, run_id: str, rec: dict) -> None:
        """Keep the newer of `rec` and the record held (equal versions are the same write)."""
        held = self.runs.get(run_id)
        if held is None or rec["v"] >= held["v"]:
            self.runs[run_id] = rec


def directory(root: str) -> str:
    return os.path.join(root, INDEX)


class Journal:
    """This process's journal in one store's index, created at its first append.

    It appears under its name already flocked by its writer (created under a temporary name,
    locked, then renamed), so compaction never mistakes a new journal for one whose writer is
    gone. After a failed append the journal is left for a new one: nothing may follow a line
    that may be cut short."""

    def __init__(self, root: str):
        self.dir = os.path.join(directory(root), JOURNAL)
        self.path: Optional[str] = None
        self.pid = 0
        self.lock_fd = -1

    def append(self, run_id: str, rec: dict) -> None:
        """Append a record; a failure is logged, not raised: the run's state.json is written
        already, and the index only lags until `status` reconciles or rebuilds it."""
        line = (json.dumps({"run": run_id, **rec}, separators=(",", ":")) + "\n").encode()
        try:
            if self.path is None or self.pid != os.getpid():  # a forked child writes its own
                self._create()
            assert self.path is not None  # _create() opened it
            append_line(self.path, line)
        except OSError as e:
            log.warning("index journal %s: %s; the index catches up from state.json", self.path, e)
            self.path = None

    def _create(self) -> None:
        name = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        os.makedirs(self.dir, exist_ok=True)
        hidden, path = os.path.join(self.dir, f".{name}.tmp"), os.path.join(self.dir, f"{name}.jsonl")
        fd = os.open(hidden, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held until this process ends
        os.rename(hidden, path)
        if self.lock_fd >= 0 and self.pid == os.getpid():
            os.close(self.lock_fd)  # the journal left after a failed append is free to fold
        self.path, self.pid, self.lock_fd = path, os.getpid(), fd


_JOURNALS: dict[str, Journal] = {}


def journal(root: str) -> Journal:
    """This process's journal in the index of the store at `root`: one per process and store,
    however many Store objects the process makes (a worker makes one per job)."""
    key = os.path.abspath(root)
    if key not in _JOURNALS:
        _JOURNALS[key] = Journal(key)
    return _JOURNALS[key]


# ---------------------------------------------------------------------------------------------
# Reading

def read(root: str) -> Index:
    """The newest snapshot with every journal line past it. Raises IndexDamaged when the newest
    snapshot cannot be read. Starts over when a compaction publishes while it reads."""
    while True:
        generation, snapshot = _newest(root)
        index = Index(generation, snapshot.get("runs", {}))
        try:
            for name in _journals(root):
                _read_journal(root, name, snapshot.get("folded", {}).get(name, 0), index)
        except FileNotFoundError:  # folded into a newer snapshot and deleted meanwhile
            continue
        if _generation(root) == generation:
            return index


def exists(root: str) -> bool:
    """Whether the store has an index at all (a snapshot or a journal)."""
    return _generation(root) >= 0 or bool(_journals(root))


def _snapshots(root: str) -> list[tuple[int, str]]:
    try:
        names = os.listdir(directory(root))
    except FileNotFoundError:
        return []
    return sorted(((int(m.group(1)), name) for name in names if (m := SNAPSHOT.fullmatch(name))), reverse=True)


def _generation(root: str) -> int:
    snapshots = _snapshots(root)
    return snapshots[0][0] if snapshots else -1


def _newest(root: str) -> tuple[int, dict]:
    while True:
        snapshots = _snapshots(root)
        if not snapshots:
            return -1, {}
        generation, name = snapshots[0]
        try:
            with open(os.path.join(directory(root), name), "rb") as f:
                snapshot = json.loads(f.read())
        except FileNotFoundError:  # superseded and deleted meanwhile
            continue
        except ValueError as e:
            raise IndexDamaged(f"{name}: unreadable ({e})") from None
        try:
            if snapshot.get("generation") != generation:
                raise ValueError(f"holds generation {snapshot.get('generation')!r}")
            return generation, {"runs": _records(snapshot), "folded": dict(snapshot.get("folded", {}))}
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            raise IndexDamaged(f"{name}: not an index snapshot of format 1 or {FORMAT} ({e!r})") from None


def _columns(runs: dict[str, dict]) -> dict:
    """The records as a snapshot holds them: a column per field; the errors (few) by run; the
    jobs as a number into a table of the distinct ones (a sweep's runs mostly share theirs)."""
    tables: dict[tuple, int] = {}
    jobs = [tables.setdefault(tuple((job, *entry) for job, entry in rec["jobs"].items()), len(tables))
            for rec in runs.values()]
    return {"runs": list(runs), "v": [rec["v"] for rec in runs.values()],
            "status": [rec["status"] for rec in runs.values()],
            "error": {rid: rec["error"] for rid, rec in runs.items() if rec["error"]},
            "jobs": jobs, "job_tables": [{job: [status, attempts] for job, status, attempts in table}
                                         for table in tables]}


def _records(snapshot: dict) -> dict[str, dict]:
    """The records of a snapshot (of format 1 or 2). Runs with the same jobs table share it:
    records are replaced, never changed in place."""
    if snapshot["format"] == 1:
        return dict(snapshot["runs"])
    if snapshot["format"] != FORMAT:
        raise ValueError(f"format {snapshot['format']!r}")
    tables, errors = snapshot["job_tables"], snapshot["error"]
    columns = (snapshot["runs"], snapshot["v"], snapshot["status"], snapshot["jobs"])
    if len({len(column) for column in columns}) != 1:
        raise ValueError("columns of different lengths")
    return {rid: {"v": v, "status": status, "error": errors.get(rid), "jobs": tables[jobs]}
            for rid, v, status, jobs in zip(*columns)}


def _journals(root: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(os.path.join(directory(root), JOURNAL)) if n.endswith(".jsonl"))
    except FileNotFoundError:
        return []


def _read_journal(root: str, name: str, offset: int, index: Index) -> None:
    """The whole lines of a journal past `offset` into `index` (a line without its newline is
    being written, or was cut short: it is not read)."""
    with open(os.path.join(directory(root), JOURNAL, name), "rb") as f:
        f.seek(offset)
        data = f.read()
    whole = data[:data.rfind(b"\n") + 1]
    index.sizes[name] = offset + len(whole)
    for line in whole.splitlines():
        try:
            rec = json.loads(line)
            index.add(rec.pop("run"), rec)
        except (ValueError, KeyError, TypeError, AttributeError):  # damaged from outside
            continue
        index.unfolded += 1


# ---------------------------------------------------------------------------------------------
# Writing snapshots

def compact(root: str, index: Optional[Index] = None) -> bool:
    """Fold the journals into the next snapshot generation (`index`: as read already, perhaps
    with records added), then delete the journals whose writer is gone (all folded) and the
    older snapshots. False when another process published that generation first."""
    index = index or read(root)
    with _gone_writers(root, index.sizes) as gone:
        if not _publish(root, index.generation + 1, index.runs, index.sizes):
            return False
        for name in gone:
            os.unlink(os.path.join(directory(root), JOURNAL, name))
    _drop_older(root, index.generation + 1)
    return True


def fold(root: str) -> None:
    """Fold what the journals hold past the snapshot into a new one: a sweep does it once its jobs
    are done, so that the next `status` reads one snapshot, not the hundreds of thousands of
    lines a large sweep writes. Never raises: a damaged index is `status`'s to rebuild, and one
    that cannot be written is read as it is."""
    try:
        found = read(root)
        if found.unfolded:
            compact(root, found)
    except (IndexDamaged, OSError) as e:
        log.warning("index of %s not folded: %s; `status` reads it as it is", root, e)


def of_states(states: Iterator[tuple[str, dict]]) -> Index:
    """The index of these states (each run's state.json), as `replace` writes it."""
    index = Index(-1)
    for run_id, state in states:
        index.add(run_id, record(state))
    return index


def replace(root: str, index: Index) -> None:
    """Make `index` (of every run's state, `of_states`) the newest snapshot. Journals are read
    on top of it from their start: for each run, the newest record wins. The older snapshots,
    perhaps damaged, are kept aside as `<name>.old`."""
    generation = _generation(root) + 1
    while not _publish(root, generation, index.runs, {}):
        generation = _generation(root) + 1
    _drop_older(root, generation, keep=True)


def _publish(root: str, generation: int, runs: dict, folded: dict) -> bool:
    snapshot = {"format": FORMAT, "generation": generation, "folded": folded, **_columns(runs)}
    path = os.path.join(directory(root), f"snapshot-{generation:012d}.json")
    os.makedirs(directory(root), exist_ok=True)
    return write_new(path, (json.dumps(snapshot, separators=(",", ":")) + "\n").encode())


def _drop_older(root: str, generation: int, keep: bool = False) -> None:
    """Delete (or, with `keep`, set aside) the snapshots older than `generation`."""
    for older, name in _snapshots(root):
        if older < generation:
            path = os.path.join(directory(root), name)
            with contextlib.suppress(FileNotFoundError):  # another process did it first
                if keep:
                    os.replace(path, f"{path}.old")
                else:
                    os.unlink(path)


@contextlib.contextmanager
def _gone_writers(root: str, sizes: dict[str, int]) -> Iterator[list[str]]:
    """The journals whose writer is gone (their flock could be taken, and is held until they
    are deleted) and whose whole lines were all read: after what was read, at most the cut-short
    line of a killed writer."""
    held: list[tuple[str, int]] = []
    try:
        for name, size in sizes.items():
            try:  # read-write: NFS locks a file exclusively only through a descriptor that can write
                fd = os.open(os.path.join(directory(root), JOURNAL, name), os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                complete = b"\n" not in os.pread(fd, os.fstat(fd).st_size - size, size)
            except BlockingIOError:
                complete = False
            if complete:
                held.append((name, fd))
            else:
                os.close(fd)
        yield [name for name, _ in held]
    finally:
        for _, fd in held:
            os.close(fd)
