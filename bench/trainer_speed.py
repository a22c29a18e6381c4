"""How fast the trainer is, measured side by side in one run. Prints three tables:

1. throughput: our training step (forward, backward, clip, AdamW) against Hugging Face
   transformers' `LlamaForCausalLM` built with the same hyper-parameters and the same weights
   (their logits are checked to agree first), at the same threads and batch; the two are timed
   in alternating rounds so that machine noise hits both alike. Then both again under
   torch.compile (ours as `train.compile=true` does it).
2. MFU: model FLOPs per second of our step (jobs/flops.py, the accounting the reports use)
   against the measured peak of a large fp32 matmul at the same threads.
3. LIDAS against dense: wall time of whole training runs at equal steps next to the FLOP ratio
   of the schedule (shallow stages cost less).

    python bench/trainer_speed.py [--size small] [--threads 2] [--rounds 5] [--lidas-steps 300] [--markdown PATH]

transformers comes from the `bench` extra: `pip install -c requirements.lock -e '.[bench]'`.
`--markdown PATH` also writes the tables as markdown (bench/report.py; `make bench` writes
docs/performance/trainer_speed.md, which docs/performance.md includes).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import Report, markdown_argument  # noqa: E402
from jobs.data import train_stream
from jobs.families import build_model  # noqa: E402
from jobs.flops import flop_ratio, flops_per_token  # noqa: E402
from jobs.model import ModelConfig  # noqa: E402
from jobs.optim import build_optimizer  # noqa: E402
from jobs.train import train, train_step  # noqa: E402
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


def step_time(model, optimizer, stream, step: int, hf: bool) -> float:
    inputs, targets = stream.batch(step)
    start = time.perf_counter()
    if hf:
        loss = model(input_ids=inputs, labels=None).logits.float()
        loss = torch.nn.functional.cross_entropy(loss.flatten(0, 1), targets.flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    else:
        train_step(model, optimizer, inputs, targets, 1.0)
    return time.perf_counter() - start


def alternate(contenders: dict, stream, rounds: int, steps_per_round: int) -> dict[str, float]:
    """Median step time of each (model, optimizer, is_hf) in alternating rounds, so that machine
    noise hits all alike; round 0 warms up (and compiles) and is not counted."""
    times = {name: [] for name in contenders}
    step = 0
    for r in range(rounds + 1):
        for name, (model, optimizer, is_hf) in contenders.items():
            for _ in range(steps_per_round):
                t = step_time(model, optimizer, stream, step, is_hf)
                if r:
                    times[name].append(t)
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
    # The compiled twins share their weights and optimizer with the eager models.
    median = alternate({"HF": (hf, opt_hf, True), "ours": (ours, opt_ours, False),
                        "ours, compiled": (torch.compile(ours), opt_ours, False),
                        "HF, compiled": (torch.compile(hf), opt_hf, True)},
                       stream, rounds, steps_per_round)
    tokens = cfg.train.batch_size * cfg.data.seq_len
    ours_tps = tokens / median["ours"]

    m = cfg.model
    table = Table(title=f"trainer throughput, size={size} (d={m.d_model}, {m.n_layers} layers, "
                        f"batch {cfg.train.batch_size} x {cfg.data.seq_len}), {threads} threads")
    for col in ("trainer", "median step", "tokens/s", "ratio to HF eager"):
        table.add_column(col, justify="right")
    labels = {"HF": "HF LlamaForCausalLM (sdpa)", "ours": "ours (jobs/model.py)",
              "ours, compiled": "ours, train.compile=true (torch.compile)",
              "HF, compiled": "HF, torch.compile"}
    for name, label in labels.items():
        table.add_row(label, f"{median[name] * 1e3:.1f}ms", f"{tokens / median[name]:,.0f}",
                      f"{median['HF'] / median[name]:.2f}")
    report.table(table)
    report.note(f"max |logit gap| between the two at init: {gap:.1e}")

    peak = matmul_peak(threads)
    per_token = flops_per_token(m, m.n_layers, cfg.data.seq_len)
    achieved = ours_tps * per_token
    mfu = Table(title=f"model-FLOPs utilisation, size={size}, {threads} threads")
    for col in ("FLOPs per token", "achieved", "matmul peak (fp32 2048^3)", "MFU"):
        mfu.add_column(col, justify="right")
    mfu.add_row(f"{per_token:,}", f"{achieved / 1e9:.1f} GFLOP/s", f"{peak / 1e9:.1f} GFLOP/s",
                f"{achieved / peak:.1%}")
    report.table(mfu)


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
    parser.add_argument("--size", default="small")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=4)
    parser.add_argument("--lidas-size", default="tiny")
    parser.add_argument("--lidas-steps", type=int, default=300)
    parser.add_argument("--lidas-repeats", type=int, default=2)
    markdown_argument(parser)
    args = parser.parse_args()
    report.arguments(parser, args)
    throughput(args.size, args.threads, args.rounds, args.steps_per_round)
    lidas_vs_dense(args.lidas_size, 1, args.lidas_steps, args.lidas_repeats)
    report.write()
