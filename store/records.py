"""The records a store holds, typed, with the one function that reads and the one that writes
each. Every write goes through common/atomic.py: a killed process leaves the old or the new file.

A reader gets None for a file that is missing and ValueError for one that cannot be parsed
(damage from outside: `Store.recover` moves it aside), never a half-written record.

The configs file of a sweep (`SweepConfigs`) holds the resolved config of every run one
invocation planned, in one file, sweeps/<name>/configs/<time>-<pid>.json:

    {"configs": [config, ...], "runs": {run id: [index into configs, seed]}}

A config is what the run's config.yaml holds; the runs of one group of seed variants share one,
with each run's own seed beside it, so 100,000 seeds of a grid point take one config and a line
each. Files of later invocations add runs; a run planned again keeps its first entry (its config
is the same: the run id is a hash of it).

A run's environment file (`EnvironmentRecord`, runs/<id>/environment.json) holds every distinct
environment its jobs ran in, in the order first used, each with the job and attempt that first used
it; each job's entry in state.json names the environment of its latest attempt (`JobState.environment`,
the entry's `id`). A job adds an entry only when no job of the run names its environment yet and
the file lacks it, so a run whose jobs all ran on one machine writes the file once, and a run
resumed on another machine keeps the first machine's entry beside the second's. The file is not in
`RUN_JSON`: a damaged one is replaced by the next new environment's entry (never a rerun), and a
reader takes it for "not recorded"."""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional, TypedDict, cast

import yaml

from common.atomic import read_json, read_yaml, write_json, write_yaml
from store.layout import FORMAT_VERSION, OWNER, SweepPaths


class JobState(TypedDict, total=False):
    """One job of a run: `status` and `attempts` always, the rest once it started."""
    status: str
    attempts: int
    started_at: Optional[str]
    ended_at: Optional[str]
    host: str
    pid: int
    error: Optional[str]
    node_id: Optional[str]  # the Ray node it ran on
    node_ids: list[str]  # a multi-node job's nodes
    settings: str  # the digest of the evaluation's settings it ran with (orchestrator/identity.py)
    waiting_for: str  # a multi-node job whose nodes the cluster cannot give now
    waiting_since: str  # when it began to wait for them
    environment: str  # the id of the environment its latest attempt ran in (environment.json)


class Recovery(TypedDict):
    at: str
    problem: str


class RunState(TypedDict, total=False):
    """runs/<id>/state.json: the run's status computed from its jobs'. `version` grows with every
    write (it orders the run's records in the index)."""
    run_id: str
    status: str
    jobs: dict[str, JobState]
    error: Optional[str]
    version: int
    recovered: list[Recovery]  # damage repaired, oldest first
    recovered_from: str  # the error of a state that could not be read


class Metrics(TypedDict, total=False):
    """runs/<id>/metrics.json, merged over the run's jobs. `specs` and `curve_specs` are the
    records of common/metrics.py's MetricSpec and CurveSpec (format 2 on); `higher_is_better`
    repeats the specs' directions for readers of format 1."""
    metrics: dict[str, Optional[float]]
    higher_is_better: dict[str, Optional[bool]]
    curves: dict[str, Any]  # curve -> {column: values}
    specs: dict[str, dict[str, Any]]
    curve_specs: dict[str, dict[str, Any]]


class Environment(TypedDict, total=False):
    """What produced a job's numbers, collected where it runs (jobs/environment.py). The fields
    that can change results on CPU: torch, cpu_capability (ATen's kernels), threads, processes,
    deterministic and kernel_env; on GPUs: torch_build, gpu, gpu_capability and cudnn too."""
    python: str
    numpy: str
    torch: str  # torch.__version__, e.g. 2.13.0+cpu
    torch_build: str  # "cpu", or "cuda 12.8" / "rocm 6.3": what torch was compiled for
    device: str  # "cpu" or "cuda": where the job computed
    cpu_capability: str  # ATen's CPU kernel path: torch.backends.cpu.get_cpu_capability(), e.g. AVX512
    cpu_model: Optional[str]  # /proc/cpuinfo's model name; None where it cannot be read
    gpu: Optional[str]  # the CUDA device's name (device "cuda")
    gpu_capability: Optional[str]  # its compute capability, e.g. "9.0"
    threads: int  # torch's intra-op threads, per process
    processes: int  # the job's processes (its DDP ranks)
    deterministic: bool  # torch.are_deterministic_algorithms_enabled()
    cudnn: dict[str, bool]  # device "cuda": cudnn's deterministic, benchmark, allow_tf32; matmul_allow_tf32
    kernel_env: dict[str, str]  # the environment variables that choose kernels, where set (ATEN_CPU_CAPABILITY, ...)
    hostname: str
    platform: str  # platform.platform()


class EnvironmentUse(TypedDict):
    job: str
    attempt: int
    at: str


