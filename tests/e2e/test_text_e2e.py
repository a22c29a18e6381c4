"""The text path end to end through the real CLI on a real local Ray: a tiny byte-level model
trained on arith problems scores GSM8K-format exact match above zero, and the report lists it."""
import pandas as pd
import yaml
from helpers import metrics, sweep

# One-shot prompts of one-step problems keep the context (and the test) short; the demo
# (`sweep data=arith`) uses 8 shots and two-step problems in a 1,152-byte context.
TEXT = ["size=micro", "data=arith", "family=dense", "seed=0", "data.arith.two_step=0", "model.max_seq_len=224",
        "train.steps=300", "train.warmup_steps=20", "train.checkpoint_every=150", "eval.gsm8k.n_shots=1",
        "eval.gsm8k.limit=60", "eval.gsm8k.max_new_tokens=40", "cluster.num_cpus=1", "tracker=none"]


def test_arith_sweep_trains_a_text_model_that_scores_gsm8k_exact_match(tmp_path):
    done = sweep(tmp_path, *TEXT, name="text")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_id,) = yaml.safe_load((tmp_path / "sweeps" / "text" / "sweep.yaml").read_text())["run_ids"]
    m = metrics(tmp_path, run_id)
    assert m["gsm8k_em_strict"] > 0 and m["gsm8k_em_flexible"] > 0
    # the console's headline (finished line and primary-metric summary) is GSM8K's, not RegBench's
    assert f"gsm8k_em_strict {m['gsm8k_em_strict']:.4f}" in done.stdout and "regbench_tvd" not in done.stdout
    items = pd.read_parquet(tmp_path / "runs" / run_id / "items" / "gsm8k.parquet")
    strict = items[items["metric"] == "gsm8k_em_strict"]
    assert len(strict) == 60 and strict["score"].mean() == m["gsm8k_em_strict"]
    assert (strict["score"] == (strict["strict"] == strict["target"])).all()
    report = (tmp_path / "sweeps" / "text" / "report.md").read_text()
    section = report.split("### GSM8K exact match (strict) (`gsm8k_em_strict`")[1].split("<details>")[0]
    assert f"| dense | {m['gsm8k_em_strict']:.4g} (n=1" in section
    assert "(<code>gsm8k_em_flexible</code>, higher is better)" in report  # exploratory: folded
