"""A store nobody may write to (a read-only tmpfs mounted for root) fails in one line. The cases
and the stores are test_bad_input's."""
import os
import subprocess

import pytest

from test_bad_input import MICRO, run_case, stores  # noqa: F401 (stores: a fixture)


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nobody may write to: a read-only tmpfs for root (who ignores permissions)."""
    path = tmp_path / "ro"
    path.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], check=True)
        yield path
        subprocess.run(["umount", str(path)], check=True)
    else:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)


def test_a_store_without_write_permission_fails_in_one_line(read_only_dir, stores, capsys):
    code, lines = run_case(["sweep", *MICRO, f"store.root={read_only_dir / 'store'}"], stores, capsys)
    assert (code, len(lines)) == (2, 1), lines
    assert lines[0].startswith(f"error: store.root={read_only_dir / 'store'}: not writable (")
    assert "fix its permissions or choose another store.root" in lines[0]
    assert not list(read_only_dir.iterdir())
