"""Shared fixtures. Tests run on one CPU thread each so that timings do not fight."""
import os

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")
