"""Import stand-in for triton (see _import_standin.py).

nanotron's ring-attention modules define kernels at import time (@triton.jit, tl.constexpr in
signatures), so the decorators run and return a kernel that raises when launched or called.
"""
from _import_standin import fail, module_getattr

__version__ = "0.0.0+standin"


class _Kernel:
    def __init__(self, fn, name):
        self.fn, self.name = fn, name

    def __getitem__(self, grid):       # kernel[grid](...)
        fail(self.name)

    def __call__(self, *args, **kwargs):
        fail(self.name)


def jit(fn=None, **options):
    if fn is None:                     # @triton.jit(...)
        return lambda f: _Kernel(f, f"triton.jit({f.__qualname__})")
    return _Kernel(fn, f"triton.jit({fn.__qualname__})")


def autotune(*args, **kwargs):
    return lambda kernel: kernel


heuristics = autotune


class Config:
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


__getattr__ = module_getattr(__name__)
