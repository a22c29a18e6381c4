"""End to end through the real CLI on a real local Ray: a micro sweep of 3 families x 2 seeds,
its report checked against the stored metrics, reruns that train nothing, Ctrl-C that resumes,
adaptive seeding. Processes killed with SIGKILL are in test_faults.py."""
import json
import signal
import subprocess
from html.parser import HTMLParser

import pandas as pd
import pytest
import yaml
from helpers import CLI, metrics, resumes_after_interrupt, running_train, start_sweep, sweep, wait_for

from jobs.evals import EVALUATIONS
from store import index

MICRO = ["size=micro", "family=lidas,looped,dense", "seed=0,1", "cluster.num_cpus=2"]


@pytest.fixture(scope="module")
def micro_store(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    done = sweep(root, *MICRO)
    assert done.returncode == 0, done.stdout + done.stderr
    return root, done.stdout


def test_sweep_writes_every_run_and_a_report_that_matches_the_metrics(micro_store):
    root, out = micro_store
    spec = yaml.safe_load((root / "sweeps" / "e2e" / "sweep.yaml").read_text())
    assert len(spec["run_ids"]) == 6
    seen = set()
    for rid in spec["run_ids"]:
        run = root / "runs" / rid
        state = json.loads((run / "state.json").read_text())
        assert state["status"] == "done" and state["jobs"]["train"]["attempts"] == 1
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        seen.add((cfg["family"]["name"], cfg["seed"]))
        m = metrics(root, rid)
        assert 0 < m["regbench_tvd"] < 1 and m["train_flops"] > 0
        assert pd.read_parquet(run / "items" / "regbench.parquet")["item_id"].nunique() == 200
        assert not pd.read_parquet(run / "history.parquet").empty
        assert list((run / "checkpoints").glob("step_*.pt"))
    assert seen == {(f, s) for f in ("dense", "lidas", "looped") for s in (0, 1)}

    cells = pd.read_parquet(root / "sweeps" / "e2e" / "results" / "cells.parquet")
    tvd = cells[cells["metric"] == "regbench_tvd"].set_index("family")
    for family in ("dense", "lidas", "looped"):
        values = [metrics(root, rid)["regbench_tvd"] for rid in spec["run_ids"]
                  if yaml.safe_load((root / "runs" / rid / "config.yaml").read_text())["family"]["name"] == family]
        assert tvd.loc[family, "n_seeds"] == 2
        assert tvd.loc[family, "mean"] == pytest.approx(sum(values) / 2, abs=1e-12)
    report = (root / "sweeps" / "e2e" / "report.md").read_text()
    assert "in-context unigram" in report and "lidas" in report
    for table in ("runs", "cells", "comparisons"):
        csv = pd.read_csv(root / "sweeps" / "e2e" / "results" / f"{table}.csv")
        assert set(csv["sweep"]) == {"e2e"} and not csv.empty
    html = (root / "sweeps" / "e2e" / "report.html").read_text()
    assert "data:image/png;base64," in html and "http" not in html.replace("data:image", "")
    assert f"{tvd.loc['dense', 'mean']:.4f}" in report
    assert "report:" in out


class _Outline(HTMLParser):
    """The headings of a page (level, id, text), the link targets, and the text inside <details>."""

    def __init__(self) -> None:
        super().__init__()
        self.headings, self.links, self.folded, self._heading, self._details = [], [], [], None, 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("h1", "h2", "h3"):
            self._heading = [int(tag[1]), attrs.get("id"), ""]
        elif tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.append(attrs["href"][1:])
        elif tag == "details":
            self._details += 1

    def handle_endtag(self, tag):
        if tag in ("h1", "h2", "h3") and self._heading:
            self.headings.append(tuple(self._heading))
            self._heading = None
        elif tag == "details":
            self._details -= 1

    def handle_data(self, data):
        if self._heading:
            self._heading[2] += data
        if self._details:
            self.folded.append(data)


def test_report_html_opens_with_the_answer(micro_store):
    """The first screen: headline, the forest plot, the paper's claims; then the contents, the
    jobs' sections (the headline metric's first), and the setup at the end."""
    root, _ = micro_store
    page = _Outline()
    page.feed((root / "sweeps" / "e2e" / "report.html").read_text())
    top = [text for level, _, text in page.headings if level == 2]
    assert top[:3] == ["Headline", "Claims of the paper", "Contents"]
    assert [text for level, _, text in page.headings if level == 3][0] == "Differences against dense"
    assert top[3] == EVALUATIONS["regbench"].title and top[-4:] == [
        "How sure are we", "Failed and unfinished runs", "Setup", "How to read this"]
    assert {"Induction heads", "Head ablation", "Training"} <= set(top)
    ids = {anchor for _, anchor, _ in page.headings}
    assert page.links and set(page.links) <= ids  # every link of the contents lands on a heading
    assert any(EVALUATIONS["regbench"].metrics["regbench_acc"].label in text for text in page.folded)  # exploratory


def test_rerun_trains_nothing_and_status_reads_the_store(micro_store):
    root, _ = micro_store
    before = {p: p.stat().st_mtime_ns for p in root.glob("runs/*/checkpoints/*.pt")}
    again = sweep(root, *MICRO)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "6 runs, 6 cached" in again.stdout
    assert before == {p: p.stat().st_mtime_ns for p in root.glob("runs/*/checkpoints/*.pt")}
    status = subprocess.run([*CLI, "status", "--store", str(root)], capture_output=True, text=True)
    assert status.returncode == 0 and "done 6" in status.stdout
    folded = index.read(str(root))  # each sweep folded its journals into a snapshot as it ended
    assert folded.generation >= 0 and folded.unfolded == 0 and len(folded.runs) == 6
    dry = subprocess.run([*CLI, "sweep", *MICRO, "seed=0,1,2", f"store.root={root}", "--dry-run"],
                         capture_output=True, text=True)
    words = [line.split()[-1] for line in dry.stdout.splitlines() if line.endswith(("cached", "new"))]
    assert sorted(words) == ["cached"] * 6 + ["new"] * 3


LONG = ["size=micro", "family=lidas", "seed=0", "train.steps=400", "train.checkpoint_every=40",
        "cluster.num_cpus=1", "eval.jobs=[regbench]", "tracker=none"]


def test_ctrl_c_marks_jobs_interrupted_and_the_same_command_resumes(tmp_path):
    root = tmp_path / "store"
    driver = start_sweep(root, *LONG)
    wait_for(lambda: running_train(root), process=driver)
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=120)
    assert driver.returncode == 130, out
    assert "interrupted" in out
    resumes_after_interrupt(root, *LONG)


