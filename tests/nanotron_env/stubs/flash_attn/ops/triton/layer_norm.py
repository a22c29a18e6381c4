"""Import stand-in (see _import_standin.py): every name is a function that raises when called."""
from _import_standin import module_getattr

__getattr__ = module_getattr(__name__)
