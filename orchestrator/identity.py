"""Run identity: a stable hash of what determines a run's results, not of where or how it runs."""
from __future__ import annotations

import copy
import hashlib
import json

# Sections and keys that do not change a run's results: where it runs, how it is tracked and
# stored, how often it checkpoints or retries, whether it is compiled (like the thread count, it
# moves the last bits only), and which evaluations are listed (a newly listed
# evaluation runs on the existing run instead of retraining it).
NON_SEMANTIC = ("cluster", "store", "resources", "tracker", "adaptive", "train.max_retries",
                "train.checkpoint_every", "train.compile", "eval.jobs", "eval.resources")


def semantic_config(cfg: dict) -> dict:
    """The part of a resolved config that the run id is computed from."""
    out = copy.deepcopy(cfg)
    for dotted in NON_SEMANTIC:
        *parents, leaf = dotted.split(".")
        node = out
        for p in parents:
            node = node.get(p, {})
        node.pop(leaf, None)
    return out


def run_id(cfg: dict) -> str:
    """12 hex digits of sha256 over the canonical JSON of the semantic config (key order free)."""
    canonical = json.dumps(semantic_config(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def run_label(cfg: dict) -> str:
    """Human name used in progress lines and trackers: `<family>-<size>-s<seed>`."""
    return f"{cfg['family']['name']}-{cfg['model']['name']}-s{cfg['seed']}"
