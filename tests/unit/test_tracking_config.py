"""W&B tracking without W&B's processes: the tracker config, tracking off, and W&B errors as warnings.
The tracking of real offline W&B runs: tests/e2e/test_tracking.py (which uses this file's config helpers)."""
import dataclasses
import warnings

import pytest

wandb = pytest.importorskip("wandb")

from orchestrator import grid, tracking  # noqa: E402
from orchestrator.config import ConfigError  # noqa: E402
from orchestrator.identity import run_id  # noqa: E402
from store.store import Store  # noqa: E402

FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"  # shaped like a W&B API key
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, nothing is ever uploaded


@pytest.fixture(autouse=True)
def w_and_b_env(monkeypatch):
    """A fake key, a server that cannot be reached, and W&B's directory variables restored after
    each test (tracking sets them in-process to keep W&B's files in the store)."""
    for var in ("WANDB_MODE", "WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_API_KEY", FAKE_KEY)
    monkeypatch.setenv("WANDB_BASE_URL", UNREACHABLE)
    monkeypatch.setattr(tracking, "_warnings_log", None)
    wandb.teardown()  # W&B's settings singleton re-reads the environment
    yield
    wandb.teardown()


def micro(*overrides: str):
    points, _ = grid.expand(["size=micro", "family=dense", "seed=0", "eval.jobs=[regbench]", *overrides])
    return points[0].config


@pytest.fixture(scope="module")
def base_cfg():
    return micro()


def with_tracker(cfg, **tracker):
    return dataclasses.replace(cfg, tracker=dataclasses.replace(cfg.tracker, **tracker))


def test_tracker_config_defaults_checks_and_run_id():
    cfg, off = micro(), micro("tracker=none")
    assert cfg.tracker.enabled is None and cfg.tracker.log_every == 5
    assert off.tracker.enabled is False and not tracking.enabled(off.tracker)
    online = micro("tracker.mode=online")
    assert len({run_id(cfg), run_id(off), run_id(online)}) == 1
    for overrides, needle in [(["tracker.mode=loud"], "tracker.mode=loud: not allowed"),
                              (["tracker.log_every=7"], "multiple of train.log_every=5"),
                              (["tracker=wandbb"], "tracker=wandbb: no such tracker")]:
        with pytest.raises(ConfigError, match=needle):
            micro(*overrides)


def test_tracking_off_writes_nothing_and_needs_no_wandb(tmp_path, base_cfg, monkeypatch):
    off = with_tracker(base_cfg, enabled=False)
    report = print
    assert tracking.open_run(off, "r", "train", tmp_path).progress(report) is report
    store = Store(tmp_path)
    store.record_sweep("off", ["family=dense", "tracker=none"], [])
    with warnings.catch_warnings():
        warnings.simplefilter("error", tracking.TrackingWarning)
        assert tracking.log_sweep(store, "off", analysis=None, t=off.tracker) is None  # not even looked at
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    assert not tracking.open_run(base_cfg, "r", "train", tmp_path).active
    with pytest.raises(ConfigError, match="wandb package is not installed"):
        micro("tracker.enabled=true")
    assert not (tmp_path / "wandb").exists()


def test_wandb_errors_are_warnings_never_failures(tmp_path, base_cfg, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(wandb, "init", boom)
    with pytest.warns(tracking.TrackingWarning, match="offline init of dense-micro-s0 .*boom"):
        assert not tracking.open_run(base_cfg, "r", "train", tmp_path).active

    class Broken:
        summary: dict = {}

        def log(self, *args, **kwargs):
            raise RuntimeError("disk full")

        def finish(self, exit_code=0):
            raise RuntimeError("still broken")

    tracker = tracking.Tracker(Broken(), train=True)
    with pytest.warns(tracking.TrackingWarning, match="log failed .*disk full"):
        tracker.progress(lambda p: None)({"step": 1, "total_steps": 1, "loss": 1.0})
    assert not tracker.active
    tracker.record({"metrics": {"x": 1.0}})
    tracker.finish()
