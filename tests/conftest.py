"""Shared fixtures. Tests run on one CPU thread each so that timings do not fight."""
import os
import signal

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")

# A suite started in the background by a shell without job control (`nohup make test &`) inherits
# SIGINT ignored, and so would every process it starts: the tests that press Ctrl-C on a driver or
# a launcher need it delivered. A handler (unlike "ignored") is reset to the default on exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
