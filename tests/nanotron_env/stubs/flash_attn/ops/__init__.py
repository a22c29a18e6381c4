"""Import stand-in package (see _import_standin.py)."""
