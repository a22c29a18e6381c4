"""analysis from a notebook on a copied store: a fresh interpreter imports it without orchestrator or jobs."""
import subprocess
import sys
from pathlib import Path


def test_analysis_reads_only_the_store():
    """analysis must work from a notebook on a copied store: it never imports orchestrator or jobs."""
    code = ("import sys, analysis; "
            "assert not {m.split('.')[0] for m in sys.modules} & {'orchestrator', 'jobs'}, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])  # the repository
