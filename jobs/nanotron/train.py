"""The backend=nanotron training job: nanotron's trainer run stage after stage under torchrun.

Runs in the run's Ray task (one per node for a multi-node job), not under torchrun itself. For
each stage, node rank 0 decides from the files alone where it starts: a stage whose checkpoint
folder holds its end step is done; one with an earlier completed step resumes from its own
folder; otherwise it starts from the previous stage's final checkpoint grown by surgery (or from
scratch for the first stage). The decision is written into the stage's YAML as
`resume_checkpoint_path`, so nanotron never has to find (or silently miss) a checkpoint. After
torchrun exits, the stage must have saved its end step, or the job fails with that reason.
Other nodes follow the same plan on the shared run directory and run their node's ranks.
"""
from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import pandas as pd

from common.atomic import write_text
from config.run import JobConfig
from jobs import launch
from jobs.contract import JobResult
from jobs.nanotron import render
from jobs.nanotron.bridge import ancestors_at, completed_step
from jobs.nanotron.surgery import grow_checkpoint
from jobs.train import final_loss


# nanotron's per-iteration line: "iteration: 12 / 100 | ... | lm_loss: 3.41 | lr: 0.003 | ..."
ITERATION = re.compile(r"iteration: (\d+) / (\d+) \|(.*)")
FIELD = re.compile(r"(\w+): (-?[0-9.]+(?:e[-+]?\d+)?)([KMBTPE]?)(?= \||$)")
SCALE = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}

Runner = Callable[..., None]  # launch.run_torchrun's signature


def parse_iteration(line: str) -> Optional[dict]:
    """The step and numbers of one nanotron log line (human-formatted 1.2K -> 1200.0), or None."""
    m = ITERATION.search(line)
    if not m:
        return None
    row: dict[str, float] = {"step": int(m.group(1))}
    for name, number, suffix in FIELD.findall(m.group(3)):
        row[name] = float(number) * SCALE[suffix]
    return row


def stage_start(cfg: JobConfig, run_dir: Path, index: int) -> Optional[tuple[Optional[Path], bool]]:
    """Where stage `index` starts: None when it is done, else (checkpoints folder to resume
    from or None for scratch, whether to load the optimizer state found there)."""
    stage = render.stages(cfg)[index]
    own = render.stage_dir(run_dir, index) / "checkpoints"
    done = completed_step(own)
    if done is not None and done >= stage.end_step:
        return None
    if done is not None:
        return own, True
    if index == 0:
        return None, True
    return render.stage_dir(run_dir, index) / "grown", False


def _prepare(cfg: JobConfig, run_dir: Path, index: int) -> None:
    """Node rank 0: grow the previous stage's final checkpoint into this stage's grown/ folder."""
    schedule = render.stages(cfg)
    grown = render.stage_dir(run_dir, index) / "grown"
    if index == 0 or completed_step(grown) == schedule[index - 1].end_step:
        return
    previous = render.stage_dir(run_dir, index - 1) / "checkpoints"
    if completed_step(previous) != schedule[index - 1].end_step:
        raise RuntimeError(f"stage {index - 1} has no checkpoint of its end step "
                           f"{schedule[index - 1].end_step} in {previous}")
    yaml_text = render.to_yaml(render.render_stage(cfg, run_dir, index, _run_name(run_dir, index),
                                                   grown, load_optimizer=False))
    grow_checkpoint(cfg, previous, grown, yaml_text)


def _run_name(run_dir: Path, index: int) -> str:
    return f"{Path(run_dir).name}-stage{index}"


def _wait_until(ready: Callable[[], bool], what: str, timeout_s: float = 3600.0) -> None:
    """Other nodes: wait for node rank 0's surgery on the shared run directory."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f} s for {what}; is run_dir on a shared filesystem?")
        time.sleep(2.0)


def train_job(cfg: JobConfig, run_dir: Path, progress: Optional[Callable[[dict], None]],
              rendezvous: Optional[dict] = None, run: Runner = launch.run_torchrun) -> Optional[JobResult]:
    """Train every stage; node rank 0 returns the JobResult (loss curve from nanotron's log)."""
    run_dir = Path(run_dir).resolve()
    rdv = rendezvous or {"node_rank": 0, "master_addr": "127.0.0.1", "master_port": launch.free_port()}
    leader = rdv["node_rank"] == 0
    schedule = render.stages(cfg)
    lay = render.layout(cfg)

    log = run_dir / "nanotron" / "history.jsonl"  # across attempts: a resumed job keeps its curve

    def on_line(line: str) -> None:
        row = parse_iteration(line)
        if row is None or not leader:
            return
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if progress is not None:
            progress({"step": row["step"], "total_steps": cfg.train.steps,
                      **({"loss": row["lm_loss"]} if "lm_loss" in row else {})})

    for index, stage in enumerate(schedule):
        if leader:
            if stage_start(cfg, run_dir, index) is None:
                continue
            _prepare(cfg, run_dir, index)
        else:
            own = render.stage_dir(run_dir, index) / "checkpoints"
            if (completed_step(own) or 0) >= stage.end_step:
                continue
            if index > 0:  # the probe is polled before this iteration ends: it sees this stage's values
                _wait_until(lambda: completed_step(own) is not None or completed_step(  # noqa: B023
                    render.stage_dir(run_dir, index) / "grown") == schedule[index - 1].end_step,  # noqa: B023
                    f"stage {index}'s grown checkpoint")
        start = stage_start(cfg, run_dir, index)
        if start is None:  # finished meanwhile (seen by a node other than rank 0)
            continue
        resume, load_optimizer = start
        doc = render.render_stage(cfg, run_dir, index, _run_name(run_dir, index), resume, load_optimizer)
        with tempfile.TemporaryDirectory(prefix="nanotron-") as tmp:
            config_file = (render.stage_dir(run_dir, index) if leader else Path(tmp)) / render.CONFIG_FILE
            write_text(config_file, render.to_yaml(doc), durable=False)
            run(render.entry(cfg, config_file), nproc_per_node=lay.gpus_per_node, nnodes=lay.nodes,
                node_rank=rdv["node_rank"], master_addr=rdv["master_addr"], master_port=rdv["master_port"],
                env=render.environment(cfg, index),
                on_line=on_line, threads_per_proc=max(1, cfg.resources.cpus // lay.gpus_per_node))
        reached = completed_step(render.stage_dir(run_dir, index) / "checkpoints")
        if leader and reached != stage.end_step:
            raise RuntimeError(f"nanotron stage {index} ({stage.n_layers} layers) exited without "
                               f"saving its end step {stage.end_step} (last completed: {reached})")
    if not leader:
        return None
    rows = {}  # by step: a step logged again after a resume counts once (the later line)
    for line in log.read_text().splitlines() if log.exists() else []:
        row = json.loads(line)
        rows[row["step"]] = row
    history = [rows[step] for step in sorted(rows) if "lm_loss" in rows[step]]
    if not history:
        raise RuntimeError(f"nanotron logged no lm_loss line (see its output); {log} is empty")
    metrics = {"final_loss": final_loss([{"loss": r["lm_loss"]} for r in history]),
               "steps": float(cfg.train.steps)}
    return JobResult(metrics=metrics, curves={"ancestors": ancestors_at(cfg, schedule[-1].n_layers)},
                     history=pd.DataFrame(history).rename(columns={"lm_loss": "loss"}))
