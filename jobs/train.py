"""The training loop: one run of one family and seed, resumable bit-for-bit from its checkpoints.

Bit-identical resumes rest on three facts: the data is a pure function of the step, the learning
rate is a function of the step, and everything else that evolves (weights, AdamW state, depth,
the partly filled logging window) is in the checkpoint. Steps are counted from 0 when indexing
`batches`; "step" in history and checkpoints is the number of optimizer steps completed.

Under torchrun (a process group is initialised) the same loop trains with DDP: `batches(step)`
is the global batch, each rank takes its rows, and the loss is scaled so that DDP's gradient
average equals the gradient of the global batch's token mean. Rank 0 alone writes checkpoints
and reports progress; every rank resumes from the same newest checkpoint.

With a validation split (a fixed training set, jobs/data/regbench.py), rank 0 computes the
validation loss whenever `validation.due` says (once per epoch and after the last step) and keeps
the weights of the lowest one so far in the run tally, so every checkpoint carries the chosen
weights with the step they come from: the evaluations score those (the torch backend's
`load_model`), and a resume continues the choice exactly.

Rank 0 also keeps snapshots, the weights alone at the steps of `snapshot_steps` (jobs/checkpoint.py
`save_snapshot`): the snapshot of step t is the model that step t trains, after t optimizer steps
and any growth at t (the final step's: the final weights). A resume writes those after its
checkpoint again, with the same weights, so an interrupted run keeps the same snapshots.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Optional, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from config.run import JobConfig
from jobs.checkpoint import latest_checkpoint, save_checkpoint, save_snapshot
from jobs.families import Stage, build_model, family_of
from jobs.flops import flops_per_token
from jobs.model import Decoder
from jobs.optim import build_optimizer, learning_rate


Batches = Callable[[int], tuple[Tensor, Tensor]]


class Validation(Protocol):
    """A validation split: when to compute the loss on it, and its batches (inputs, targets)."""

    def due(self, steps_done: int, total_steps: int) -> bool: ...

    def batches(self) -> Iterable[tuple[Tensor, Tensor]]: ...


def resolve_device(cfg: JobConfig) -> torch.device:
    """"auto" takes CUDA only when the run was given a GPU and one is visible."""
    choice = cfg.backend.device
    if choice == "auto":
        wants_gpu = cfg.resources.gpus > 0 and torch.cuda.is_available()
        choice = "cuda" if wants_gpu else "cpu"
    if choice == "cuda" and dist.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())  # set per rank by jobs.launch
    return torch.device(choice)


def data_parallel() -> tuple[int, int]:
    """(rank, world size): (0, 1) in the single-process path."""
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def wrap(model: Decoder) -> torch.nn.Module:
    """The module the loss is computed with: DDP over `model` when data-parallel (rebuilt after
    each growth step, since growth adds parameters), `model` itself otherwise."""
    if not dist.is_initialized():
        return model
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=None)


def check_finite(losses: Tensor, first_step: int) -> None:
    """Raise on the first non-finite loss; losses[i] belongs to step first_step + i."""
    bad = (~torch.isfinite(losses)).nonzero()
    if len(bad):
        step = first_step + int(bad[0])
        raise FloatingPointError(f"training loss is {losses[bad[0]].item()} at step {step} (batches({step}))")


def final_loss(history: list[dict]) -> float:
    """Mean logged loss over the last 10% of logged steps (at least one row)."""
    tail = history[-max(1, math.ceil(len(history) / 10)) :]
    return sum(row["loss"] for row in tail) / len(tail)


def snapshot_steps(count: int, total: int, stages: list[Stage]) -> set[int]:
    """The steps whose weights are kept: `count` evenly spaced ones, the last the final step, and
    the first step of every stage after the first (right after a growth step, where each copied
    layer still equals its source); none when `count` is 0."""
    if count == 0:
        return set()
    return {total * i // count for i in range(1, count + 1)} | {stage.start_step for stage in stages[1:]}


def snapshot(model: Decoder, step: int) -> dict:
    """What a snapshot holds: enough to rebuild the model (jobs/families `build_model`)."""
    return {"step": step, "n_layers": model.depth, "ancestors": list(model.ancestors), "model": model.state_dict()}


def restore(cfg: JobConfig, run_dir: Path, device: torch.device) -> tuple[Decoder, torch.optim.Optimizer, dict]:
    """Model, optimizer and run tally from the newest readable checkpoint, or fresh ones."""
    torch.manual_seed(cfg.effective_init_seed)  # the initial weights: the only torch draw (growth copies layers)
    saved = latest_checkpoint(run_dir)
    model = build_model(cfg.family, cfg.model, saved["ancestors"] if saved else None).to(device)
    optimizer = build_optimizer(model, cfg.train)
    run = {"step": 0, "tokens": 0, "flops": 0, "history": [], "window_losses": [], "train_time_s": 0.0,
           "validation": [], "chosen": None}
    if saved:
        model.load_state_dict(saved["model"])
        if "optimizer" in saved:  # a finished run's final checkpoint has none: no step follows it
            optimizer.load_state_dict(saved["optimizer"])
        run = {key: saved.get(key, default) for key, default in run.items()}  # checkpoints of before validation too
    return model, optimizer, run


@torch.no_grad()
def validation_loss(model: Decoder, validation: Validation, device: torch.device) -> float:
    """Token-mean cross-entropy over the split's counted targets (as the training loss)."""
    total, count = 0.0, 0
    for inputs, targets in validation.batches():
        inputs, targets = inputs.to(device), targets.to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=inputs.is_cuda):
            logits = model(inputs)
        total += F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100,
                                 reduction="sum").item()
        count += int((targets != -100).sum())
    return total / max(count, 1)


