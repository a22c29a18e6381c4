"""The store's settings in the run config; the store itself is the `store` package."""
from __future__ import annotations

from dataclasses import dataclass

from common.settings import setting


@dataclass
class StoreConfig:
    root: str = setting()  # a directory; on a cluster, on the filesystem every node shares
    # What a run keeps of its checkpoints once every job of it is done (training keeps its last two
    # either way, to resume): `final_weights`, the last one without its optimizer state (all an
    # evaluation reads, jobs/checkpoint.py `keep_final_weights`); `last_two`, both as they are.
    keep_checkpoints: str = setting("final_weights", choices=("final_weights", "last_two"))
