"""Import stand-in for grouped_gemm (see _import_standin.py): nanotron/nn/moe.py imports
grouped_gemm.ops at module import, reached from nanotron.helpers and nanotron.trainer even for dense
models."""
