"""How fast the trainer is, measured side by side in one run. Prints four tables:

1. profile: where a `tiny` step's time goes (torch.profiler, self CPU time by op group), ours
   next to the plain step (per-tensor clipping, per-parameter AdamW), plus data generation.
2. throughput, for each of --sizes: our training step (forward, backward, clip, AdamW) against
   Hugging Face transformers' `LlamaForCausalLM` built with the same hyper-parameters and the
   same weights (their logits are checked to agree first), stepped as HF's Trainer does (default
   clipping, fused AdamW: its default optimizer from torch 2.8 on), at the same threads and
   batch; our step's CPU changes toggled off one by one (the model's fused attention projection
   is not: tests/unit/test_train.py holds it to the plain path); then both under torch.compile (ours
   as `train.compile=true` does it, HF as its Trainer does, and HF with our compile options, to
   show what they alone buy). All variants are timed in alternating rounds so that
   machine noise hits them alike, and the median step is reported.
3. MFU: model FLOPs per second of our step (jobs/flops.py, the accounting the reports use)
   against the measured peak of a large fp32 matmul at the same threads.
4. LIDAS against dense: wall time of whole training runs at equal steps next to the FLOP ratio
   of the schedule (shallow stages cost less).

    python bench/trainer_speed.py [--sizes tiny small] [--threads 2] [--rounds 5] [--lidas-steps 300] [--markdown PATH]

transformers comes from the `bench` extra: `pip install -c requirements.lock -e '.[bench]'`.
`--markdown PATH` also writes the tables as markdown (bench/report.py; `make bench` writes
docs/performance/trainer_speed.md, which docs/performance.md includes).
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import Report, markdown_argument  # noqa: E402
from jobs.data import train_stream
from jobs.families import build_model  # noqa: E402
from jobs.flops import flop_ratio, flops_per_token  # noqa: E402
import jobs.model  # noqa: E402
from jobs.model import ModelConfig  # noqa: E402
from jobs.optim import build_optimizer  # noqa: E402
from jobs.train import compile_options, train, train_step  # noqa: E402
from orchestrator.config import compose_run, hydra_session  # noqa: E402

console = Console()
report = Report(None, console)


def config(size: str, family: str = "dense", *extra: str):
    with hydra_session():
        return compose_run([f"size={size}", f"family={family}", "tracker=none", *extra])


def hf_llama(model_cfg: ModelConfig, ours: torch.nn.Module) -> torch.nn.Module:
    """LlamaForCausalLM with our hyper-parameters, carrying a copy of our weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaForCausalLM(LlamaConfig(
        vocab_size=model_cfg.vocab_size, hidden_size=model_cfg.d_model,
        intermediate_size=model_cfg.d_ff, num_hidden_layers=len(ours.layers),
        num_attention_heads=model_cfg.n_heads, num_key_value_heads=model_cfg.n_kv_heads,
        max_position_embeddings=model_cfg.max_seq_len, rope_theta=model_cfg.rope_theta,
        rms_norm_eps=model_cfg.norm_eps, tie_word_embeddings=model_cfg.tie_embeddings,
        attention_bias=False, mlp_bias=False, hidden_act="silu", attn_implementation="sdpa"))
    names = {"embed": "model.embed_tokens", "norm": "model.norm", "lm_head": "lm_head",
             "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm",
             "attn": "self_attn", "mlp": "mlp"}
    state = {}
    for key, value in ours.state_dict().items():
        parts = key.split(".")
        if parts[0] == "layers":
            parts = ["model", "layers", parts[1], names[parts[2]], *parts[3:]]
        else:
            parts = [*names[parts[0]].split("."), *parts[1:]]
        state[".".join(parts)] = value.clone()
    hf.load_state_dict(state, strict=True)
    return hf