class EnvironmentEntry(TypedDict):
    id: str  # `environment_id` of `environment`
    first_used: EnvironmentUse
    environment: Environment


class EnvironmentRecord(TypedDict):
    """runs/<id>/environment.json: every distinct environment the run's jobs ran in, first used first."""
    environments: list[EnvironmentEntry]


class Invocation(TypedDict):
    at: str
    overrides: list[str]


class SlurmJob(TypedDict):
    """A cluster job a sweep submitted (orchestrator/executors/slurm_tools.py): its Slurm id, the
    script's label (`kind`: allocation, array, report), the cluster option, the script, when."""
    id: str
    kind: str
    cluster: str
    script: str
    at: str


class SweepManifest(TypedDict, total=False):
    """sweeps/<name>/sweep.yaml: every invocation of the sweep and the union of its runs.
    `looks` are an adaptive sweep's interim analyses, `slurm_jobs` the cluster jobs it submitted
    (orchestrator/executors/slurm_tools.py)."""
    name: str
    created_at: str
    format_version: int
    invocations: list[Invocation]
    overrides: list[str]  # of the latest invocation
    run_ids: list[str]
    looks: list[dict[str, Any]]
    slurm_jobs: list[SlurmJob]


class ConfigsRecord(TypedDict):
    """One configs file as written: the shared configs, and each run's [config index, seed]."""
    configs: list[dict[str, Any]]
    runs: dict[str, list[int]]


class Marker(TypedDict):
    """store.json: whose store this is and its format."""
    store: str
    format_version: int


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def marker() -> Marker:
    return {"store": OWNER, "format_version": FORMAT_VERSION}


def read_config(path: str) -> Optional[dict[str, Any]]:
    """A run's resolved config (as the orchestrator rendered it); None when no job wrote it yet."""
    try:
        return cast(Optional[dict[str, Any]], read_yaml(path))
    except FileNotFoundError:
        return None


def read_state(path: str) -> Optional[RunState]:
    return cast(Optional[RunState], read_json(path))


def write_state(path: str, state: RunState, durable: bool = True) -> None:
    write_json(path, state, durable=durable)


def read_metrics(path: str) -> Optional[Metrics]:
    return cast(Optional[Metrics], read_json(path))


def write_metrics(path: str, metrics: Metrics, durable: bool = True) -> None:
    write_json(path, metrics, durable=durable)


def environment_id(environment: Environment) -> str:
    """12 hex digits of sha256 over the environment's canonical JSON: equal environments, equal ids."""
    text = json.dumps(environment, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def read_environment(path: str) -> Optional[EnvironmentRecord]:
    """A run's environments; None when missing (a run of before the file, or no job started yet),
    ValueError when it cannot be parsed."""
    return cast(Optional[EnvironmentRecord], read_json(path))


def write_environment(path: str, record: EnvironmentRecord) -> None:
    """Not fsync'ed, like the job start it goes with: lost in a power cut, it reads as not recorded."""
    write_json(path, record, durable=False)


def read_manifest(path: str) -> Optional[SweepManifest]:
    """The sweep's manifest; None when missing, ValueError when it cannot be parsed."""
    try:
        return cast(Optional[SweepManifest], read_yaml(path))
    except FileNotFoundError:
        return None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: unreadable ({str(e).splitlines()[0]})") from None


def write_manifest(path: str, manifest: SweepManifest) -> None:
    write_yaml(path, manifest)


def new_manifest(name: str) -> SweepManifest:
    return {"name": name, "created_at": now(), "format_version": FORMAT_VERSION, "invocations": [], "run_ids": []}


@dataclass
class SweepConfigs:
    """Every configs file of a sweep, read together."""
    configs: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, tuple[int, int]] = field(default_factory=dict)  # run id -> (config index, seed)

    def config(self, run_id: str) -> dict[str, Any]:
        """The run's config as its config.yaml holds it; KeyError for a run no file lists."""
        index, seed = self.runs[run_id]
        return {**self.configs[index], "seed": seed}


def write_sweep_configs(sweep: SweepPaths, record: ConfigsRecord) -> None:
    """One invocation's configs file, named by the time and the writer so none is overwritten."""
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    write_json(os.path.join(sweep.configs, f"{stamp}-{os.getpid()}.json"), record)


def read_sweep_configs(sweep: SweepPaths) -> SweepConfigs:
    """Every configs file of the sweep, oldest first (none: empty, as a store of format 2 has)."""
    try:
        names = sorted(n for n in os.listdir(sweep.configs) if n.endswith(".json"))
    except FileNotFoundError:
        names = []
    out = SweepConfigs()
    for name in names:
        record: Any = read_json(os.path.join(sweep.configs, name)) or {}
        offset = len(out.configs)
        out.configs += record.get("configs", [])
        for run_id, (index, seed) in record.get("runs", {}).items():
            out.runs.setdefault(run_id, (offset + index, seed))
    return out
