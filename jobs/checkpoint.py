"""Checkpoint files: written atomically, read with weights_only=True, newest sound one wins.

A checkpoint holds only tensors and plain Python values, so loading never unpickles code.
Files are run_dir/checkpoints/step_{step:07d}.pt, step = optimizer steps completed, each with a
digest sidecar (jobs/integrity.py) checked before loading; a bad file is quarantined and the
previous one used.
"""

import errno
import logging
import os
import pickle
import tempfile
from collections.abc import Mapping
from pathlib import Path

import torch

from jobs import integrity
from jobs.families import build_model
from jobs.model import Decoder

log = logging.getLogger(__name__)

UNREADABLE = (RuntimeError, EOFError, OSError, pickle.UnpicklingError)


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def checkpoint_paths(run_dir: Path) -> list[Path]:
    """Checkpoint files, oldest first (the zero-padded step makes name order step order)."""
    return sorted(checkpoint_dir(run_dir).glob("step_*.pt"))


def save_atomic(obj: object, path: Path) -> None:
    """torch.save to a temp file in the same directory, fsync, then rename over `path`.

    A reader (or a resumed run) therefore sees the old file or the complete new one, never half.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


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
    load is quarantined (jobs/integrity.py) with the reason, and the one before it is tried."""
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


def load_model(cfg: Mapping, run_dir: Path) -> Decoder:
    """The finished run's model on CPU in eval mode; refuses a run that has not finished."""
    if cfg["backend"]["name"] == "nanotron":  # its final checkpoint, through the bridge
        from jobs.nanotron.bridge import final_model
        return final_model(cfg, run_dir).eval()
    state = latest_checkpoint(run_dir)
    steps = cfg["train"]["steps"]
    if state is None or state["step"] != steps:
        found = "no checkpoint" if state is None else f"step {state['step']}"
        raise FileNotFoundError(f"{run_dir} has no final checkpoint (step {steps}); found {found}")
    model = build_model(cfg, state["ancestors"])
    model.load_state_dict(state["model"])
    return model.eval()
