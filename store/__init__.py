"""The results store: its layout (layout.py), its typed records (records.py), the `Store` that
reads and writes them (store.py), the index of every run's status (index.py), checkpoint digests
(integrity.py) and the upgrade between formats (upgrade.py). It imports nothing of the project
but `common`, so the orchestrator, the jobs and the analysis all read it the same way."""
