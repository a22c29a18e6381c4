"""Puts the import stand-ins (stubs/: flash_attn, triton, grouped_gemm) on this process's path.

Only for the side environment's scripts here, and only after torch has decided, once, that there is
no triton package (torch.utils._triton.has_triton_package is cached): torch would otherwise take
the stand-in for the real triton and fail inside torch._dynamo / inductor (which torch.optim
imports), as it would break torch.compile in the project's own environment.
"""
import sys
from pathlib import Path

STUBS = Path(__file__).resolve().with_name("stubs")


def activate() -> None:
    from torch.utils._triton import has_triton_package

    if has_triton_package():
        raise RuntimeError("a real triton is importable here; the triton stand-in would shadow it")
    if str(STUBS) not in sys.path:
        sys.path.insert(0, str(STUBS))
