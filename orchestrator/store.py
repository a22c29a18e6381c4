"""The results store: a directory tree that is the single source of truth of every sweep.

    <root>/store.json                  {"format_version": 3}
    <root>/runs/<run_id>/config.yaml   resolved config (written by the run's first job)
    <root>/runs/<run_id>/state.json    per job: status, attempts, start/end times, host, pid, error;
                                       `version`, which grows with every write
    <root>/runs/<run_id>/metrics.json  {"metrics", "higher_is_better", "curves", "specs",
                                       "curve_specs"} merged over jobs (specs: common/metrics.py)
    <root>/runs/<run_id>/history.parquet, items/<eval>.parquet, checkpoints/, progress.json
    <root>/sweeps/<name>/sweep.yaml    overrides given (every invocation) and run ids
    <root>/sweeps/<name>/configs/      each invocation's run configs, one file (`record_sweep`)
    <root>/index/                      every run's latest status (orchestrator/index.py)

A run's directory is made by its first job, not by planning: planning 100,000 runs writes one
configs file instead of 100,000 directories (and a shared filesystem makes each one slow).

Every write goes through common/atomic.py (temp file in the same directory, rename), so a killed
process leaves either the old or the new file. Writes worth more than a rerun (sweep records,
the results of a job that ran a second or more) are also fsync'ed to survive a power cut; a lost
unsynced write reads as a missing or unreadable file, and the job reruns. Each state.json write
is followed by its record in the index, which `status` reads instead of every run's files.

Older formats are upgraded by orchestrator/upgrade.py the first time a sweep or a report writes
to such a store.

A job claims its run with an exclusive `flock` on `runs/<id>/.lock` for as long as it works on
it: the kernel releases it when the process dies, so a claim can never go stale on a local or
NFSv4 filesystem, and two sweeps sharing a run train it once. A `running` state whose claim is
free is stale (its process was killed).

Damage from outside (a truncated file, a disk that filled up, a copy cut short) is found by
`problems` (parse checks of the JSON files, checkpoint sizes against their digests) and undone by
`recover`: bad files are moved aside as `<name>.corrupt`, the state is rebuilt with every job to
do, and the next sweep reruns them (training resumes from the newest sound checkpoint)."""
from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import yaml

from common.atomic import read_json, read_yaml, write_json, write_text, write_yaml, yaml_text
from common.settings import setting, to_dict
from common.sweep_configs import CONFIGS, SweepConfigs, read_sweep_configs
from jobs import integrity
from orchestrator import index
from orchestrator.identity import PerSiblings

FORMAT_VERSION = 3
DONE, FAILED, RUNNING, PENDING, INTERRUPTED, CORRUPT = (
    "done", "failed", "running", "pending", "interrupted", "corrupt")
RUN_JSON = ("state.json", "metrics.json")  # a run's JSON files, parse-checked by `inspect`
WAITING = "waiting"  # a multi-node job whose nodes the cluster cannot give now (`waiting_for` says what)


class StoreError(RuntimeError):
    """The store cannot be used as asked (version, permissions, missing sweep)."""


@dataclass
class StoreConfig:
    root: str = setting()  # a directory; on a cluster, on the filesystem every node shares
    # What a run keeps of its checkpoints once every job of it is done (training keeps its last two
    # either way, to resume): `final_weights`, the last one without its optimizer state (all an
    # evaluation reads, jobs/checkpoint.py `keep_final_weights`); `last_two`, both as they are.
    keep_checkpoints: str = setting("final_weights", choices=("final_weights", "last_two"))


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


