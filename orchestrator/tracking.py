"""Weights & Biases tracking: one W&B run per store run (its training and its evaluations), one
`analysis` run per sweep report, offline unless asked otherwise, every file under <store>/wandb/.

Tracking is never in the way of a job: wandb is imported only when tracking is on, and any W&B
failure (missing package, unreachable server, missing key, an error while logging) is one
`TrackingWarning` line, after which the job goes on untracked."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import os
import re
import socket
import sys
import urllib.parse
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

import pandas as pd

from config.run import RunConfig
from config.tracker import TrackerConfig
from orchestrator.identity import SEED_AXES, run_label
from store.records import now
from store.store import Store

WANDB_DIR = "wandb"  # under the store root; W&B's own run directories, staging files and logs
ONLINE = ("online", "run")  # the W&B modes that talk to the server
TRAIN_KEYS = ("loss", "lr", "n_layers", "tokens", "flops", "tokens_per_s")  # trainer's reports

# Credentials never reach W&B: keys named like one, and values shaped like one (long hex such as a
# W&B key, provider prefixes sk-/ghp_/hf_/xox*-/AKIA, JWTs, passwords inside URLs).
# Key names are matched by whole words, so `train_tokens` or `tokens_per_s` are kept.
SECRET_KEY = re.compile(r"(?:^|[_.-])(?:api[_-]?key|key|token|secret|passw(?:or)?d|auth|authorization"
                        r"|credentials?)(?:$|[_.-])", re.IGNORECASE)
SECRET_VALUE = re.compile(
    r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{32,}(?![0-9A-Fa-f])"
    r"|\b(?:sk|pk|rk)-[\w-]{16,}"
    r"|\b(?:ghp|gho|ghu|ghs|ghr|github_pat|glpat|hf|xox[abprs])[_-][\w-]{16,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\beyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,}"
    r"|://[^/\s:@]+:[^/\s@]+@")

Progress = Callable[[dict], None]
_online_failed: set[str] = set()  # base URLs whose init failed in this process: go offline at once
_dirs_set: dict[str, str] = {}     # the W&B directory variables this module set (a user's own win)
_warnings_log: Optional[Path] = None  # <store>/wandb/warnings.log once a run was opened here


class TrackingWarning(UserWarning):
    """W&B trouble that tracking shrugged off."""


def _warn(message: str) -> None:
    """A warning, also appended to <store>/wandb/warnings.log: Ray does not forward the jobs'
    output to the console (executors/ray_driver.py: log_to_driver=False)."""
    warnings.warn(f"W&B: {message}", TrackingWarning, stacklevel=2)
    if _warnings_log is not None:
        with contextlib.suppress(OSError), open(_warnings_log, "a") as f:
            f.write(f"{now()} pid {os.getpid()} {message}\n")


def first_line(e: BaseException) -> str:
    return next((s.strip() for s in str(e).splitlines() if s.strip()), type(e).__name__)


def _guarded(fallback: Callable[[], Any]) -> Callable:
    """Tracking never fails a job or a report: an unexpected error is a warning and `fallback()`."""
    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001
                _warn(f"{fn.__name__} failed ({type(e).__name__}: {first_line(e)}); not tracked")
                return fallback()
        return guarded
    return wrap


def enabled(tracker: TrackerConfig) -> bool:
    """`tracker.enabled`, where null means: whenever the wandb package is importable."""
    if tracker.enabled is None:
        return importlib.util.find_spec("wandb") is not None
    return bool(tracker.enabled)


def is_secret(value: Any) -> bool:
    return isinstance(value, str) and SECRET_VALUE.search(value) is not None


def redact(value: Any) -> Any:
    """`value` without the entries whose key or value looks like a credential (recursively)."""
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items()
                if not SECRET_KEY.search(str(k)) and not is_secret(v)}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value if not is_secret(v)]
    return value


def _table(df: pd.DataFrame) -> Any:
    """A wandb.Table of `df`, redacted like the config; NaN and NA become empty cells."""
    import wandb

    df = df[[c for c in df.columns if not SECRET_KEY.search(str(c))]].astype(object)
    df = df.where(df.notna(), None).map(lambda v: None if is_secret(v) else v)
    return wandb.Table(dataframe=df, allow_mixed_types=True)


def _is_columns(curve: Any) -> bool:
    return (isinstance(curve, Mapping) and bool(curve)
            and all(isinstance(v, list) for v in curve.values())
            and len({len(v) for v in curve.values()}) == 1)


class Tracker:
    """One W&B run, or nothing: without a run (tracking off, or a W&B call failed) every method
    does nothing."""

    def __init__(self, run: Any = None, log_every: int = 1, train: bool = False):
        self._run, self._log_every, self._train = run, log_every, train

    @property
    def active(self) -> bool:
        return self._run is not None

    def _call(self, what: str, fn: Callable[[], Any]) -> None:
        if self._run is None:
            return
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - W&B may raise anything; tracking must not
            _warn(f"{what} failed ({first_line(e)}); this run is no longer tracked")
            run, self._run = self._run, None
            if what != "finish":
                with contextlib.suppress(Exception):
                    run.finish(exit_code=1)

    def log(self, row: Mapping | Callable[[], Mapping], step: Optional[int] = None) -> None:
        """Log a row; a callable row is built inside the guard (tables and images can fail too)."""
        self._call("log", lambda: self._run.log(dict(row() if callable(row) else row), step=step))

    def progress(self, report: Progress) -> Progress:
        """`report`, and for a training job each `tracker.log_every`-th row (and the last) logged
        as train/<key> at W&B step = training step. A retried job repeats the steps since its
        last checkpoint, with bit-identical values."""
        if not (self._train and self.active):
            return report

        def tracked(p: dict) -> None:
            step = p.get("step")
            if step is not None and (step % self._log_every == 0 or step == p.get("total_steps")):
                self.log({f"train/{k}": p[k] for k in TRAIN_KEYS if k in p}, step=step)
            report(p)
        return tracked

    def record(self, metrics: Mapping) -> None:
        """The store's metrics.json of the run into the summary, column-shaped curves (the TVD by
        context) as tables. Every job sends all of it, so whichever offline session of the run is
        synced last leaves the complete summary."""
        def values() -> dict:
            out = dict(metrics.get("metrics", {}))
            for name, curve in metrics.get("curves", {}).items():
                out[f"curves/{name}"] = _table(pd.DataFrame(curve)) if _is_columns(curve) else curve
            return out
        self._call("summary", lambda: self._run.summary.update(values()))

    def finish(self, failed: bool = False) -> None:
        self._call("finish", lambda: self._run.finish(exit_code=1 if failed else 0))
        self._run = None


def _keep_in(wandb_dir: Path) -> None:
    """W&B's staging copies (tables, images; the offline records point at them) and its service
    logs go with the store instead of ~/.local/share and ~/.cache, so `wandb-sync` finds them
    wherever the store goes. A WANDB_DATA_DIR / WANDB_CACHE_DIR set by the user wins."""
    for var, sub in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache")):
        if os.environ.get(var) in (None, _dirs_set.get(var)):
            os.environ[var] = _dirs_set[var] = str(wandb_dir / sub)


def _init(tracker: TrackerConfig, root: Path, packages: bool = True, **run: Any) -> Any:
    """wandb.init under `root`/wandb with short timeouts; an online init that fails falls back to
    offline, any other failure gives None. W&B's system metadata (command line, host details,
    git state, environment), system metrics, code and console are not collected; the installed
    packages only with `packages` (listing them costs W&B about 0.2 s per init)."""
    global _warnings_log
    root = root.resolve()
    (root / WANDB_DIR).mkdir(parents=True, exist_ok=True)
    _warnings_log = root / WANDB_DIR / "warnings.log"
    try:
        import wandb
    except ImportError as e:
        _warn(f"not installed ({first_line(e)}); {run['name']} is not tracked")
        return None
    _keep_in(root / WANDB_DIR)
    mode = wandb_mode(tracker)
    online = mode in ONLINE
    if online and _base_url() in _online_failed:
        mode, online = "offline", False
    settings: dict[str, Any] = dict(init_timeout=tracker.init_timeout_s,
                    finish_timeout=tracker.finish_timeout_s, silent=True, console="off",
                    save_code=False, disable_git=True, x_disable_meta=True, x_disable_stats=True,
                    x_save_requirements=packages)
    for attempt in [mode] + (["offline"] if online else []):
        try:
            return wandb.init(project=tracker.project, entity=tracker.entity,
                              dir=str(root), mode=attempt, resume="allow",  # type: ignore[arg-type]  # any str: W&B checks it
                              settings=wandb.Settings(**settings), **run)
        except Exception as e:  # noqa: BLE001 - W&B may raise anything; tracking must not
            fallback = attempt != "offline" and online
            if fallback:
                _online_failed.add(_base_url())
                wandb.teardown()  # the failed run still holds its id in W&B's service
            then = "logging offline (upload later with `wandb-sync`)" if fallback else "not tracked"
            _warn(f"{attempt} init of {run['name']} failed ({first_line(e)}); {then}")
    return None


def _cell(cfg: RunConfig) -> str:
    return f"{cfg.family.name}-{cfg.model.name}"


def _group(cfg: RunConfig, sweep: Optional[str]) -> str:
    """W&B group: <sweep>/<family>-<size>, so seeds aggregate into one line per cell. The sweep
    that runs the job names it (a run shared by sweeps has one config, without the sweep)."""
    return f"{sweep}/{_cell(cfg)}" if sweep else _cell(cfg)


def _tags(cfg: RunConfig) -> list[str]:
    return [f"family={cfg.family.name}", f"size={cfg.model.name}", f"seed={cfg.seed}",
            *(f"{key}={getattr(cfg, key)}" for key in SEED_AXES if getattr(cfg, key) is not None),
            f"backend={cfg.backend.name}"]


@_guarded(Tracker)
def open_run(cfg: RunConfig, run_id: str, job: str, store_root: str | Path, sweep: Optional[str] = None) -> Tracker:
    """The W&B run of store run `run_id`, opened or resumed (id = run id) for `job` of `sweep`.

    One W&B run holds a training run and all its evaluations (job type `train`): its curves, its
    evaluation metrics and tables sit side by side, and a retried or resumed job continues it."""
    t = cfg.tracker
    if not enabled(t):
        return Tracker()
    plain = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "tracker"}
    config = {**redact(plain), "run_id": run_id}
    # The packages once, with the training: the evaluations resume the same W&B run.
    run = _init(t, Path(store_root), packages=job == "train", id=run_id, name=run_label(cfg), job_type="train",
                group=_group(cfg, sweep), config=config, tags=_tags(cfg))
    return Tracker(run, t.every, train=job == "train")


@contextlib.contextmanager
def job_environment(cfg: RunConfig, run_id: str, sweep: Optional[str] = None) -> Iterator[None]:
    """W&B's variables for a job that starts its own tracked processes (a backend that launches
    its ranks, such as nanotron, whose own W&B logging reads them), set while the job runs: its
    runs group with this project's (<sweep>/<family>-<size>), offline unless asked otherwise."""
    t = cfg.tracker
    env = {}
    if cfg.backend.launches_ranks and t.enabled is not False:
        env = {"WANDB_PROJECT": t.project, "WANDB_RUN_ID": run_id, "WANDB_RESUME": "allow",
               "WANDB_JOB_TYPE": "train", "WANDB_RUN_GROUP": _group(cfg, sweep), "WANDB_TAGS": ",".join(_tags(cfg)),
               "WANDB_MODE": t.mode or "offline", **({"WANDB_ENTITY": t.entity} if t.entity else {})}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------------------------------------
