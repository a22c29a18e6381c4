"""GSM8K-format problems: the harness's few-shot text format and where problems come from.

A problem is `{"question": str, "answer": str}` with the answer's reasoning ending in
`#### <number>`, as in `openai/gsm8k`. Sources (`eval.gsm8k.path`): a local JSONL file (one
problem per line; a `{split}` in the path is replaced by `train` / `test`), `hub` for
`openai/gsm8k` through Hugging Face `datasets` (not a dependency of this project: install it),
or, when null, the splits of the run's own text data (jobs/data/arith.py).
"""
from __future__ import annotations

import json
from pathlib import Path

from common.atomic import write_text
from config.evals import GSM8K_HUB

Problem = dict[str, str]


def shot(problem: Problem) -> str:
    """One worked example of the prompt: `Question: {q}\\nAnswer: {a}\\n\\n`."""
    return f"Question: {problem['question']}\nAnswer: {problem['answer']}\n\n"


def query(problem: Problem) -> str:
    """The problem to answer, last in the prompt; the model continues after `Answer:`."""
    return f"Question: {problem['question']}\nAnswer:"


def read_jsonl(path: str | Path) -> list[Problem]:
    """Problems from a JSONL file; a line without a question and an answer is an error."""
    problems = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not (isinstance(row, dict) and isinstance(row.get("question"), str)
                and isinstance(row.get("answer"), str)):
            raise ValueError(f"{path}:{number}: expected {{\"question\": ..., \"answer\": ...}}")
        problems.append({"question": row["question"], "answer": row["answer"]})
    return problems


def write_jsonl(problems: list[Problem], path: str | Path) -> Path:
    """Write problems one JSON object per line (the format `read_jsonl` and `openai/gsm8k` use)."""
    path = Path(path)
    write_text(path, "".join(json.dumps({"question": p["question"], "answer": p["answer"]}) + "\n"
                             for p in problems))
    return path


def load_hub(split: str) -> list[Problem]:
    """`openai/gsm8k` (config `main`) from the Hugging Face hub or its local cache."""
    import datasets

    return [{"question": r["question"], "answer": r["answer"]}
            for r in datasets.load_dataset("openai/gsm8k", "main", split=split)]




def load_split(path: str, split: str) -> list[Problem]:
    """The split from the JSONL `path` (with `{split}` filled in), or from the hub for `hub`."""
    return load_hub(split) if path == GSM8K_HUB else read_jsonl(path.replace("{split}", split))
