"""analysis.load* on a small fake results store written here in the store's file format."""

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis import analyse, compare, load, load_items, load_runs, summarize, write_report
from analysis.load import load_specs
from analysis.stats import cell_keys
from analysis.load import load_data_kinds, load_paper_flops
from common.metrics import MetricSpec
from jobs.evals import EVALUATIONS
from jobs.registry import TRAIN
from store.store import StoreError

# What the real jobs declare about their metrics and curves, as their runs store it in metrics.json.
JOBS = (TRAIN, *(EVALUATIONS[name] for name in EVALUATIONS.names()))
METRIC_SPECS = {name: spec for job in JOBS for name, spec in job.metrics.items()}
CURVE_SPECS = {name: spec for job in JOBS for name, spec in job.curves.items()}
CURVES = {"tvd_by_context": {"n_context_strings": [1, 2], "regbench_tvd": [0.5, 0.4]}}


def new_store(root: Path, version: int = 2) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "store.json").write_text(json.dumps({"format_version": version}))
    return root


def metrics_record(root: Path, metrics: dict, curves: dict) -> dict:
    """metrics.json as the worker writes it (store/store.py merge_metrics): format 2 with the
    specs the jobs declare for what the run recorded; format 1 without specs."""
    record = {"metrics": metrics,
              "higher_is_better": {m: METRIC_SPECS[m].higher_is_better for m in metrics
                                   if METRIC_SPECS[m].higher_is_better is not None},
              "curves": curves}
    if json.loads((root / "store.json").read_text())["format_version"] >= 2:
        record |= {"specs": {m: METRIC_SPECS[m].to_record() for m in metrics},
                   "curve_specs": {c: CURVE_SPECS[c].to_record() for c in curves}}
    return record


def write_run(root: Path, run_id: str, family: str, size: str, seed: int, metrics: dict | None = None,
              status: str = "done", error: str | None = None, config: dict | None = None,
              items: pd.DataFrame | None = None, curves: dict | None = None) -> None:
    """One run directory; `metrics` (and `curves`, by default a short tvd_by_context) are written
    only for done runs, as the orchestrator does."""
    run_dir = root / "runs" / run_id
    run_dir.mkdir(parents=True)
    layers = {"dense": 4, "lidas": 4, "looped": 2}.get(family, 4)
    resolved = {"seed": seed, "family": {"name": family}, "model": {"name": size, "n_layers": layers},
                "data": {"name": "regbench", "kind": "regbench"},
                "train": {"lr": 1e-3, "steps": 100, "betas": [0.9, 0.95]}}
    for section, values in (config or {}).items():
        resolved.setdefault(section, {}).update(values)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(resolved))
    (run_dir / "state.json").write_text(json.dumps({"status": status, "error": error, "attempts": 1}))
    if status == "done":
        record = metrics_record(root, metrics, CURVES if curves is None else curves)
        (run_dir / "metrics.json").write_text(json.dumps(record))
    if items is not None:
        (run_dir / "items").mkdir()
        items.to_parquet(run_dir / "items" / "regbench.parquet", index=False)


def write_sweep(root: Path, name: str, run_ids: list[str], created_at: str, overrides: list[str]) -> None:
    sweep_dir = root / "sweeps" / name
    sweep_dir.mkdir(parents=True)
    (sweep_dir / "sweep.yaml").write_text(yaml.safe_dump(
        {"name": name, "overrides": overrides, "run_ids": run_ids, "created_at": created_at}))


