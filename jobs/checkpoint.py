"""Checkpoint and snapshot files: written atomically, read with weights_only=True.

A checkpoint holds only tensors and plain Python values, so loading never unpickles code.
Files are run_dir/checkpoints/step_{step:07d}.pt, step = optimizer steps completed, each with a
digest sidecar (store/integrity.py) checked before loading; a bad file is quarantined and the
previous one used (the newest sound one wins).

Snapshots (run_dir/snapshots/step_{step:07d}.pt, same sidecars) are the weights alone at the steps
of `train.snapshots` (jobs/train.py `snapshot_steps`), kept for good: checkpoints rotate and a
finished run keeps only its last, while the evaluations of the mechanism over training
(jobs/evals/mechanism.py) read every snapshot.
"""

import errno
import logging
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from common.atomic import write_atomic
from store import integrity
from store.layout import RunPaths

log = logging.getLogger(__name__)

UNREADABLE = (RuntimeError, EOFError, OSError, pickle.UnpicklingError)


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(RunPaths(str(run_dir)).checkpoints)


def snapshot_dir(run_dir: Path) -> Path:
    return Path(RunPaths(str(run_dir)).snapshots)


def step_file(directory: Path, step: int) -> Path:
    """The file of `step` in a checkpoints or snapshots directory."""
    return directory / f"step_{step:07d}.pt"


def checkpoint_paths(run_dir: Path) -> list[Path]:
    """Checkpoint files, oldest first (the zero-padded step makes name order step order)."""
    return sorted(checkpoint_dir(run_dir).glob("step_*.pt"))


def snapshot_paths(run_dir: Path) -> list[Path]:
    """Snapshot files, oldest first."""
    return sorted(snapshot_dir(run_dir).glob("step_*.pt"))


def save_atomic(obj: object, path: Path) -> None:
    """torch.save through the project's atomic writer (temp file, fsync, rename, directory
    fsync): a reader (or a resumed run) sees the old file or the complete new one, never half."""
    write_atomic(path, lambda file: torch.save(obj, file))


def _save(state: Mapping, path: Path, what: str) -> None:
    """`state` to `path` atomically, then its digest; a full disk is said in one line."""
    try:
        save_atomic(dict(state), path)
        integrity.write_digest(path)
    except (OSError, RuntimeError) as error:
        if not _disk_full(error):
            raise
        raise OSError(errno.ENOSPC, f"disk full writing {what} {path} (the previous "
                      f"{what} is intact); free space or move store.root to a larger disk") from None


def save_checkpoint(state: Mapping, run_dir: Path, keep: int = 2) -> Path:
    """Save state["step"]'s checkpoint and keep only it and the keep - 1 before it.

    Files after it are dropped too: they can only be ones a resume skipped as unreadable.
    """
    path = step_file(checkpoint_dir(run_dir), state["step"])
    _save(state, path, "checkpoint")
    paths = checkpoint_paths(run_dir)
    position = paths.index(path)
    for stale in paths[: max(0, position + 1 - keep)] + paths[position + 1 :]:
        stale.unlink(missing_ok=True)
        integrity.sidecar(stale).unlink(missing_ok=True)
    return path


def keep_final_weights(run_dir: Path) -> None:
    """Once a run is done: keep only its newest checkpoint, without the optimizer state (two
    thirds of an AdamW checkpoint, and only a resume reads it; a finished run never resumes).
    Every step leaves a checkpoint that loads: the digest goes first (a checkpoint without one
    is read unchecked), the stripped file replaces the full one atomically, its digest follows,
    and only then are the older checkpoints removed. A checkpoint stripped already is left as it is."""
    paths = checkpoint_paths(run_dir)
    if not paths:
        return
    newest = paths[-1]
    state = load_checkpoint(newest)
    if "optimizer" in state:
        del state["optimizer"]
        integrity.sidecar(newest).unlink(missing_ok=True)
        save_atomic(state, newest)
        integrity.write_digest(newest)
    for stale in paths[:-1]:
        stale.unlink(missing_ok=True)
        integrity.sidecar(stale).unlink(missing_ok=True)


def save_snapshot(state: Mapping, run_dir: Path) -> Path:
    """Save state["step"]'s snapshot (step, n_layers, ancestors and the model's weights). A resumed
    run passes a snapshot step again only when its checkpoint precedes it, and then writes the
    same weights again (training resumes bit for bit)."""
    path = step_file(snapshot_dir(run_dir), state["step"])
    _save(state, path, "snapshot")
    return path


def snapshots(run_dir: Path) -> Iterator[dict]:
    """Every sound snapshot of the run, in step order, loaded one at a time; one that fails its
    digest or does not load is quarantined (store/integrity.py) with the reason and left out (only
    training writes them)."""
    for path in snapshot_paths(run_dir):
        reason = integrity.problem(path, full=True)
        if reason is None:
            try:
                state = load_checkpoint(path)
            except UNREADABLE as error:
                reason = f"{path.name}: does not load ({_first_line(error)})"
            else:
                yield state
                continue
        log.warning("quarantining snapshot %s: %s", path, reason)
        integrity.quarantine(path, reason)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def _disk_full(error: BaseException | None) -> bool:
    """ENOSPC or EDQUOT, also behind the RuntimeError ("unexpected pos") of torch's zip writer."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        error = error.__cause__ or error.__context__
    return False


def load_checkpoint(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def latest_checkpoint(run_dir: Path) -> dict | None:
    """Contents of the newest sound checkpoint; a newer file that fails its digest or does not
    load is quarantined (store/integrity.py) with the reason, and the one before it is tried."""
    for path in reversed(checkpoint_paths(run_dir)):
        reason = integrity.problem(path, full=True)
        if reason is None:
            try:
                return load_checkpoint(path)
            except UNREADABLE as error:
                reason = f"{path.name}: does not load ({_first_line(error)})"
        log.warning("quarantining checkpoint %s: %s", path, reason)
        integrity.quarantine(path, reason)
    return None
