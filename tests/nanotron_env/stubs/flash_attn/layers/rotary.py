"""Import stand-in (see _import_standin.py): nanotron subclasses RotaryEmbedding at import time."""
from _import_standin import klass, module_getattr

RotaryEmbedding = klass(f"{__name__}.RotaryEmbedding")
__getattr__ = module_getattr(__name__)