def items_for(seed: int) -> pd.DataFrame:
    return pd.DataFrame({"item_id": ["a", "b", "c"], "metric": "regbench_tvd",
                         "score": [0.1 * seed, 0.2, 0.3], "weight": 1.0})


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Sweep a: dense and lidas, seeds 0-1, plus a failed lidas seed 2. Sweep b (later): run d0 again
    and a dense run with another learning rate."""
    root = new_store(tmp_path / "store")
    for family in ("dense", "lidas"):
        for seed in (0, 1):
            write_run(root, f"{family[0]}{seed}", family, "tiny", seed,
                      {"regbench_tvd": 0.3 + seed / 100, "train_flops": 1e12}, items=items_for(seed))
    write_run(root, "l2", "lidas", "tiny", 2, status="failed", error="RuntimeError: loss is NaN\n at step 7")
    write_run(root, "d9", "dense", "tiny", 0, {"regbench_tvd": 0.4, "train_flops": 1e12},
              config={"train": {"lr": 3e-3}})
    write_sweep(root, "a", ["d0", "d1", "l0", "l1", "l2"], "2025-01-01T00:00:00", ["family=dense,lidas"])
    write_sweep(root, "b", ["d0", "d9"], "2025-02-01T00:00:00", ["train.lr=1e-3,3e-3"])
    return root


def test_load_one_sweep(store):
    df = load(store, "a")
    assert list(df.columns[:8]) == ["run_id", "sweep", "family", "size", "seed", "metric", "value",
                                    "higher_is_better"]
    assert len(df) == 4 * 2  # four done runs x two metrics; the failed run is not there
    assert set(df["sweep"]) == {"a"} and set(df["run_id"]) == {"d0", "d1", "l0", "l1"}
    assert list(df.columns[8:]) == []  # dense and lidas differ in nothing but family and seed here
    tvd = df[(df["metric"] == "regbench_tvd")].set_index("run_id")
    assert tvd.loc["l1", "value"] == pytest.approx(0.31) and not tvd.loc["l1", "higher_is_better"]
    assert tvd.loc["l1", "seed"] == 1 and tvd.loc["l1", "family"] == "lidas" and tvd.loc["l1", "size"] == "tiny"


def test_varying_config_columns(store, tmp_path):
    assert "train.lr" not in load(store, "a").columns  # constant within sweep a
    b = load(store, "b")
    assert "train.lr" in b.columns and "train.steps" not in b.columns
    assert list(b.columns).count("seed") == 1 and "family.name" not in b.columns
    lr = b.drop_duplicates("run_id").set_index("run_id")["train.lr"]
    assert lr.to_dict() == {"d0": pytest.approx(1e-3), "d9": pytest.approx(3e-3)}
    looped = new_store(tmp_path / "other")
    write_run(looped, "x", "dense", "tiny", 0, {"regbench_tvd": 0.3})
    write_run(looped, "y", "looped", "tiny", 0, {"regbench_tvd": 0.3}, config={"train": {"betas": "auto"}})
    df = load(looped)
    assert {"model.n_layers", "train.betas"} <= set(df.columns)
    assert set(df["train.betas"]) == {"[0.9, 0.95]", "auto"}  # a list and a text: one column of text


def test_keys_of_one_family_only_do_not_split_cells(tmp_path):
    """family.growth.alpha exists only for lidas and model.n_layers differs only for looped: NaN or
    constant within each family, they restate the family and must not stop pairing with dense."""
    root = new_store(tmp_path / "store")
    for family in ("dense", "lidas", "looped"):
        for seed in (0, 1, 2):
            config = {"family": {"growth": {"alpha": 1.0}}} if family == "lidas" else None
            write_run(root, f"{family}{seed}", family, "tiny", seed, {"regbench_tvd": 0.3 - seed / 100}, config=config)
    df = load(root)
    alpha = df.drop_duplicates("run_id").set_index("run_id")["family.growth.alpha"]
    assert alpha["lidas0"] == 1.0 and alpha[["dense0", "looped0"]].isna().all()
    assert {"family.growth.alpha", "model.n_layers"} <= set(df.columns) and cell_keys(df) == []
    assert len(summarize(df)) == 3
    table = compare(df)
    assert list(table["family"]) == ["lidas", "looped"] and set(table["n_pairs"]) == {3}


def test_load_all_runs_takes_the_earliest_sweep(store):
    df = load(store)
    assert set(df["run_id"]) == {"d0", "d1", "l0", "l1", "d9"}
    sweeps = df.drop_duplicates("run_id").set_index("run_id")["sweep"]
    assert sweeps["d0"] == "a" and sweeps["d9"] == "b"
    assert "train.lr" in df.columns


def test_load_runs_lists_every_status(store):
    runs = load_runs(store, "a")
    assert list(runs.columns) == ["run_id", "sweep", "family", "size", "seed", "status", "error"]
    assert len(runs) == 5
    failed = runs.set_index("run_id").loc["l2"]
    assert failed["status"] == "failed" and "loss is NaN" in failed["error"]
    assert failed["family"] == "lidas" and failed["seed"] == 2
    assert set(load_runs(store)["run_id"]) == {"d0", "d1", "l0", "l1", "l2", "d9"}


def test_listed_run_without_a_directory_is_pending_and_a_broken_state_corrupt(store):
    write_sweep(store, "c", ["d0", "zz", "l2"], "2025-03-01T00:00:00", [])
    (store / "runs" / "l2" / "state.json").write_text("{truncated")
    runs = load_runs(store, "c").set_index("run_id")
    assert runs.loc["zz", "status"] == "pending" and runs.loc["d0", "status"] == "done"
    assert runs.loc["l2", "status"] == "corrupt" and "state.json" in runs.loc["l2", "error"]
    assert set(load(store, "c")["run_id"]) == {"d0"}


def test_load_items(store):
    items = load_items(store, "a")
    assert list(items.columns) == ["run_id", "family", "size", "seed", "metric", "item_id", "score", "weight"]
    assert len(items) == 4 * 3
    assert items.loc[items["run_id"] == "l1", "score"].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert load_items(store, "b")["run_id"].unique().tolist() == ["d0"]  # d9 has no item files


def test_errors_name_the_problem(store, tmp_path):
    with pytest.raises(FileNotFoundError, match="no sweep named 'nope'"):
        load(store, "nope")
    with pytest.raises(FileNotFoundError, match="store.json"):
        load(tmp_path / "empty")
    (store / "store.json").write_text(json.dumps({"format_version": 99}))
    with pytest.raises(StoreError, match="format version 99, newer"):
        load_runs(store)
    (store / "store.json").write_text(json.dumps({"format_version": 4}))  # not the marker format 4 writes
    with pytest.raises(StoreError, match="not this orchestrator's marker"):
        load_runs(store)


def test_specs_are_the_ones_the_jobs_declared(store):
    metric_specs, curve_specs = load_specs(store, "a")
    assert metric_specs == {"regbench_tvd": EVALUATIONS["regbench"].metrics["regbench_tvd"],
                            "train_flops": TRAIN.metrics["train_flops"]}
    assert curve_specs == {"tvd_by_context": EVALUATIONS["regbench"].curves["tvd_by_context"]}
    assert load_data_kinds(store, "a") == {"regbench"}


def test_reference_metrics_have_no_direction_and_are_never_compared(tmp_path):
    root = new_store(tmp_path / "store")
    for family in ("dense", "lidas"):
        for seed in (0, 1, 2):
            write_run(root, f"{family}{seed}", family, "tiny", seed,
                      {"regbench_tvd": 0.3 - seed / 100, "ngram1_tvd": 0.42 + (family == "lidas") / 10})
    df = load(root)
    directions = df.drop_duplicates("metric").set_index("metric")["higher_is_better"]
    assert pd.notna(directions["regbench_tvd"]) and not directions["regbench_tvd"]
    assert pd.isna(directions["ngram1_tvd"])  # a reference estimator: never compared
    assert set(compare(df)["metric"]) == {"regbench_tvd"}


def test_paper_flops_are_read_from_the_sweep(store):
    assert load_paper_flops(store, "a").empty
    assert list(load_paper_flops(store, "a").columns) == ["size", "layers", "block", "steps", "ratio"]
    table = [{"block": 4, "layers": 36, "ratio": 0.7267, "size": "3b", "steps": 190000}]
    (store / "sweeps" / "a" / "paper_flops.json").write_text(json.dumps(table))
    paper = load_paper_flops(store, "a")
    assert paper.to_dict("records") == [{"size": "3b", "layers": 36, "block": 4, "steps": 190000, "ratio": 0.7267}]


def test_a_format_1_store_loads_without_specs(tmp_path):
    """A store written before metrics.json had specs: labels are the metric names, directions come
    from higher_is_better, nothing is confirmatory, and the report is still written."""
    root = new_store(tmp_path / "store", version=1)
    run_ids = []
    for family in ("dense", "lidas"):
        for seed in (0, 1, 2):
            run_ids.append(f"{family}{seed}")
            write_run(root, run_ids[-1], family, "tiny", seed,
                      {"regbench_tvd": 0.3 - seed / 100, "ngram1_tvd": 0.42, "train_flops": 1e12})
    write_sweep(root, "old", run_ids, "2025-01-01T00:00:00", [])
    recorded = json.loads((root / "runs" / "dense0" / "metrics.json").read_text())
    assert "specs" not in recorded and "curve_specs" not in recorded
    metric_specs, curve_specs = load_specs(root, "old")
    assert metric_specs == {"ngram1_tvd": MetricSpec("ngram1_tvd", False),
                            "regbench_tvd": MetricSpec("regbench_tvd", False)}
    assert curve_specs == {}
    analysis = analyse(root, "old")
    assert [analysis.label(m) for m in ("regbench_tvd", "train_flops")] == ["regbench_tvd", "train_flops"]
    assert analysis.options.primary_metrics == ()
    assert set(analysis.comparisons["metric"]) == {"regbench_tvd"}
    assert set(analysis.comparisons["correction"]) == {"fdr_bh"}
    report = write_report(root, "old").read_text()
    assert "## Other metrics\n" in report  # recorded without sections
    assert "<summary>regbench_tvd (<code>regbench_tvd</code>, lower is better)</summary>" in report


def test_job_times_are_columns_of_the_run_table_and_one_line_of_the_report(store):
    """Each run's jobs' durations (state.json started_at to ended_at) are `seconds.<job>` in the run
    table and results/runs, and the report's setup says the median per job and each evaluation's
    share of the run."""
    taken = {"d0": (80, 5), "d1": (90, 40), "l0": (70, 6), "l1": (60, 7)}
    for run_id, (train_s, eval_s) in taken.items():
        jobs = {"train": {"status": "done", "started_at": "2025-01-01T00:00:00+00:00",
                          "ended_at": f"2025-01-01T00:{train_s // 60:02d}:{train_s % 60:02d}+00:00"},
                "regbench": {"status": "done", "started_at": "2025-01-01T01:00:00+00:00",
                             "ended_at": f"2025-01-01T01:00:{eval_s:02d}+00:00"}}
        (store / "runs" / run_id / "state.json").write_text(json.dumps({"status": "done", "jobs": jobs}))
    runs = load_runs(store, "a").set_index("run_id")
    assert runs.loc["d1", "seconds.train"] == 90 and runs.loc["d1", "seconds.regbench"] == 40
    assert pd.isna(runs.loc["l2", "seconds.train"])  # the failed run finished no job
    report = write_report(store, "a").read_text()
    (line,) = [line for line in report.splitlines() if line.startswith("- Time per run")]
    # shares of the run: 5/85, 40/130, 6/76, 7/67 -> median (6/76 + 7/67) / 2 = 9%
    assert line.endswith("train 75 s; regbench 6.5 s (9% of the run)"), line
    written = pd.read_csv(store / "sweeps" / "a" / "results" / "runs.csv")
    assert set(written.loc[written["run_id"] == "d1", "seconds.train"]) == {90}
    for run_id in taken:  # every evaluation as long as half the training: pointed out
        state = json.loads((store / "runs" / run_id / "state.json").read_text())
        state["jobs"]["regbench"]["ended_at"] = "2025-01-01T01:00:45+00:00"
        (store / "runs" / run_id / "state.json").write_text(json.dumps(state))
    report = write_report(store, "a").read_text()
    assert "regbench 45 s (38% of the run, more than a quarter)" in report


def write_environments(root: Path, run_id: str, *environments: dict) -> None:
    """runs/<id>/environment.json as the store writes it (store/store.py `start_job`)."""
    entries = [{"id": f"e{i}", "first_used": {"job": "train", "attempt": i + 1, "at": "2025-01-01T00:00:00+00:00"},
                "environment": env} for i, env in enumerate(environments)]
    (root / "runs" / run_id / "environment.json").write_text(json.dumps({"environments": entries}))


def test_the_setup_lists_the_environments_of_the_runs_grouped_by_what_changes_numbers(store):
    """environment.json of each done run, grouped by torch, kernels and threads (not the host), is
    one line of the report's setup and the `environment` column of results/runs; a run without the
    file (written before it existed) is 'not recorded', a run resumed elsewhere names both."""
    cpu = {"torch": "2.13.0+cpu", "device": "cpu", "cpu_capability": "AVX512", "threads": 1, "processes": 1,
           "deterministic": False, "kernel_env": {}, "hostname": "a", "cpu_model": "AMD EPYC"}
    write_environments(store, "d0", cpu)
    write_environments(store, "d1", {**cpu, "hostname": "b", "cpu_model": "Intel Xeon"})  # another host, same kernels
    write_environments(store, "l0", cpu, {**cpu, "cpu_capability": "AVX2"})  # resumed on another kind of machine
    (store / "runs" / "l2" / "environment.json").write_text("{}")  # failed: not counted
    report = write_report(store, "a").read_text()
    (line,) = [line for line in report.splitlines() if line.startswith("- Environments")]
    assert line == ("- Environments: torch 2.13.0+cpu, CPU AVX512, 1 thread (2 runs);"
                    " not recorded (1 run);"
                    " torch 2.13.0+cpu, CPU AVX512, 1 thread + torch 2.13.0+cpu, CPU AVX2, 1 thread (1 run)")
    written = pd.read_csv(store / "sweeps" / "a" / "results" / "runs.csv").drop_duplicates("run_id").set_index("run_id")
    assert written.loc["d1", "environment"] == "torch 2.13.0+cpu, CPU AVX512, 1 thread"
    assert written.loc["l1", "environment"] == "not recorded" and pd.isna(written.loc["l2", "environment"])
    assert list(load_runs(store, "a").columns) == ["run_id", "sweep", "family", "size", "seed", "status", "error"]

    (store / "runs" / "l1" / "environment.json").write_text('{"environments": [')  # damaged: not recorded
    assert analyse(store, "a").runs.set_index("run_id").loc["l1", "environment"] == "not recorded"
