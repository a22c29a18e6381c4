"""GSM8K 8-shot exact match in lm-evaluation-harness's format, for text models.

Prompt: n_shots worked examples of the train split (`Question: {q}\\nAnswer: {a}\\n\\n` each, drawn
per problem from a seeded generator), then `Question: {q}\\nAnswer:`; greedy decoding until a
stop string. Two scores per problem, as the harness's two filters: `strict` takes the first
`#### <number>`, `flexible` the last number-like string; both are compared with the reference
after removing commas, `$`, everything up to `#### ` and a trailing period, ignoring case.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from common.metrics import MetricSpec
from config.evals import Gsm8kSettings, eval_settings
from config.run import JobConfig
from jobs import tokenizer
from jobs.backends import load_model
from jobs.contract import JobResult, Progress
from jobs.data import arith, gsm8k
from jobs.evals import evaluation
from jobs.generate import greedy
from jobs.model import Decoder


STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")
IGNORE = (re.compile(","), re.compile(r"\$"), re.compile(r"(?s).*#### "), re.compile(r"\.$"))
INVALID = "[invalid]"
SCORED = ("gsm8k_em_strict", "gsm8k_em_flexible")
METRICS = {
    "gsm8k_em_strict": MetricSpec("GSM8K exact match (strict)", higher_is_better=True, headline_for=("arith",),
                                  confirmatory_for=("arith",), claim="LIDAS solves more GSM8K problems, 8-shot",
                                  paper=(("lidas", 0.19), ("dense", 0.12)), paper_at="3B",
                                  measured_with="data=arith with the gsm8k evaluation at a GPU size (360m and up):"
                                  " a claim of the paper's 3B models that the CPU sizes (micro, tiny, small)"
                                  " cannot test"),
    "gsm8k_em_flexible": MetricSpec("GSM8K exact match (flexible)", higher_is_better=True),
    "gsm8k_truncated": MetricSpec("GSM8K prompts cut to fit the context", higher_is_better=False),
}


def extract_strict(text: str) -> str:
    """The number of the first `#### <number>`, or `[invalid]`."""
    match = STRICT.search(text)
    return match.group(1) if match else INVALID


def extract_flexible(text: str) -> str:
    """The last number-like match (a run of digits, `$`, `.`, `,` of length >= 2, or an
    integer), or `[invalid]`."""
    matches = FLEXIBLE.findall(text)
    return next(group for group in matches[-1] if group) if matches else INVALID


def normalise(answer: str) -> str:
    """What exact match compares: without commas, `$`, anything up to `#### `, a final period."""
    for pattern in IGNORE:
        answer = pattern.sub("", answer)
    return answer.lower()


def exact_match(prediction: str, reference: str) -> bool:
    """The harness's exact_match with gsm8k's regexes_to_ignore and ignore_case."""
    return normalise(prediction) == normalise(reference)


def prompt_text(shots: list[gsm8k.Problem], problem: gsm8k.Problem) -> str:
    """The harness's few-shot prompt: the worked shots, then the question to answer."""
    return "".join(gsm8k.shot(s) for s in shots) + gsm8k.query(problem)


def problems(cfg: JobConfig) -> dict[str, list[gsm8k.Problem]]:
    """Train and test problems from the configured source (see jobs/data/gsm8k.py)."""
    path = eval_settings(cfg.eval, "gsm8k", Gsm8kSettings).path
    if path is None and isinstance(cfg.data, arith.ArithDataConfig):
        return arith.splits(cfg.data)
    if path is None:
        raise ValueError(f"eval.gsm8k.path=null: data={cfg.data.name} has no problems of its own; give a "
                         f"GSM8K JSONL path or hub")
    return {split: gsm8k.load_split(path, split) for split in ("train", "test")}


def evaluate(model: Decoder, data: Mapping[str, list[gsm8k.Problem]], settings: Gsm8kSettings) -> JobResult:
    """Generate for the first `limit` test problems (all when null) and score them."""
    train, test = data["train"], data["test"]
    n_shots, max_new = settings.n_shots, settings.max_new_tokens
    if len(train) < n_shots:
        raise ValueError(f"eval.gsm8k.n_shots={n_shots}: the train split has only {len(train)} problems")
    test = test if settings.limit is None else test[:settings.limit]
    keep = model.rope_cos.shape[0] - max_new  # prompt tokens that leave room to answer
    rows = []
    for index, problem in enumerate(test):
        rng = np.random.default_rng([settings.shot_seed, index])
        shots = [train[i] for i in rng.choice(len(train), size=n_shots, replace=False)]
        ids = tokenizer.encode(prompt_text(shots, problem), bos=True)
        truncated = len(ids) > keep
        if truncated:  # cut from the left, as the harness does, keeping the BOS
            ids = ids[:1] + ids[len(ids) - keep + 1:]
        out = greedy(model, ids, max_new)
        strict, flexible = extract_strict(out.text), extract_flexible(out.text)
        rows.append({"item_id": index, "generation": out.text, "stopped_by": out.stopped_by,
                     "prompt_tokens": len(ids), "truncated": truncated, "target": normalise(problem["answer"]),
                     "strict": strict, "flexible": flexible,
                     "gsm8k_em_strict": float(exact_match(strict, problem["answer"])),
                     "gsm8k_em_flexible": float(exact_match(flexible, problem["answer"]))})
    frame = pd.DataFrame(rows)
    items = frame.melt(id_vars=[c for c in frame.columns if c not in SCORED], value_vars=list(SCORED),
                       var_name="metric", value_name="score").assign(weight=1.0)
    first = ["item_id", "metric", "score", "weight"]
    items = items[first + [c for c in items.columns if c not in first]]
    metrics = {name: float(frame[name].mean()) for name in SCORED}
    metrics["gsm8k_truncated"] = float(frame["truncated"].mean())
    return JobResult(metrics=metrics, items=items)


@evaluation("gsm8k", title="GSM8K: grade-school arithmetic, 8-shot", metrics=METRICS)
def gsm8k_job(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    """The registered job: the run's final checkpoint, n_shots-shot exact match."""
    model = load_model(cfg, run_dir)
    return evaluate(model, problems(cfg), eval_settings(cfg.eval, "gsm8k", Gsm8kSettings))