# Sweeps

def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _analysis_prefix(sweep: str) -> str:
    return f"sweep-{_digest(sweep)[:8]}-"


@_guarded(lambda: None)
def log_sweep(store: Store, sweep: str, analysis: Any, t: TrackerConfig) -> Optional[str]:
    """The sweep's analysis run (job type `analysis`, group = the sweep): the cells and
    comparisons tables and the report's plots, with tracker settings `t` (the sweep's latest
    invocation's). Its id is a digest of the tables, so a report that did not change is not
    logged twice. Returns the W&B run id when something was logged."""
    if not enabled(t):
        return None
    tables = {"cells": analysis.cells, "comparisons": analysis.comparisons}
    run_id = _analysis_prefix(sweep) + _digest("".join(df.to_csv() for df in tables.values()))[:8]
    if any((store.root / WANDB_DIR).glob(f"*-{run_id}")):
        return None
    spec = store.read_sweep(sweep)
    config = redact({"sweep": sweep, "run_ids": spec["run_ids"],
                     "options": dataclasses.asdict(analysis.options)})
    tracker = Tracker(_init(t, store.root, id=run_id, name=f"{sweep}-analysis", group=sweep,
                            job_type="analysis", tags=["analysis"], config=config))
    if not tracker.active:
        return None
    import wandb

    plots = sorted(Path(store.layout.sweep(sweep).plots).glob("*.png"))
    tracker.log(lambda: {**{name: _table(df) for name, df in tables.items()},
                         **{f"plots/{p.stem}": wandb.Image(str(p)) for p in plots}})
    logged = tracker.active
    tracker.finish()
    return run_id if logged else None


