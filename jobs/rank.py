"""One rank of a multi-process job, started by torchrun (jobs/launch.py):

    python -m jobs.rank --job train --config cfg.json --run-dir D --result R

Every rank runs the same job on its share (DDP); rank 0 reports progress as `@@progress`
records and writes the job's result to R; a rank that fails prints an `@@error` record."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from config.run import load_job_config
from jobs.launch import ERROR, PROGRESS, die_with_parent, dump_result, emit
from jobs.registry import get_job


def init_distributed() -> None:
    """NCCL when this rank drives a GPU, gloo otherwise (CPU DDP, how it is tested here)."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="one rank of a multi-process job")
    parser.add_argument("--job", required=True)
    parser.add_argument("--config", required=True, type=Path, help="the job's config (JSON)")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--result", required=True, type=Path, help="where rank 0 writes the result")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    die_with_parent()

    torch.set_num_threads(args.threads)
    cfg = load_job_config(json.loads(args.config.read_text()))
    rank = int(os.environ.get("RANK", 0))
    init_distributed()
    try:
        def progress(p: dict) -> None:
            emit(PROGRESS, p)
        result = get_job(args.job).fn(cfg, args.run_dir, progress if rank == 0 else (lambda p: None))
        if rank == 0:
            dump_result(result, args.result)
    except Exception as e:
        emit(ERROR, {"rank": rank, "error": f"rank {rank}: {type(e).__name__}: {e}"[:2000]})
        raise
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
