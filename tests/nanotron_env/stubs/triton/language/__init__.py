"""Import stand-in for triton.language (see _import_standin.py); tl.constexpr appears in kernel
signatures, evaluated at import."""
from _import_standin import module_getattr


class constexpr:
    pass


__getattr__ = module_getattr(__name__)