def offline_runs(store: Store, sweep: str) -> list[Path]:
    """The offline W&B run directories of a sweep: its runs' and its analysis runs', oldest
    first (a resumed run has one directory per session, synced in order)."""
    ids = set(store.read_sweep(sweep)["run_ids"])
    prefix = _analysis_prefix(sweep)
    # offline-run-<start time>-<id>[-N]/run-<id>.wandb: W&B adds -N when two sessions of a run start
    # within the same second, so the id is read from the log file's name.
    logs = (store.root / WANDB_DIR).glob("offline-run-*/run-*.wandb")
    chosen = {f.parent for f in logs
              if (rid := f.name[len("run-"):-len(".wandb")]) in ids or rid.startswith(prefix)}
    return sorted(chosen)


def sync_command(dirs: list[Path]) -> list[str]:
    """`wandb sync` over the run directories (already synced ones are skipped by wandb)."""
    if importlib.util.find_spec("wandb") is None:
        raise RuntimeError("the wandb package is not installed; `pip install wandb==0.31.0`")
    return [sys.executable, "-m", "wandb", "sync", *map(str, dirs)]


def _base_url() -> str:
    import wandb

    return wandb.setup().settings.base_url


def unreachable(timeout_s: float = 5.0) -> Optional[str]:
    """Why the W&B server cannot be reached (a TCP connection to its host), or None."""
    url = _base_url()
    parsed = urllib.parse.urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
    except OSError as e:
        return f"cannot reach the W&B server {url} ({e.strerror or e})"
    return None


def wandb_mode(tracker: TrackerConfig) -> str:
    """tracker.mode, else $WANDB_MODE; offline by default."""
    return tracker.mode or os.environ.get("WANDB_MODE") or "offline"


def online(tracker: TrackerConfig) -> bool:
    return wandb_mode(tracker) in ONLINE


def default_entity() -> str:
    """The entity of the logged-in W&B user (needs the network and a key)."""
    import wandb

    return wandb.Api().default_entity or ""
