"""Import stand-ins for `flash_attn` and `triton`, for loading nanotron configs on a CPU machine.

nanotron imports both at module import (nanotron/nn/{attention,ring_attention,rotary,layer_norm}.py,
models/qwen.py) although parsing a config calls neither; flash-attn does not build without CUDA and
triton is about a gigabyte. These modules only let those imports succeed: every function or class
they offer raises StandInError when used. They are on the path of the side environment's
subprocesses only (tests/nanotron_side.py), never on the project's own.
"""


class StandInError(RuntimeError):
    pass


def fail(name: str):
    raise StandInError(
        f"{name} is an import stand-in (tests/nanotron_env/stubs): it lets nanotron's config and "
        f"checkpoint code import on a CPU machine, nothing more; running nanotron needs the real package")


def function(name: str):
    def stand_in(*args, **kwargs):
        fail(name)
    stand_in.__name__ = stand_in.__qualname__ = name.rsplit(".", 1)[-1]
    return stand_in


def klass(name: str):
    """A class that can be subclassed at import time and fails when instantiated."""
    def __init__(self, *args, **kwargs):
        fail(name)
    return type(name.rsplit(".", 1)[-1], (), {"__init__": __init__, "__module__": name.rsplit(".", 1)[0]})


def module_getattr(module: str):
    """A module-level __getattr__ (PEP 562): any public name is a function that raises when called."""
    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return function(f"{module}.{attr}")
    return __getattr__