def choose(run: dict, model: Decoder, steps_done: int, loss: float) -> None:
    """Record the validation loss after `steps_done` steps; keep the weights if it is the lowest."""
    run["validation"].append({"step": steps_done, "val_loss": loss})
    if run["chosen"] is None or loss < run["chosen"]["val_loss"]:
        run["chosen"] = {"step": steps_done, "val_loss": loss, "ancestors": list(model.ancestors),
                         "model": {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}}


def compile_options(device: torch.device) -> dict | None:
    """Inductor's options for `train.compile=true`: on the CPU the compiled code calls its kernels
    from C++ rather than Python (cpp_wrapper), a few percent of a `tiny` step where kernels are
    small, for no longer compilation (docs/performance.md); elsewhere the defaults."""
    return {"cpp_wrapper": True} if device.type == "cpu" else None


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: Tensor,
               targets: Tensor, grad_clip: float, scale: float = 1.0) -> Tensor:
    """One optimizer step; returns the loss tensor without synchronising on it.

    The loss is the token mean over these rows times `scale`; under DDP, scale = (tokens here /
    tokens in the global batch) x world size, so the averaged gradient is the global mean's."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=inputs.is_cuda):
        logits = model(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    if scale != 1.0:
        loss = loss * scale
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip, foreach=True)  # one op, not two per tensor
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def train(
    cfg: JobConfig,
    run_dir: Path,
    batches: Batches,
    progress: Callable[[dict], None] | None = None,
    validation: Optional[Validation] = None,
) -> dict:
    """Train (or resume, or just report on a finished) run; returns its metrics.

    The caller sets torch's thread count (the orchestrator: resources.cpus); it is part of what
    makes CPU results reproducible, since reductions split differently across threads.
    """
    attempt_start = time.perf_counter()
    train_cfg, total = cfg.train, cfg.train.steps
    rank, world = data_parallel()
    device = resolve_device(cfg)
    model, optimizer, run = restore(cfg, run_dir, device)
    if train_cfg.compile:
        model.compile(options=compile_options(device))  # in place: the state dict keeps its keys; growth recompiles
    module = wrap(model)
    family = family_of(cfg.family)
    stages = family.stages(cfg.model, total)
    grow_to = {stage.start_step: stage.n_layers for stage in stages}
    stage_ends = {stage.end_step for stage in stages}
    snapshots = snapshot_steps(train_cfg.snapshots, total, stages) if rank == 0 else set()

    resumed_at, resumed_tokens, resumed_time = run["step"], run["tokens"], run["train_time_s"]
    # The saved window holds global losses; rank 0 carries them, so the all-reduce counts them once.
    window = [torch.tensor(loss if rank == 0 else 0.0, device=device) for loss in run["window_losses"]]
    loop_start = time.perf_counter()
    for step in range(run["step"], total):
        if model.depth < grow_to.get(step, model.depth):
            while model.depth < grow_to[step]:
                optimizer = family.grow(model, optimizer, lambda m: build_optimizer(m, train_cfg))
            module = wrap(model)
        if step in snapshots:
            save_snapshot(snapshot(model, step), run_dir)
        lr = learning_rate(step, train_cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        inputs, targets = batches(step)
        n_tokens, shape = inputs.numel(), inputs.shape
        scale = 1.0
        if world > 1:  # this rank's rows, and their share of the global batch's counted tokens
            mine = slice(rank * shape[0] // world, (rank + 1) * shape[0] // world)
            counted = max(1, int((targets != -100).sum()))
            scale = float((targets[mine] != -100).sum() * world) / counted
            inputs, targets = inputs[mine], targets[mine]
        inputs, targets = (t.to(device, non_blocking=True) for t in (inputs, targets))
        window.append(train_step(module, optimizer, inputs, targets, train_cfg.grad_clip, scale)
                      / world)

        done, elapsed = step + 1, time.perf_counter() - loop_start
        run["step"], run["train_time_s"] = done, resumed_time + elapsed
        run["tokens"] += n_tokens
        run["flops"] += n_tokens * flops_per_token(cfg.model, model.depth, shape[1])
        if validation is not None and rank == 0 and validation.due(done, total):
            choose(run, model, done, validation_loss(model, validation, device))
        if done == total and done in snapshots:
            save_snapshot(snapshot(model, done), run_dir)
        logging_now = done % train_cfg.log_every == 0 or done == total
        checkpointing = done % train_cfg.checkpoint_every == 0 or done in stage_ends
        if not (logging_now or checkpointing):
            continue
        losses = torch.stack(window)
        if world > 1:
            dist.all_reduce(losses)  # the ranks' shares of each step's global token mean
        losses = losses.cpu()
        check_finite(losses, done - len(window))
        if logging_now:
            row = {"step": done, "loss": losses.mean().item(), "lr": lr, "tokens": run["tokens"],
                   "flops": run["flops"], "n_layers": model.depth}
            run["history"].append(row)
            window = []
        if checkpointing and rank == 0:
            run["window_losses"] = losses[len(losses) - len(window):].tolist()
            save_checkpoint({**run, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "n_layers": model.depth, "ancestors": model.ancestors}, run_dir)
        if logging_now and progress is not None and rank == 0:
            progress({"step": done, "total_steps": total, "loss": row["loss"], "lr": lr,
                      "n_layers": model.depth, "tokens": run["tokens"], "flops": run["flops"],
                      "tokens_per_s": (run["tokens"] - resumed_tokens) / elapsed,
                      "elapsed_s": elapsed, "eta_s": (total - done) * elapsed / (done - resumed_at)})

    chosen = {} if run["chosen"] is None else {
        "chosen_step": run["chosen"]["step"], "chosen_val_loss": run["chosen"]["val_loss"],
        "validation": {"step": [r["step"] for r in run["validation"]],
                       "val_loss": [r["val_loss"] for r in run["validation"]]}}
    return {
        **chosen,
        "final_loss": final_loss(run["history"]),
        "train_flops": run["flops"],
        "train_tokens": run["tokens"],
        "steps": run["step"],
        "n_params": sum(p.numel() for p in model.parameters()),
        "final_layers": model.depth,
        "wall_time_s": time.perf_counter() - attempt_start,
        "tokens_per_s": run["tokens"] / run["train_time_s"] if run["train_time_s"] else 0.0,
        "ancestors": list(model.ancestors),
        "history": run["history"],
    }