def hf_step(model, optimizer, inputs, targets, grad_clip: float) -> None:
    """A step as Hugging Face's Trainer takes it: logits, cross-entropy, backward, default
    `clip_grad_norm_`, then the optimizer (fused AdamW, its default from torch 2.8 on)."""
    logits = model(input_ids=inputs).logits.float()
    F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def plain_step(model, optimizer, inputs, targets, grad_clip: float) -> None:
    """Our step with per-tensor clipping (and, given one, the per-parameter AdamW): what the
    foreach/fused variants replace, toggled one at a time."""
    F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten(), ignore_index=-100).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip, foreach=False)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def rotate_pairs_in_reals(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """jobs.model.rotate_pairs as Llama's rotation computes it: four real products, a sum and a
    difference, and a stack, each differentiated by autograd."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


@contextlib.contextmanager
def autograd_norm_and_rotation():
    """Our model with autograd's composite RMSNorm (torch.nn.RMSNorm) and the rotation in real
    products: what the hand-written backward and the complex rotation of jobs/model.py replace."""
    own_forward, own_rotation = jobs.model.RMSNorm.forward, jobs.model.rotate_pairs
    jobs.model.RMSNorm.forward = torch.nn.RMSNorm.forward  # type: ignore[method-assign]
    jobs.model.rotate_pairs = rotate_pairs_in_reals
    try:
        yield
    finally:
        jobs.model.RMSNorm.forward = own_forward  # type: ignore[method-assign]
        jobs.model.rotate_pairs = own_rotation


def composite_step(model, optimizer, inputs, targets, grad_clip: float) -> None:
    """Our step with autograd's RMSNorm and the rotation in real products."""
    with autograd_norm_and_rotation():
        train_step(model, optimizer, inputs, targets, grad_clip)


def alternate(contenders: dict, stream, rounds: int, steps_per_round: int) -> dict[str, float]:
    """Median step time of each (step function, model, optimizer) in alternating rounds, so that
    machine noise hits all alike; round 0 warms up (and compiles) and is not counted."""
    times = {name: [] for name in contenders}
    step = 0
    for r in range(rounds + 1):
        for name, (step_fn, model, optimizer) in contenders.items():
            for _ in range(steps_per_round):
                inputs, targets = stream.batch(step)
                start = time.perf_counter()
                step_fn(model, optimizer, inputs, targets, 1.0)
                if r:
                    times[name].append(time.perf_counter() - start)
                step += 1
    return {name: statistics.median(t) for name, t in times.items()}


def matmul_peak(threads: int, n: int = 2048, repeats: int = 10) -> float:
    """Best fp32 FLOP/s of an n x n x n matmul at this thread count."""
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# What each op of a profiled step belongs to, by the first matching fragment of its name.
PROFILE_GROUPS = (("matmul", ("aten::mm", "aten::addmm", "aten::bmm")),
                  ("attention (SDPA)", ("scaled_dot_product",)),
                  ("optimizer (AdamW)", ("adam", "Optimizer.step")),
                  ("elementwise (norms, RoPE, SwiGLU, residuals, clipping)",
                   ("aten::mul", "aten::add", "aten::sub", "aten::div", "aten::silu", "aten::pow", "aten::rsqrt",
                    "aten::sqrt", "aten::neg", "aten::mean", "aten::sum", "aten::norm", "aten::linalg_vector_norm",
                    "aten::_foreach", "aten::clamp")),
                  ("copies and concatenation", ("aten::cat", "aten::copy_", "aten::clone", "aten::_to_copy",
                                                "aten::fill_", "aten::zero_", "aten::empty")))


def profile_step(size: str, threads: int, steps: int = 5) -> None:
    """Where a training step's time goes (torch.profiler, self CPU time by op group), for our step
    and for the plain one; plus data generation, which train() pays outside the step."""
    cfg = config(size)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = build_model(cfg.family, cfg.model)
    stream = train_stream(cfg.data, 0, cfg.train.batch_size)
    data_s = statistics.median(_timed(lambda step=step: stream.batch(step)) for step in range(20))
    table = Table(title=f"where a step's time goes, size={size}, {threads} thread(s), torch.profiler self CPU time")
    variants = {"ours": (lambda m, o, i, t, c: train_step(m, o, i, t, c), build_optimizer(model, cfg.train)),
                "plain step, per-parameter AdamW": (plain_step, build_optimizer(model, cfg.train, fused=False))}
    shares = {}
    for name, (step_fn, optimizer) in variants.items():
        batches = [stream.batch(step) for step in range(steps + 2)]
        for inputs, targets in batches[:2]:
            step_fn(model, optimizer, inputs, targets, 1.0)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for inputs, targets in batches[2:]:
                step_fn(model, optimizer, inputs, targets, 1.0)
        events = [e for e in prof.key_averages()]
        total = sum(e.self_cpu_time_total for e in events)
        grouped = {group: 0.0 for group, _ in PROFILE_GROUPS}
        for event in events:
            group = next((g for g, fragments in PROFILE_GROUPS if any(f in event.key for f in fragments)),
                         "other (views, autograd bookkeeping, Python)")
            grouped[group] = grouped.get(group, 0.0) + event.self_cpu_time_total
        shares[name] = ({g: t / total for g, t in grouped.items()}, total / steps / 1e3,
                        sum(e.count for e in events) / steps)
    table.add_column("op group")
    for name in variants:
        table.add_column(f"{name}: share", justify="right")
    for group in shares["ours"][0]:
        table.add_row(group, *(f"{shares[name][0].get(group, 0.0):.0%}" for name in variants))
    table.add_row("profiled step (ms) / ops per step", *(f"{ms:.1f}ms / {ops:.0f}" for _, ms, ops in shares.values()))
    report.table(table)
    report.note(f"data generation (jobs/data, outside the step): {data_s * 1e3:.2f}ms per batch")


def throughput(size: str, threads: int, rounds: int, steps_per_round: int) -> None:
    cfg = config(size)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    ours = build_model(cfg.family, cfg.model)
    hf = hf_llama(cfg.model, ours)
    stream = train_stream(cfg.data, 0, cfg.train.batch_size)
    probe = stream.batch(0)[0][:2]
    with torch.no_grad():
        gap = (ours(probe) - hf(input_ids=probe).logits.float()).abs().max().item()
    assert gap < 1e-4, f"the two models disagree (max |logit gap| {gap:.2e}): not the same config"
    opt_ours, opt_hf = build_optimizer(ours, cfg.train), build_optimizer(hf, cfg.train)
    opt_loop = build_optimizer(ours, cfg.train, fused=False)
    ours_options = compile_options(torch.device("cpu"))
    # The variants and compiled twins share their weights with the eager models: each step moves
    # them a little, which changes nothing in the time a step takes.
    median = alternate({"HF": (hf_step, hf, opt_hf), "ours": (train_step, ours, opt_ours),
                        "ours, autograd's RMSNorm and rotation": (composite_step, ours, opt_ours),
                        "ours, per-tensor clip": (plain_step, ours, opt_ours),
                        "ours, per-tensor clip, per-parameter AdamW": (plain_step, ours, opt_loop),
                        "ours, compiled": (train_step, torch.compile(ours, options=ours_options), opt_ours),
                        "HF, compiled": (hf_step, torch.compile(hf), opt_hf),
                        "HF, compiled with ours' options": (hf_step, torch.compile(hf, options=ours_options), opt_hf)},
                       stream, rounds, steps_per_round)
    tokens = cfg.train.batch_size * cfg.data.seq_len

    m = cfg.model
    table = Table(title=f"trainer throughput, size={size} (d={m.d_model}, {m.n_layers} layers, "
                        f"batch {cfg.train.batch_size} x {cfg.data.seq_len}), {threads} threads, "
                        f"median of {rounds * steps_per_round} steps each")
    for col in ("trainer", "median step", "tokens/s", "ratio to HF (eager / compiled alike)"):
        table.add_column(col, justify="right")
    labels = {"HF": "HF LlamaForCausalLM (sdpa), Trainer's step", "ours": "ours (jobs/model.py, jobs/train.py)",
              "ours, autograd's RMSNorm and rotation": "ours, autograd's RMSNorm, RoPE in real products",
              "ours, per-tensor clip": "ours, clip_grad_norm_ per tensor",
              "ours, per-tensor clip, per-parameter AdamW": "ours, per-tensor clip, per-parameter AdamW",
              "HF, compiled": "HF, torch.compile",
              "ours, compiled": "ours, train.compile=true (torch.compile)",
              "HF, compiled with ours' options": f"HF, torch.compile with train.compile's options {ours_options}"}
    for name, label in labels.items():
        baseline = median["HF, compiled" if "compiled" in name else "HF"]
        table.add_row(label, f"{median[name] * 1e3:.1f}ms", f"{tokens / median[name]:,.0f}",
                      f"{baseline / median[name]:.2f}")
    report.table(table)
    report.note(f"size={size}: max |logit gap| between the two at init: {gap:.1e}")
    return tokens / median["ours"]


def mfu(size: str, threads: int, tokens_per_s: float) -> None:
    cfg = config(size)
    m = cfg.model
    peak = matmul_peak(threads)
    per_token = flops_per_token(m, m.n_layers, cfg.data.seq_len)
    achieved = tokens_per_s * per_token
    table = Table(title=f"model-FLOPs utilisation, size={size}, {threads} threads")
    for col in ("FLOPs per token", "achieved", "matmul peak (fp32 2048^3)", "MFU"):
        table.add_column(col, justify="right")
    table.add_row(f"{per_token:,}", f"{achieved / 1e9:.1f} GFLOP/s", f"{peak / 1e9:.1f} GFLOP/s",
                  f"{achieved / peak:.1%}")
    report.table(table)


def lidas_vs_dense(size: str, threads: int, steps: int, repeats: int) -> None:
    torch.set_num_threads(threads)
    overrides = [f"train.steps={steps}", f"train.warmup_steps={min(10, steps - 1)}",
                 f"train.checkpoint_every={steps}"]
    cfgs = {f: config(size, f, *overrides) for f in ("dense", "lidas")}
    walls = {f: [] for f in cfgs}
    for _ in range(repeats):
        for family, cfg in cfgs.items():
            stream = train_stream(cfg.data, 0, cfg.train.batch_size)
            with tempfile.TemporaryDirectory() as run_dir:
                walls[family].append(_train_wall(cfg, Path(run_dir), stream))
    dense, lidas = (statistics.median(walls[f]) for f in ("dense", "lidas"))
    table = Table(title=f"LIDAS against dense at equal steps, size={size}, {steps} steps, {threads} threads")
    for col in ("dense wall", "LIDAS wall", "wall ratio", "FLOP ratio (schedule)"):
        table.add_column(col, justify="right")
    table.add_row(f"{dense:.1f}s", f"{lidas:.1f}s", f"{lidas / dense:.3f}",
                  f"{flop_ratio(cfgs['lidas'].family, cfgs['lidas'].model, steps, cfgs['lidas'].data.seq_len):.3f}")
    report.table(table)


def _train_wall(cfg, run_dir: Path, stream) -> float:
    start = time.perf_counter()
    train(cfg, run_dir, stream.batch)
    return time.perf_counter() - start


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--profile-size", default="tiny")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=4)
    parser.add_argument("--lidas-size", default="tiny")
    parser.add_argument("--lidas-steps", type=int, default=300)
    parser.add_argument("--lidas-repeats", type=int, default=2)
    markdown_argument(parser)
    args = parser.parse_args()
    report.arguments(parser, args)
    profile_step(args.profile_size, 1)
    for size in args.sizes:
        tokens_per_s = throughput(size, args.threads, args.rounds, args.steps_per_round)
    mfu(args.sizes[-1], args.threads, tokens_per_s)
    lidas_vs_dense(args.lidas_size, 1, args.lidas_steps, args.lidas_repeats)
    report.write()
