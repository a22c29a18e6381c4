"""Import stand-in for flash_attn (see _import_standin.py): importable, raises when used."""
from _import_standin import module_getattr

# Within the range nanotron declares (flash-attn>=2.5,<2.7), so nanotron takes the same import
# path as with the real package; the local part says what this is.
__version__ = "2.6.3+standin"
__getattr__ = module_getattr(__name__)
