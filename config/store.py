"""store: where the runs' files live (conf/config.yaml); not part of the run id."""
from __future__ import annotations

from dataclasses import dataclass

from common.settings import setting


@dataclass(frozen=True)
class StoreConfig:
    root: str = setting()  # a directory; on a cluster, on the filesystem every node shares
    # What a run keeps of its checkpoints once every job of it is done (training keeps its last two
    # either way, to resume): `final_weights`, the last one without its optimizer state (all an
    # evaluation reads, jobs/checkpoint.py `keep_final_weights`); `last_two`, both as they are.
    keep_checkpoints: str = setting("final_weights", choices=("final_weights", "last_two"))
