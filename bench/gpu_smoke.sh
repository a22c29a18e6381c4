#!/usr/bin/env bash
# GPU smoke check, for a CUDA machine (a few minutes):
#  1. the torch backend trains size=small on one GPU in bf16 for a few hundred steps; prints
#     tokens/s and the model-FLOPs rate as a fraction of a measured bf16 matmul peak;
#  2. when nanotron is installed (docs/nanotron.md) and NANOTRON_DIR points at its
#     checkout, a 2-stage LIDAS nanotron run of size=micro (random tokens), with its evaluation
#     loading the final nanotron checkpoint through the bridge.
# Usage: bench/gpu_smoke.sh [steps]   (PYTHON=... to pick the interpreter; OUT=... for the store)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python)}
STEPS=${1:-300}
OUT=${OUT:-$(mktemp -d -t gpu-smoke-XXXX)}

"$PY" - "$STEPS" "$OUT" <<'EOF'
import sys, time, tempfile
from pathlib import Path
import torch

if not torch.cuda.is_available():
    sys.exit("gpu_smoke: no CUDA device visible to torch; run this on a GPU machine")
steps, out = int(sys.argv[1]), Path(sys.argv[2])

def matmul_peak(n: int = 8192, reps: int = 20) -> float:
    """FLOP/s of a large bf16 matmul: the reference for the fraction below."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - start)

from orchestrator.config import compose_run, hydra_session
from jobs.registry import train as train_job

with hydra_session():
    cfg = compose_run(["size=small", "family=dense", "tracker=none", "resources.gpus=1",
                       "backend.device=cuda", f"train.steps={steps}", "train.warmup_steps=20",
                       "train.batch_size=64", f"train.checkpoint_every={steps}"])
peak = matmul_peak()
result = train_job(cfg, out / "torch-run", lambda p: None)
m = result.metrics
rate = m["train_flops"] / m["wall_time_s"]
print(f"torch backend, {torch.cuda.get_device_name()}: {steps} steps bf16, "
      f"{m['tokens_per_s']:,.0f} tokens/s, {rate / 1e12:.1f} TFLOP/s model FLOPs = "
      f"{rate / peak:.1%} of the measured bf16 matmul peak ({peak / 1e12:.0f} TFLOP/s); "
      f"final loss {m['final_loss']:.3f}")
EOF

if ! "$PY" -c "import nanotron, flash_attn" 2>/dev/null || [ -z "${NANOTRON_DIR:-}" ]; then
  echo "nanotron: not installed here (or NANOTRON_DIR unset); skipped the nanotron run"
  exit 0
fi
"$PY" -m orchestrator sweep --name gpu-smoke-nanotron backend=nanotron size=micro family=lidas model.n_layers=2 seed=0 \
  resources.gpus=1 resources.cpus=4 resources.memory_gb=16 tracker=none \
  backend.nanotron.dataset=null backend.nanotron.dummy_data=true backend.nanotron.micro_batch_size=8 \
  "backend.nanotron.run_train=$NANOTRON_DIR/run_train.py" cluster.num_gpus=1 \
  "store.root=$OUT/store"
echo "nanotron: 2-stage LIDAS micro run done; store $OUT/store"