def test_adaptive_sweep_runs_declared_looks_and_records_each(tmp_path):
    root = tmp_path / "store"
    done = sweep(root, "size=micro", "family=lidas,dense", "adaptive.metric=regbench_tvd",
                 "adaptive.max_seeds=4", "adaptive.looks=[2,3]", "adaptive.delta_min=0.001",
                 "eval.jobs=[regbench]", "tracker=none", "cluster.num_cpus=2", name="adaptive")
    assert done.returncode in (0, 1), done.stdout + done.stderr
    spec = yaml.safe_load((root / "sweeps" / "adaptive" / "sweep.yaml").read_text())
    looks = spec["looks"]
    assert [look["look"] for look in looks] == list(range(1, len(looks) + 1))
    assert [look["n_seeds"] for look in looks] == [2, 3, 4][:len(looks)]
    assert all(look["level"] == pytest.approx(1 - 0.05 / 3) for look in looks)
    assert all(look["decision"] == "continue" for look in looks[:-1])
    assert looks[-1]["decision"] != "continue"
    assert len(spec["run_ids"]) == 2 * looks[-1]["n_seeds"]
    seeds = {yaml.safe_load((root / "runs" / r / "config.yaml").read_text())["seed"] for r in spec["run_ids"]}
    assert seeds == set(range(looks[-1]["n_seeds"]))
    report = (root / "sweeps" / "adaptive" / "report.md").read_text()
    assert "## Looks (adaptive seeding)" in report and looks[-1]["decision"] in report
    cells = pd.read_parquet(root / "sweeps" / "adaptive" / "results" / "cells.parquet")
    assert cells["ci_level"].astype(float).round(6).eq(round(1 - 0.05 / 3, 6)).all()


def test_an_adaptive_look_whose_runs_fail_is_not_taken_and_the_sweep_ends(tmp_path):
    """Runs that fail at every attempt (a loss that overflows) leave a look without its seeds: the
    sweep says the look was not taken and ends (exit 1) instead of planning the same runs again,
    records no look, and each run was tried once (its error is deterministic)."""
    root = tmp_path / "store"
    done = sweep(root, "size=micro", "family=lidas,dense", "train.lr=1e30", "adaptive.metric=regbench_tvd",
                 "adaptive.max_seeds=3", "adaptive.looks=[2,3]", "eval.jobs=[regbench]", "tracker=none",
                 "cluster.num_cpus=2", name="failing")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("look 1 not taken: runs of its seeds failed") == 1, done.stdout
    spec = yaml.safe_load((root / "sweeps" / "failing" / "sweep.yaml").read_text())
    assert not spec.get("looks")
    assert len(spec["run_ids"]) == 4
    for run in spec["run_ids"]:
        state = json.loads((root / "runs" / run / "state.json").read_text())
        assert state["status"] == "failed" and state["jobs"]["train"]["attempts"] == 1


def test_a_done_run_keeps_its_final_weights_and_a_newly_listed_evaluation_runs_on_them(tmp_path):
    """store.keep_checkpoints=final_weights (the default): once every job of a run is done, one
    checkpoint is left, without optimizer state; an evaluation listed later still runs on it,
    and nothing retrains. last_two keeps both checkpoints as training left them."""
    import torch

    from jobs.checkpoint import checkpoint_paths

    base = ["size=micro", "family=dense", "seed=0", "cluster.num_cpus=1", "tracker=none"]
    first = sweep(tmp_path / "a", *base, "eval.jobs=[regbench]")
    assert first.returncode == 0, first.stdout + first.stderr
    (run,) = (tmp_path / "a" / "runs").iterdir()
    (final,) = checkpoint_paths(run)
    assert "optimizer" not in torch.load(final, weights_only=True)
    later = sweep(tmp_path / "a", *base, "eval.jobs=[regbench,induction]")
    assert later.returncode == 0, later.stdout + later.stderr
    state = json.loads((run / "state.json").read_text())
    assert state["jobs"]["induction"]["status"] == "done" and state["jobs"]["train"]["attempts"] == 1
    assert "induction_topk_mean" in metrics(tmp_path / "a", run.name)
    kept = sweep(tmp_path / "b", *base, "eval.jobs=[regbench]", "store.keep_checkpoints=last_two")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    (run,) = (tmp_path / "b" / "runs").iterdir()
    assert len(checkpoint_paths(run)) == 2
    assert all("optimizer" in torch.load(p, weights_only=True) for p in checkpoint_paths(run))
