"""Digests of written files, so a truncated or altered checkpoint is known before it is used.

Each checkpoint `step_XXXXXXX.pt` has a sidecar `step_XXXXXXX.pt.sha256` holding
{"bytes": size, "sha256": hex digest}. `problem(path, full=False)` compares only the size (cheap
enough for `status` on large checkpoints); `full=True` also hashes the file (done before loading).
A bad file is quarantined: renamed to `<name>.corrupt` and a line appended to `quarantine.log` in
its directory, which is the record `status` shows. No torch: the orchestrator reads these without
importing it.
"""

import datetime as dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from common.atomic import write_json

QUARANTINE_LOG = "quarantine.log"


def is_checkpoint(name: str) -> bool:
    """Whether a file name of a run's checkpoints directory is a checkpoint (not a sidecar)."""
    return name.startswith("step_") and name.endswith(".pt")


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def digest(path: Path) -> dict[str, Any]:
    h = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            h.update(block)
    return {"bytes": path.stat().st_size, "sha256": h.hexdigest()}


def write_digest(path: Path) -> None:
    """Write `path`'s sidecar atomically (and durably, like the checkpoint it describes)."""
    write_json(sidecar(Path(path)), digest(Path(path)))


def problem(path: str | Path, full: bool = True) -> str | None:
    """What is wrong with `path` according to its sidecar, or None (also when it has none: a
    file written before digests existed, or by a process killed between file and sidecar)."""
    path = Path(path)
    try:
        expected = json.loads(sidecar(path).read_text())
        size, want = int(expected["bytes"]), str(expected["sha256"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as error:
        return f"{path.name}: its digest file is unreadable ({error})"
    actual = path.stat().st_size
    if actual != size:
        return f"{path.name}: {actual} bytes, its digest says {size} (truncated or overwritten)"
    if full and digest(path)["sha256"] != want:
        return f"{path.name}: sha256 does not match its digest (altered on disk)"
    return None


def quarantine(path: str | Path, reason: str) -> Path:
    """Move a bad file aside (kept for inspection) and record why; returns its new path."""
    path = Path(path)
    moved = path.with_name(path.name + ".corrupt")
    os.replace(path, moved)
    sidecar(path).unlink(missing_ok=True)
    at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    with open(path.parent / QUARANTINE_LOG, "a") as log:
        log.write(f"{at} {reason}; moved to {moved.name}\n")
    return moved


def quarantined(directory: Path) -> list[str]:
    """The lines of `directory`'s quarantine log (empty when nothing was ever quarantined)."""
    try:
        return (Path(directory) / QUARANTINE_LOG).read_text().splitlines()
    except FileNotFoundError:
        return []
