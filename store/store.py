"""The results store: a directory tree that is the single source of truth of every sweep
(its files: store/layout.py; its records: store/records.py).

A run's directory is made by its first job, not by planning: planning 100,000 runs writes one
configs file instead of 100,000 directories (and a shared filesystem makes each one slow).

Every write goes through common/atomic.py (temp file in the same directory, rename), so a killed
process leaves either the old or the new file. Writes worth more than a rerun (sweep records,
the results of a job that ran a second or more) are also fsync'ed to survive a power cut; a lost
unsynced write reads as a missing or unreadable file, and the job reruns. Each state.json write
is followed by its record in the index, which `status` reads instead of every run's files.

What a store root may be (`Store.check`, used by sweep, dry run, status, report and the
analysis): absent or an empty directory, a new store (made only by a real sweep, `create`); a
store of ours, known by its marker (store.json) or, for formats 1 to 3, by
`{"format_version": N}` beside our directories, upgraded in place by the first sweep or report
that writes (store/upgrade.py); anything else (a file, someone else's store.json, a newer
format, a directory of unrelated files) is refused and left as it is.

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
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Union

from common.atomic import read_json, write_json, write_text
from store import index, integrity
from store.layout import FORMAT_VERSION, MARKER, METRICS, OWNER, RUN_JSON, STATE, TOP_LEVEL, Layout, RunPaths
from store.records import (ConfigsRecord, Environment, EnvironmentEntry, Metrics, RunState, SlurmJob, SweepConfigs,
                           SweepManifest, marker, new_manifest, now, read_config, read_environment,
                           read_manifest, read_metrics, read_state, read_sweep_configs, write_environment,
                           write_manifest, write_metrics, write_state, write_sweep_configs)

DONE, FAILED, RUNNING, PENDING, INTERRUPTED, CORRUPT = (
    "done", "failed", "running", "pending", "interrupted", "corrupt")
WAITING = "waiting"  # a multi-node job whose nodes the cluster cannot give now (`waiting_for` says what)
SHOWN = 3  # unrelated files a refusal names


class StoreError(RuntimeError):
    """The store cannot be used as asked (not ours, a newer format, permissions, missing sweep)."""


def format_of(root: Union[str, os.PathLike[str]]) -> Optional[int]:
    """The format of the store at `root`, None for a new one (absent, or an empty directory);
    StoreError, naming what is there, for anything that is not a store of ours. Reads only."""
    layout = Layout(root)
    where = f"store.root={layout.root}"
    fix = "choose another store.root (a new or empty directory, or a store of this orchestrator)"
    if not os.path.isdir(layout.root):
        if os.path.lexists(layout.root):
            raise StoreError(f"{where} is a file, not a results store; {fix}")
        return None
    try:
        with open(layout.marker, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        names = sorted(os.listdir(layout.root))
        # A store being created by another sweep holds only our directories, and the marker's
        # temporary file (common/atomic.py), until its marker is written.
        unrelated = [n for n in names if n not in TOP_LEVEL and not n.startswith(f".{MARKER}.")]
        if unrelated:
            raise StoreError(f"{where} holds files that are not a results store "
                             f"({', '.join(unrelated[:SHOWN])}{', ...' if len(unrelated) > SHOWN else ''}) "
                             f"and no {MARKER}; {fix}") from None
        return None
    except OSError as e:
        raise StoreError(f"{where}: {MARKER} cannot be read ({e.strerror}); {fix}") from None
    try:
        meta = json.loads(text)
    except ValueError:
        raise StoreError(f"{where}: {MARKER} is not JSON, so not this orchestrator's store; "
                         f"restore it from a backup or {fix}") from None
    version = _version(meta, layout)
    if version is None:
        shown = json.dumps(meta)
        raise StoreError(f"{where}: {MARKER} holds {shown[:80]}{'...' if len(shown) > 80 else ''}, "
                         f"not this orchestrator's marker; {fix}")
    if version > FORMAT_VERSION:
        raise StoreError(f"store {layout.root} has format version {version}, newer than this code's "
                         f"{FORMAT_VERSION}; upgrade the orchestrator or use another store.root")
    return version


def _version(meta: Any, layout: Layout) -> Optional[int]:
    """The format a store.json of ours says, None when it is not ours: the marker, or (formats
    1 to 3, before the marker) `{"format_version": N}` beside our runs or sweeps directory; a
    larger N is ours from a newer code."""
    if not isinstance(meta, dict) or type(meta.get("format_version")) is not int:
        return None
    if meta.keys() == {"store", "format_version"} and meta["store"] == OWNER:
        return int(meta["format_version"])
    if meta.keys() != {"format_version"}:
        return None
    version = int(meta["format_version"])
    if version > FORMAT_VERSION:  # ours, from a newer code than this one (refused as such)
        return version
    ours = os.path.isdir(layout.runs) or os.path.isdir(layout.sweeps)
    return version if version < FORMAT_VERSION and ours else None


class Store:
    def __init__(self, root: Union[str, os.PathLike[str]]):
        self.root = Path(root)
        self.layout = Layout(root)

    # -- the store as a whole ------------------------------------------------------------------
    def check(self) -> Optional[int]:
        """The store's format (None: a new store); StoreError when the root is not a store of
        ours or is of a newer format (`format_of`). Reads only."""
        return format_of(self.root)

    def create(self) -> None:
        """Make the store writable (first real sweep); fails clearly without permission. A store
        of an older format keeps its store.json: store/upgrade.py replaces it, last."""
        new = self.check() is None
        try:
            for directory in (self.layout.runs, self.layout.sweeps, self.layout.index):
                os.makedirs(directory, exist_ok=True)
            if new:
                write_json(self.layout.marker, marker())
            probe = os.path.join(self.layout.runs, f".write-test-{os.getpid()}")
            open(probe, "w").close()
            os.unlink(probe)
        except OSError as e:  # permissions, a read-only file system, a file in the way
            raise StoreError(f"store.root={self.root}: not writable ({e.strerror}); fix its "
                             f"permissions or choose another store.root") from None

    # -- runs ----------------------------------------------------------------------------------
    def run(self, run_id: str) -> RunPaths:
        return self.layout.run(run_id)

    def run_dir(self, run_id: str) -> Path:
        return Path(self.layout.run(run_id).dir)

    def _checkpoints(self, run_id: str) -> list[str]:
        """The run's checkpoint files, oldest first (one listing: `report` checks 100,000 runs)."""
        directory = self.layout.run(run_id).checkpoints
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        return sorted(os.path.join(directory, n) for n in names if integrity.is_checkpoint(n))

    def write_config(self, run_id: str, render: Callable[[], str]) -> None:
        """The run's resolved config (`render()`, called only when the run has none yet), once:
        it never changes. Not fsync'ed: the sweep's configs file holds it durably, and a job
        writes it again."""
        path = self.layout.run(run_id).config
        if not os.path.exists(path):
            write_text(path, render(), durable=False)

    def read_config(self, run_id: str) -> dict[str, Any]:
        """The run's config.yaml; FileNotFoundError when no job wrote it yet."""
        path = self.layout.run(run_id).config
        config = read_config(path)
        if config is None:
            raise FileNotFoundError(path)
        return config

    def run_ids(self) -> list[str]:
        try:
            with os.scandir(self.layout.runs) as entries:
                return sorted(e.name for e in entries if e.is_dir())
        except FileNotFoundError:
            return []

    def started_runs(self) -> set[str]:
        """The runs that have a directory: a job has claimed them (or a store of format 2 or
        earlier planned them). One listing, not a look-up per run."""
        try:
            return set(os.listdir(self.layout.runs))
        except FileNotFoundError:
            return set()

    def read_state(self, run_id: str) -> RunState:
        """The run's state; a corrupt file reads as status `corrupt` (never raises)."""
        try:
            state = read_state(self.layout.run(run_id).state)
        except ValueError as e:
            return {"run_id": run_id, "status": CORRUPT, "jobs": {}, "error": str(e)}
        return state or _untouched(run_id)

    def job_state(self, run_id: str, job: str) -> dict[str, Any]:
        return dict(self.read_state(run_id).get("jobs", {}).get(job, {"status": PENDING, "attempts": 0}))

    def update_job(self, run_id: str, job: str, jobs: list[str], durable: bool = True,
                   state: Optional[RunState] = None, **fields: Any) -> RunState:
        """Set fields of one job's state and recompute the run's status from all its jobs.

        `state` is the run's current state where the caller holds the claim and has it already
        (a read less per write); it is updated in place and returned."""
        state = self.read_state(run_id) if state is None else state
        if state["status"] == CORRUPT:
            state = {"run_id": run_id, "jobs": {}, "recovered_from": state.get("error") or ""}
        entries = state.setdefault("jobs", {})
        entry = entries.setdefault(job, {"status": PENDING, "attempts": 0})
        entry.update(fields)  # type: ignore[typeddict-item]  # JobState's keys, by the callers
        state["run_id"] = run_id
        state["status"] = run_status([entries.get(j, {}).get("status", PENDING) for j in jobs])
        state["error"] = next((entries[j].get("error") for j in jobs
                               if entries.get(j, {}).get("status") == FAILED), None)
        self._write_state(run_id, state, durable)
        return state

    def _write_state(self, run_id: str, state: RunState, durable: bool = True) -> None:
        """state.json, then its record in the index. `version` orders the records of a run: one
        more than the state's last, and at least the time in milliseconds, so a state rebuilt
        after damage (its count lost) still outranks the records of the one it replaces."""
        state["version"] = max(state.get("version", 0) + 1, time.time_ns() // 1_000_000)
        write_state(self.layout.run(run_id).state, state, durable=durable)
        index.journal(self.layout.root).append(run_id, index.record(state))

    def start_job(self, run_id: str, job: str, jobs: list[str], state: Optional[RunState] = None,
                  environment: Optional[tuple[str, Environment]] = None, **fields: Any) -> RunState:
        """Mark the job running here (plus `fields`), and the environment it runs in, given as
        (`environment_id` of it, it): its id in the job's state, the environment itself in the
        run's environment.json unless a job of the run already names it (records.py). Not
        fsync'ed: lost in a power cut, the state reads as before the start, and the job is rerun
        all the same."""
        state = self.read_state(run_id) if state is None else state
        attempts = state.get("jobs", {}).get(job, {}).get("attempts", 0) + 1
        started = now()
        if environment is not None:
            env_id, env = environment
            fields["environment"] = env_id
            if all(entry.get("environment") != env_id for entry in state.get("jobs", {}).values()):
                self._add_environment(run_id, {"id": env_id, "environment": env,
                                               "first_used": {"job": job, "attempt": attempts, "at": started}})
        return self.update_job(run_id, job, jobs, False, state, status=RUNNING, attempts=attempts,
                               started_at=started, ended_at=None, host=socket.gethostname(),
                               pid=os.getpid(), error=None, **fields)

    def _add_environment(self, run_id: str, entry: EnvironmentEntry) -> None:
        """Append an environment to the run's environment.json (under the run's claim) unless it is
        there already (its first use kept). A file that cannot be read, or is not such a record, is
        replaced: damage to it loses earlier entries, never a job's results."""
        entries = self.read_environment(run_id)
        if all(e.get("id") != entry["id"] for e in entries):
            write_environment(self.layout.run(run_id).environment, {"environments": [*entries, entry]})

    def read_environment(self, run_id: str) -> list[EnvironmentEntry]:
        """The environments the run's jobs ran in, first used first; [] when none is recorded or
        the file cannot be read."""
        try:
            record = read_environment(self.layout.run(run_id).environment)
        except ValueError:
            return []
        known = record.get("environments") if isinstance(record, dict) else None
        return [e for e in known if isinstance(e, dict)] if isinstance(known, list) else []

    def end_job(self, run_id: str, job: str, jobs: list[str], error: Optional[str] = None,
                durable: bool = True, state: Optional[RunState] = None, **fields: Any) -> RunState:
        return self.update_job(run_id, job, jobs, durable, state, status=FAILED if error else DONE,
                               ended_at=now(), error=error, **fields)

    def claim(self, run_id: str, wait: bool = True) -> contextlib.AbstractContextManager[bool]:
        """Exclusive claim of a run; yields False (without blocking) if `wait` is False and
        another process holds it."""
        return _flock(self.layout.run(run_id).lock, wait)

    def is_claimed(self, run_id: str) -> bool:
        if not os.path.exists(self.layout.run(run_id).lock):
            return False
        with self.claim(run_id, wait=False) as got:
            return not got

    def read_metrics(self, run_id: str) -> Metrics:
        try:
            return read_metrics(self.layout.run(run_id).metrics) or {}
        except ValueError:
            return {}

    def merge_metrics(self, run_id: str, metrics: Mapping[str, Optional[float]], specs: dict[str, dict[str, Any]],
                      curves: dict[str, Any], curve_specs: dict[str, dict[str, Any]],
                      durable: bool = True) -> Metrics:
        """Add a job's results (metric values and curves, each with the record of its spec) to
        the run's; returns the run's results as written. `higher_is_better` repeats the specs'
        directions for readers of format 1."""
        current = self.read_metrics(run_id)
        merged: Metrics = {
            "metrics": {**current.get("metrics", {}), **metrics},
            "higher_is_better": {**current.get("higher_is_better", {}),
                                 **{name: spec["higher_is_better"] for name, spec in specs.items()
                                    if spec.get("higher_is_better") is not None}},
            "curves": {**current.get("curves", {}), **curves},
            "specs": {**current.get("specs", {}), **specs},
            "curve_specs": {**current.get("curve_specs", {}), **curve_specs},
        }
        write_metrics(self.layout.run(run_id).metrics, merged, durable=durable)
        return merged

    # -- damage: found by parse checks and digests, repaired by rerunning -----------------------
    def problems(self, run_id: str) -> list[str]:
        """What is wrong with the run's files, one line each; cheap (no checkpoint is hashed)."""
        return self.inspect(run_id)[0]

    def inspect(self, run_id: str) -> tuple[list[str], dict[str, Optional[dict[str, Any]]]]:
        """The run's problems, and its JSON files (state.json, metrics.json) as parsed: None when
        missing or unreadable (`report` hands them to the analysis, which reads no file twice)."""
        found: list[str] = []
        parsed: dict[str, Optional[dict[str, Any]]] = {}
        unreadable = set()
        paths = self.layout.run(run_id)
        for name in RUN_JSON:
            try:
                parsed[name] = read_json(paths.json(name))
            except ValueError as e:  # "<path>: unreadable JSON (<why>)"
                parsed[name] = None
                unreadable.add(name)
                found.append(f"{name} {str(e).split(': ', 1)[1]}")
        jobs = (parsed[STATE] or {}).get("jobs", {})
        no_metrics = parsed[METRICS] is None and METRICS not in unreadable
        if no_metrics and any(j.get("status") == DONE for j in jobs.values()):
            found.append(f"{METRICS} missing although a job is done")
        for path in self._checkpoints(run_id):
            if bad := integrity.problem(Path(path), full=False):
                found.append(f"checkpoint {bad}")
        return found, parsed

    def recover(self, run_id: str, jobs: list[str]) -> RunState:
        """Undo the run's problems (the caller holds its claim): bad files are moved aside and
        every job is set to do again, keeping its attempt count. Returns the run's state, with
        the problems found this time last in its `recovered` list."""
        found, parsed = self.inspect(run_id)
        if not found:
            return parsed[STATE] or _untouched(run_id)  # type: ignore[return-value]
        paths, old_state = self.layout.run(run_id), parsed[STATE] or {}
        for name in RUN_JSON:
            try:
                read_json(paths.json(name))
            except ValueError:
                os.replace(paths.json(name), paths.json(name) + ".corrupt")
        for path in self._checkpoints(run_id):
            if bad := integrity.problem(Path(path), full=False):
                integrity.quarantine(Path(path), bad)
        old = old_state.get("jobs", {})
        state: RunState = {
            "run_id": run_id, "status": PENDING, "error": None, "version": old_state.get("version", 0),
            "jobs": {j: {"status": PENDING, "attempts": old.get(j, {}).get("attempts", 0)}
                     for j in dict.fromkeys([*jobs, *old])},
            "recovered": old_state.get("recovered", []) + [{"at": now(), "problem": p} for p in found]}
        self._write_state(run_id, state)
        return state

    def recovered(self, run_id: str) -> list[str]:
        """Past problems of the run that were repaired: state notes and quarantined checkpoints."""
        notes = [f"{r['at']} {r['problem']}" for r in self.read_state(run_id).get("recovered", [])]
        return notes + integrity.quarantined(Path(self.layout.run(run_id).checkpoints))

    def is_stale(self, run_id: str, state: RunState) -> bool:
        """The state says a job is running but no process holds the run's claim."""
        return state.get("status") == RUNNING and not self.is_claimed(run_id)

    def write_progress(self, run_id: str, progress: dict[str, Any]) -> None:
        write_json(self.layout.run(run_id).progress, progress, durable=False)

    def read_progress(self, run_id: str) -> dict[str, Any]:
        try:
            return read_json(self.layout.run(run_id).progress) or {}
        except ValueError:
            return {}

    # -- sweeps --------------------------------------------------------------------------------
    def sweep_dir(self, name: str) -> Path:
        return Path(self.layout.sweep(name).dir)

    def sweeps(self) -> list[str]:
        try:
            names = os.listdir(self.layout.sweeps)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if os.path.exists(self.layout.sweep(n).manifest))

    def read_sweep(self, name: str) -> SweepManifest:
        path = self.layout.sweep(name).manifest
        try:
            manifest = read_manifest(path)
        except ValueError as e:
            raise StoreError(f"{e}; restore it from a backup or delete it and run the sweep again") from None
        if manifest is None:
            known = ", ".join(self.sweeps()) or "none yet"
            raise StoreError(f"no sweep named {name!r} in {self.root}; known sweeps: {known}")
        return manifest

    def record_sweep(self, name: str, overrides: list[str], run_ids: list[str],
                     configs: Optional[ConfigsRecord] = None) -> SweepManifest:
        """Create or extend a sweep: run ids are a growing set, each invocation is recorded, and
        the configs of its runs (`configs`, the orchestrator's record of them) are written in one
        file (store/records.py)."""
        if configs is not None:
            write_sweep_configs(self.layout.sweep(name), configs)

        def extend(sweep: Optional[SweepManifest]) -> SweepManifest:
            sweep = sweep or new_manifest(name)
            sweep["invocations"].append({"at": now(), "overrides": list(overrides)})
            sweep["overrides"] = list(overrides)
            sweep["run_ids"] = list(dict.fromkeys(sweep["run_ids"] + run_ids))
            return sweep
        return self._change_sweep(name, extend)

    def record_look(self, name: str, look: dict[str, Any]) -> SweepManifest:
        """Append one look of an adaptive sweep (its seeds, decision and verdicts)."""
        def extend(sweep: Optional[SweepManifest]) -> SweepManifest:
            sweep = sweep or new_manifest(name)
            sweep["looks"] = [*sweep.get("looks", []), {"at": now(), **look}]
            return sweep
        return self._change_sweep(name, extend)

    def record_slurm_job(self, name: str, job: SlurmJob) -> SweepManifest:
        """Append one submitted Slurm job of the sweep (id, kind, script; orchestrator/executors/slurm_tools.py)."""
        def extend(sweep: Optional[SweepManifest]) -> SweepManifest:
            sweep = sweep or new_manifest(name)
            sweep["slurm_jobs"] = [*sweep.get("slurm_jobs", []), job]
            return sweep
        return self._change_sweep(name, extend)

    def _change_sweep(self, name: str, change: Callable[[Optional[SweepManifest]], SweepManifest]) -> SweepManifest:
        """Read, change and write sweep.yaml under the sweep's flock, so that two drivers
        extending one sweep at once both land."""
        paths = self.layout.sweep(name)
        os.makedirs(paths.dir, exist_ok=True)
        with _flock(paths.lock, wait=True):
            sweep = change(read_manifest(paths.manifest))
            write_manifest(paths.manifest, sweep)
        return sweep

    def sweep_configs(self, name: str) -> SweepConfigs:
        return read_sweep_configs(self.layout.sweep(name))

    def write_paper_flops(self, name: str, rows: list[dict[str, Any]]) -> None:
        """The paper-scale FLOPs table of the sweep's report (the orchestrator computes it)."""
        write_json(self.layout.sweep(name).paper_flops, rows)

    def write_claims(self, name: str, specs: dict[str, dict[str, Any]]) -> None:
        """The metric specs (records) of every claim the jobs can measure, for the report's line on
        those the sweep did not measure (the orchestrator knows the jobs; the analysis does not)."""
        write_json(self.layout.sweep(name).claims, specs)


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


def _untouched(run_id: str) -> RunState:
    """The state of a run no job has started."""
    return {"run_id": run_id, "status": PENDING, "jobs": {}}


def run_status(job_statuses: list[str]) -> str:
    """A run is done when all its jobs are; failed/running/waiting/interrupted win over pending."""
    for status in (FAILED, RUNNING, WAITING, INTERRUPTED):
        if status in job_statuses:
            return status
    return DONE if job_statuses and all(s == DONE for s in job_statuses) else PENDING
