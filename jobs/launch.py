"""Multi-process jobs: build and run a `torchrun` command, and the records its ranks print.

`run_torchrun` is the one way this project starts `torchrun` (the torch backend's DDP training
uses it through `python -m jobs.rank`; other trainers pass their own entry script or module).
It uses torchrun's static rendezvous: every node is told the node count, its rank and the
address of node rank 0, so no rendezvous server is needed.

Ranks speak to the launcher on stdout with one-line JSON records: `@@progress {...}` from rank 0
(relayed to the orchestrator's live view) and `@@error {...}` from a rank that failed (the
reason the launcher reports). jobs never imports orchestrator, so this is the whole protocol.
"""
from __future__ import annotations

import collections
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

import pandas as pd

from common.atomic import write_json
from jobs.contract import JobResult

PROGRESS, ERROR = "@@progress ", "@@error "
_EXCEPTION_LINE = re.compile(r"^(?:\[[^\]]*\]:?\s*)?([A-Za-z_][\w.]*(?:Error|Exception)): .+")


class LaunchError(RuntimeError):
    """torchrun exited non-zero; the message is the failing rank's own error line."""


def free_port() -> int:
    """A TCP port free on this host right now (the rendezvous binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def torchrun_command(entry: Sequence[str], *, nnodes: int, nproc_per_node: int, node_rank: int,
                     master_addr: str, master_port: int) -> list[str]:
    """`python -m torch.distributed.run` with a static rendezvous, then `entry`: a script and
    its arguments, or `["-m", "package.module", *args]`."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}",
            f"--nproc_per_node={nproc_per_node}", f"--node_rank={node_rank}",
            f"--master_addr={master_addr}", f"--master_port={master_port}", "--max_restarts=0",
            *entry]


def die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies (a force-cancelled Ray worker is
    SIGKILLed and cannot clean up; torchrun then stops its ranks on that SIGTERM)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def run_torchrun(entry: Sequence[str], *, nproc_per_node: int, nnodes: int = 1, node_rank: int = 0,
                 master_addr: str = "127.0.0.1", master_port: Optional[int] = None,
                 threads_per_proc: int = 1, env: Optional[dict[str, str]] = None,
                 on_line: Optional[Callable[[str], None]] = None, cwd: Optional[str] = None) -> None:
    """Run torchrun for this node and wait for it; raises LaunchError with the child's error line.

    Every output line of the ranks goes to `on_line` (progress records included). If the caller
    is interrupted (a cancelled Ray task raises KeyboardInterrupt), the whole process group of
    torchrun and its ranks is terminated before the exception propagates."""
    command = torchrun_command(entry, nnodes=nnodes, nproc_per_node=nproc_per_node,
                               node_rank=node_rank, master_addr=master_addr,
                               master_port=master_port if master_port is not None else free_port())
    threads = str(max(1, threads_per_proc))
    child_env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                 "PYTHONUNBUFFERED": "1", **(env or {})}
    tail: collections.deque[str] = collections.deque(maxlen=50)
    reported: list[str] = []
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=child_env, cwd=cwd, start_new_session=True,
                            preexec_fn=die_with_parent, bufsize=1)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            error = _record(line, ERROR)
            if error is not None:
                reported.append(error["error"])
            elif line.strip():
                tail.append(line)
            if on_line is not None:
                on_line(line)
        code = proc.wait()
    except BaseException:
        _stop(proc)
        raise
    if code != 0:
        raise LaunchError(f"torchrun (node {node_rank} of {nnodes}, {nproc_per_node} processes) "
                          f"exited with {code}: {reported[0] if reported else last_error(tail)}")


def _stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the child's process group, then SIGKILL whatever is left after `grace_s`."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def last_error(lines: Sequence[str]) -> str:
    """The last `SomeError: message` line that is not torchrun's own summary, else the last line."""
    for line in reversed(lines):
        m = _EXCEPTION_LINE.match(line.strip())
        if m and "ChildFailedError" not in m.group(1):
            return line.strip()
    return lines[-1].strip() if lines else "no output"


def _record(line: str, marker: str) -> Optional[dict]:
    """The `marker {...}` record in a line of the ranks' shared output, or None.

    A record is written with one write(2) so it is never split, but another rank's unterminated
    output (a traceback on stderr) may precede it on the same line; whatever follows the JSON
    object is ignored."""
    at = line.find(marker)
    if at < 0:
        return None
    try:
        record, _ = json.JSONDecoder().raw_decode(line, at + len(marker))
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) else None


def parse_progress(line: str) -> Optional[dict]:
    """The progress record carried by a line of rank 0's output, or None."""
    return _record(line, PROGRESS)


def emit(marker: str, record: dict) -> None:
    """One record line on stdout in a single write(2): lines from several ranks share one pipe,
    and writes under PIPE_BUF (4 KiB) to a pipe never interleave."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (marker + json.dumps(record) + "\n").encode())


# ---------------------------------------------------------------------------------------------
# Job results cross the process boundary as JSON (no pickles).

def dump_result(result: JobResult, path: Path) -> None:
    frames = {k: None if df is None else df.to_dict(orient="list")
              for k, df in (("items", result.items), ("history", result.history))}
    write_json(path, {"metrics": result.metrics, "curves": result.curves, **frames}, durable=False)


def load_result(path: Path) -> JobResult:
    raw = json.loads(Path(path).read_text())
    frames = {k: None if raw[k] is None else pd.DataFrame(raw[k]) for k in ("items", "history")}
    return JobResult(metrics=raw["metrics"], curves=raw["curves"], **frames)