class Store:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.runs = self.root / "runs"
        self._root, self._runs = os.fspath(self.root), os.fspath(self.runs)

    # -- the store as a whole ------------------------------------------------------------------
    def check(self) -> None:
        """Refuse stores written by a newer version of this code (read-only check)."""
        try:
            meta = read_json(self.root / "store.json")
        except ValueError as e:
            raise StoreError(f"{e}; restore it or point store.root elsewhere") from None
        if meta and meta.get("format_version", 0) > FORMAT_VERSION:
            raise StoreError(
                f"store {self.root} has format version {meta['format_version']}, newer than this "
                f"code's {FORMAT_VERSION}; upgrade the orchestrator or use another store.root")

    def format_version(self) -> int:
        meta = read_json(self.root / "store.json")
        return int(meta.get("format_version", 1)) if meta else FORMAT_VERSION

    def create(self) -> None:
        """Make the store writable (first real sweep); fails clearly without permission."""
        self.check()
        try:
            self.runs.mkdir(parents=True, exist_ok=True)
            (self.root / "sweeps").mkdir(parents=True, exist_ok=True)
            os.makedirs(index.directory(self._root), exist_ok=True)
            if not (self.root / "store.json").exists():
                write_json(self.root / "store.json", {"format_version": FORMAT_VERSION})
            probe = self.runs / f".write-test-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as e:  # permissions, a read-only file system, a file in the way
            raise StoreError(f"store.root={self.root}: not writable ({e.strerror}); fix its "
                             f"permissions or choose another store.root") from None

    # -- runs ----------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> Path:
        return self.runs / run_id

    def run_file(self, run_id: str, name: str) -> str:
        """A file of the run as a string: every job reads and writes several, and pathlib costs
        more than the system calls (a quarter of a no-op job's time)."""
        return os.path.join(self._runs, run_id, name)

    def _checkpoints(self, run_id: str) -> list[str]:
        """The run's checkpoint files, oldest first (one listing: `report` checks 100,000 runs)."""
        directory = self.run_file(run_id, "checkpoints")
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        return sorted(os.path.join(directory, n) for n in names if n.startswith("step_") and n.endswith(".pt"))

    def write_config(self, run_id: str, cfg: Any, text: Optional[str] = None) -> None:
        """The run's resolved config (`text`, or `config_yaml(cfg)`), once: it never changes.
        Not fsync'ed: the sweep's configs file holds it durably, and a job writes it again."""
        path = self.run_file(run_id, "config.yaml")
        if not os.path.exists(path):
            write_text(path, text if text is not None else config_yaml(cfg), durable=False)

    def read_config(self, run_id: str) -> dict:
        return read_yaml(self.run_file(run_id, "config.yaml"))

    def run_ids(self) -> list[str]:
        return sorted(p.name for p in self.runs.iterdir() if p.is_dir()) if self.runs.exists() else []

    def started_runs(self) -> set[str]:
        """The runs that have a directory: a job has claimed them (or a store of format 2 or
        earlier planned them). One listing, not a look-up per run."""
        try:
            return set(os.listdir(self._runs))
        except FileNotFoundError:
            return set()

    def read_state(self, run_id: str) -> dict:
        """The run's state; a corrupt file reads as status `corrupt` (never raises)."""
        try:
            state = read_json(self.run_file(run_id, "state.json"))
        except ValueError as e:
            return {"run_id": run_id, "status": CORRUPT, "jobs": {}, "error": str(e)}
        return state or _untouched(run_id)

    def job_state(self, run_id: str, job: str) -> dict:
        return self.read_state(run_id).get("jobs", {}).get(job, {"status": PENDING, "attempts": 0})

    def update_job(self, run_id: str, job: str, jobs: list[str], durable: bool = True,
                   state: Optional[dict] = None, **fields: Any) -> dict:
        """Set fields of one job's state and recompute the run's status from all its jobs.

        `state` is the run's current state where the caller holds the claim and has it already
        (a read less per write); it is updated in place and returned."""
        state = self.read_state(run_id) if state is None else state
        if state["status"] == CORRUPT:
            state = {"run_id": run_id, "jobs": {}, "recovered_from": state["error"]}
        entry = state.setdefault("jobs", {}).setdefault(job, {"status": PENDING, "attempts": 0})
        entry.update(fields)
        state["run_id"] = run_id
        state["status"] = run_status([state["jobs"].get(j, {}).get("status", PENDING) for j in jobs])
        state["error"] = next((state["jobs"][j].get("error") for j in jobs
                               if state["jobs"].get(j, {}).get("status") == FAILED), None)
        self._write_state(run_id, state, durable)
        return state

    def _write_state(self, run_id: str, state: dict, durable: bool = True) -> None:
        """state.json, then its record in the index. `version` orders the records of a run: one
        more than the state's last, and at least the time in milliseconds, so a state rebuilt
        after damage (its count lost) still outranks the records of the one it replaces."""
        state["version"] = max(state.get("version", 0) + 1, time.time_ns() // 1_000_000)
        write_json(self.run_file(run_id, "state.json"), state, durable=durable)
        index.journal(self._root).append(run_id, index.record(state))

    def start_job(self, run_id: str, job: str, jobs: list[str], state: Optional[dict] = None,
                  **fields: Any) -> dict:
        """Mark the job running here (plus `fields`). Not fsync'ed: lost in a power cut, the state
        reads as before the start, and the job is rerun all the same."""
        state = self.read_state(run_id) if state is None else state
        attempts = state.get("jobs", {}).get(job, {}).get("attempts", 0) + 1
        return self.update_job(run_id, job, jobs, False, state, status=RUNNING, attempts=attempts,
                               started_at=now(), ended_at=None, host=socket.gethostname(),
                               pid=os.getpid(), error=None, **fields)

    def end_job(self, run_id: str, job: str, jobs: list[str], error: Optional[str] = None,
                durable: bool = True, state: Optional[dict] = None, **fields: Any) -> dict:
        return self.update_job(run_id, job, jobs, durable, state, status=FAILED if error else DONE,
                               ended_at=now(), error=error, **fields)

    def claim(self, run_id: str, wait: bool = True) -> contextlib.AbstractContextManager[bool]:
        """Exclusive claim of a run; yields False (without blocking) if `wait` is False and
        another process holds it."""
        return _flock(self.run_file(run_id, ".lock"), wait)

    def is_claimed(self, run_id: str) -> bool:
        if not os.path.exists(self.run_file(run_id, ".lock")):
            return False
        with self.claim(run_id, wait=False) as got:
            return not got

    def read_metrics(self, run_id: str) -> dict:
        try:
            return read_json(self.run_file(run_id, "metrics.json")) or {}
        except ValueError:
            return {}

    def merge_metrics(self, run_id: str, metrics: dict, specs: dict, curves: dict, curve_specs: dict,
                      durable: bool = True) -> dict:
        """Add a job's results (metric values and curves, each with the record of its spec) to
        the run's; returns the run's results as written. `higher_is_better` repeats the specs'
        directions for readers of format 1."""
        current = self.read_metrics(run_id)
        merged = {
            "metrics": {**current.get("metrics", {}), **metrics},
            "higher_is_better": {**current.get("higher_is_better", {}),
                                 **{name: spec["higher_is_better"] for name, spec in specs.items()
                                    if spec.get("higher_is_better") is not None}},
            "curves": {**current.get("curves", {}), **curves},
            "specs": {**current.get("specs", {}), **specs},
            "curve_specs": {**current.get("curve_specs", {}), **curve_specs},
        }
        write_json(self.run_file(run_id, "metrics.json"), merged, durable=durable)
        return merged

    # -- damage: found by parse checks and digests, repaired by rerunning -----------------------
    def problems(self, run_id: str) -> list[str]:
        """What is wrong with the run's files, one line each; cheap (no checkpoint is hashed)."""
        return self.inspect(run_id)[0]

    def inspect(self, run_id: str) -> tuple[list[str], dict[str, Optional[dict]]]:
        """The run's problems, and its JSON files (state.json, metrics.json) as parsed: None when
        missing or unreadable (`report` hands them to the analysis, which reads no file twice)."""
        found, parsed, unreadable = [], {}, set()
        for name in RUN_JSON:
            try:
                parsed[name] = read_json(self.run_file(run_id, name))
            except ValueError as e:  # "<path>: unreadable JSON (<why>)"
                parsed[name] = None
                unreadable.add(name)
                found.append(f"{name} {str(e).split(': ', 1)[1]}")
        jobs = (parsed["state.json"] or {}).get("jobs", {})
        no_metrics = parsed["metrics.json"] is None and "metrics.json" not in unreadable
        if no_metrics and any(j.get("status") == DONE for j in jobs.values()):
            found.append("metrics.json missing although a job is done")
        for path in self._checkpoints(run_id):
            if bad := integrity.problem(path, full=False):
                found.append(f"checkpoint {bad}")
        return found, parsed

    def recover(self, run_id: str, jobs: list[str]) -> dict:
        """Undo the run's problems (the caller holds its claim): bad files are moved aside and
        every job is set to do again, keeping its attempt count. Returns the run's state, with
        the problems found this time last in its `recovered` list."""
        found, parsed = self.inspect(run_id)
        if not found:
            return parsed["state.json"] or _untouched(run_id)
        run_dir, state = self.run_dir(run_id), parsed["state.json"] or {}
        for name in RUN_JSON:
            try:
                read_json(run_dir / name)
            except ValueError:
                os.replace(run_dir / name, run_dir / f"{name}.corrupt")
        for path in self._checkpoints(run_id):
            if bad := integrity.problem(path, full=False):
                integrity.quarantine(path, bad)
        old = state.get("jobs", {})
        state = {"run_id": run_id, "status": PENDING, "error": None, "version": state.get("version", 0),
                 "jobs": {j: {"status": PENDING, "attempts": old.get(j, {}).get("attempts", 0)}
                          for j in dict.fromkeys([*jobs, *old])},
                 "recovered": state.get("recovered", []) + [{"at": now(), "problem": p} for p in found]}
        self._write_state(run_id, state)
        return state

    def recovered(self, run_id: str) -> list[str]:
        """Past problems of the run that were repaired: state notes and quarantined checkpoints."""
        notes = [f"{r['at']} {r['problem']}" for r in self.read_state(run_id).get("recovered", [])]
        return notes + integrity.quarantined(self.run_dir(run_id) / "checkpoints")

    def is_stale(self, run_id: str, state: dict) -> bool:
        """The state says a job is running but no process holds the run's claim."""
        return state.get("status") == RUNNING and not self.is_claimed(run_id)

    def write_progress(self, run_id: str, progress: dict) -> None:
        write_json(self.run_file(run_id, "progress.json"), progress, durable=False)

    def read_progress(self, run_id: str) -> dict:
        try:
            return read_json(self.run_file(run_id, "progress.json")) or {}
        except ValueError:
            return {}

    # -- sweeps --------------------------------------------------------------------------------
    def sweep_dir(self, name: str) -> Path:
        return self.root / "sweeps" / name

    def sweeps(self) -> list[str]:
        d = self.root / "sweeps"
        return sorted(p.name for p in d.iterdir() if (p / "sweep.yaml").exists()) if d.exists() else []

    def read_sweep(self, name: str) -> dict:
        path = self.sweep_dir(name) / "sweep.yaml"
        if not path.exists():
            known = ", ".join(self.sweeps()) or "none yet"
            raise StoreError(f"no sweep named {name!r} in {self.root}; known sweeps: {known}")
        try:
            return read_yaml(path)
        except yaml.YAMLError as e:
            raise StoreError(f"{path}: unreadable ({str(e).splitlines()[0]}); restore it from a "
                             f"backup or delete it and run the sweep again") from None

    def record_sweep(self, name: str, overrides: list[str], run_ids: list[str],
                     configs: Optional[list[Any]] = None) -> dict:
        """Create or extend a sweep: run ids are a growing set, each invocation is recorded, and
        the configs of its runs (`configs`, in the order of `run_ids`) are written in one file
        (common/sweep_configs.py)."""
        if configs is not None:
            stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
            write_json(self.sweep_dir(name) / CONFIGS / f"{stamp}-{os.getpid()}.json",
                       configs_record(run_ids, configs))

        def extend(sweep: Optional[dict]) -> dict:
            sweep = sweep or {"name": name, "created_at": now(), "format_version": FORMAT_VERSION,
                              "invocations": [], "run_ids": []}
            sweep["invocations"].append({"at": now(), "overrides": list(overrides)})
            sweep["overrides"] = list(overrides)
            sweep["run_ids"] = list(dict.fromkeys(sweep["run_ids"] + run_ids))
            return sweep
        return self._change_sweep(name, extend)

    def record_look(self, name: str, look: dict) -> dict:
        """Append one look of an adaptive sweep (its seeds, decision and verdicts)."""
        return self._change_sweep(name, lambda sweep: {**sweep, "looks": [*sweep.get("looks", []),
                                                                          {"at": now(), **look}]})

    def record_slurm_job(self, name: str, job: dict) -> dict:
        """Append one submitted Slurm job of the sweep (id, kind, script; orchestrator/executors/slurm_tools.py)."""
        return self._change_sweep(name, lambda sweep: {**sweep, "slurm_jobs": [*sweep.get("slurm_jobs", []), job]})

    def _change_sweep(self, name: str, change: Callable[[Any], dict]) -> dict:
        """Read, change and write sweep.yaml under the sweep's flock, so that two drivers
        extending one sweep at once both land. `change` gets None when there is no sweep.yaml yet."""
        path = self.sweep_dir(name) / "sweep.yaml"
        os.makedirs(path.parent, exist_ok=True)
        with _flock(os.fspath(path.parent / ".lock"), wait=True):
            sweep = change(read_yaml(path) if path.exists() else None)
            write_yaml(path, sweep)
        return sweep

    def sweep_configs(self, name: str) -> SweepConfigs:
        return read_sweep_configs(self.sweep_dir(name))


def config_dict(cfg: Any) -> dict:
    """What a run's config.yaml holds: its resolved config, without the sweep that runs it
    (`tracker.sweep`, its W&B group), so a run shared by sweeps has one config."""
    plain = to_dict(cfg)
    plain["tracker"]["sweep"] = None
    return plain


def config_yaml(cfg: Any) -> str:
    return yaml_text(config_dict(cfg))


def configs_record(run_ids: list[str], configs: list[Any]) -> dict:
    """The configs file of these runs: each group of seed variants' config once."""
    plain: list[dict] = []

    def add(cfg: Any) -> int:
        plain.append(config_dict(cfg))
        return len(plain) - 1
    group = PerSiblings(add)
    return {"configs": plain, "runs": {run_id: [group(cfg), cfg.seed] for run_id, cfg in zip(run_ids, configs)}}


@contextlib.contextmanager
def _flock(path: str, wait: bool) -> Iterator[bool]:
    """An exclusive flock on `path` (created if missing) while the block runs; yields False
    (without blocking) if `wait` is False and another process holds it."""
    try:
        f = open(path, "a")
    except FileNotFoundError:  # a run no job has claimed yet
        os.makedirs(os.path.dirname(path), exist_ok=True)
        f = open(path, "a")
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _untouched(run_id: str) -> dict:
    """The state of a run no job has started."""
    return {"run_id": run_id, "status": PENDING, "jobs": {}}


def run_status(job_statuses: list[str]) -> str:
    """A run is done when all its jobs are; failed/running/waiting/interrupted win over pending."""
    for status in (FAILED, RUNNING, WAITING, INTERRUPTED):
        if status in job_statuses:
            return status
    return DONE if job_statuses and all(s == DONE for s in job_statuses) else PENDING
