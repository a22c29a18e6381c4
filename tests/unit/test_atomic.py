"""The one atomic writer (common/atomic.py): old or new content, never a part; one permission
policy (shared results 0644, secrets 0600); nothing left behind when a write fails."""
import json
import os
import stat

import pandas as pd
import pytest
import yaml

from common.atomic import SECRET, read_json, read_yaml, write_atomic, write_json, write_parquet, write_text, write_yaml


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_files_are_group_readable_unless_secret(tmp_path, umask_022):
    write_json(tmp_path / "a" / "metrics.json", {"x": 1})
    write_parquet(tmp_path / "items.parquet", pd.DataFrame({"x": [1, 2]}))
    write_text(tmp_path / "token", "s3cret", mode=SECRET)
    assert mode(tmp_path / "a" / "metrics.json") == mode(tmp_path / "items.parquet") == 0o644
    assert mode(tmp_path / "token") == 0o600
    assert read_json(tmp_path / "a" / "metrics.json") == {"x": 1}
    assert pd.read_parquet(tmp_path / "items.parquet")["x"].tolist() == [1, 2]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "state.json"
    write_json(path, {"v": 1}, durable=False)

    def half_then_fail(file):
        file.write(b'{"v": 2, "tru')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(path, half_then_fail)
    assert read_json(path) == {"v": 1} and os.listdir(tmp_path) == ["state.json"]
    (tmp_path / "torn.json").write_text('{"v": ')
    with pytest.raises(ValueError, match="unreadable JSON"):
        read_json(tmp_path / "torn.json")
    assert read_json(tmp_path / "missing.json") is None


def test_yaml_records_are_written_in_json_form_and_both_forms_read_alike(tmp_path):
    """`write_yaml` writes YAML's JSON form, which every YAML reader reads; `read_yaml` reads it,
    and the block style this project wrote before, to the same object."""
    record = {"name": "s", "run_ids": [f"{i:012x}" for i in range(3)], "looks": [{"level": 0.025, "n": 2}],
              "note": "a: colon, a 'quote' and \u00e9"}
    write_yaml(tmp_path / "new.yaml", record)
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(record))
    assert json.loads((tmp_path / "new.yaml").read_text()) == record
    assert yaml.safe_load((tmp_path / "new.yaml").read_text()) == record
    assert read_yaml(tmp_path / "new.yaml") == read_yaml(tmp_path / "old.yaml") == record
    (tmp_path / "flow.yaml").write_text("{name: s, run_ids: [a, b]}\n")  # YAML's flow style, not JSON
    assert read_yaml(tmp_path / "flow.yaml") == {"name": "s", "run_ids": ["a", "b"]}
