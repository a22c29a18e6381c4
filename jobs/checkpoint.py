"""Checkpoint files: written atomically, read with weights_only=True, newest sound one wins.

A checkpoint holds only tensors and plain Python values, so loading never unpickles code.
Files are run_dir/checkpoints/step_{step:07d}.pt, step = optimizer steps completed, each with a
digest sidecar (store/integrity.py) checked before loading; a bad file is quarantined and the
previous one used.
"""

import errno
import logging
import pickle
from collections.abc import Mapping
from pathlib import Path

import torch

from common.atomic import write_atomic
from store import integrity
from store.layout import RunPaths

log = logging.getLogger(__name__)

UNREADABLE = (RuntimeError, EOFError, OSError, pickle.UnpicklingError)


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(RunPaths(str(run_dir)).checkpoints)


def checkpoint_paths(run_dir: Path) -> list[Path]:
    """Checkpoint files, oldest first (the zero-padded step makes name order step order)."""
    return sorted(checkpoint_dir(run_dir).glob("step_*.pt"))


def save_atomic(obj: object, path: Path) -> None:
    """torch.save through the project's atomic writer (temp file, fsync, rename, directory
    fsync): a reader (or a resumed run) sees the old file or the complete new one, never half."""
    write_atomic(path, lambda file: torch.save(obj, file))


def save_checkpoint(state: Mapping, run_dir: Path, keep: int = 2) -> Path:
    """Save state["step"]'s checkpoint and keep only it and the keep - 1 before it.

    Files after it are dropped too: they can only be ones a resume skipped as unreadable.
    """
    path = checkpoint_dir(run_dir) / f"step_{state['step']:07d}.pt"
    try:
        save_atomic(dict(state), path)
        integrity.write_digest(path)
    except (OSError, RuntimeError) as error:
        if not _disk_full(error):
            raise
        raise OSError(errno.ENOSPC, f"disk full writing checkpoint {path} (the previous "
                      f"checkpoint is intact); free space or move store.root to a larger disk") from None
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
                first = (str(error).strip().splitlines() or [type(error).__name__])[0]
                reason = f"{path.name}: does not load ({first[:200]})"
        log.warning("quarantining checkpoint %s: %s", path, reason)
        integrity.quarantine(path, reason)
    return None
