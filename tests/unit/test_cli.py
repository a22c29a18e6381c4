"""The command line (bad input, one line per case with its exit code: tests/unit/test_bad_input.py)."""


def test_every_store_command_takes_store_root_as_sweep_does(tmp_path, capsys):
    from orchestrator.cli import main
    from store.store import Store

    store = Store(tmp_path / "s")
    store.create()
    store.record_sweep("one", ["seed=0"], [])
    for argv in (["status", f"store.root={store.root}"], ["status", "one", "--store", str(store.root)],
                 ["cancel", "one", f"store.root={store.root}"]):
        assert main(argv) == 0, argv
        assert "sweep one" in capsys.readouterr().out
    assert main(["report", "one", f"store.root={store.root}"]) == 1  # found; nothing finished yet
    assert "no finished runs yet" in capsys.readouterr().out
    assert main(["status", f"store.root={tmp_path / 'nowhere'}"]) == 2  # a store error: what was asked cannot be done
    assert "no sweeps in" in capsys.readouterr().err


def test_help_lists_the_config_groups_and_points_to_the_docs(capsys):
    """As a Hydra app's --help: each group of conf/ with its options, the registered evaluations,
    and the manual's page of each command, which must exist."""
    from pathlib import Path

    import pytest

    from jobs.evals import EVALUATIONS
    from orchestrator.cli import main
    from orchestrator.config import CONF_DIR

    for argv in (["--help"], ["sweep", "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0
        out = capsys.readouterr().out
        for group in (d for d in CONF_DIR.iterdir() if d.is_dir()):
            options = ", ".join(sorted(f.stem for f in group.glob("*.yaml")))
            assert any(line.split() == [f"{group.name}:", *options.split()] for line in out.splitlines()), group
        assert f"eval.jobs: {', '.join(EVALUATIONS.names())}" in " ".join(out.split())
    docs = Path(__file__).resolve().parents[2] / "docs"
    for command in ("sweep", "status", "report", "cancel", "wandb-sync", "wandb-dashboard", "run-one"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        pages = [word.strip(".,") for word in capsys.readouterr().out.split() if word.strip(".,").endswith(".md")]
        assert pages and all((docs / page).is_file() for page in pages), (command, pages)


def test_flags_may_come_between_overrides_and_sweep_takes_store(tmp_path, capsys):
    """Hydra's habit: `sweep family=dense --dry-run seed=0,1`; `--store DIR` is store.root."""
    from orchestrator.cli import main

    root = tmp_path / "store"
    assert main(["sweep", "size=micro", "--dry-run", "family=dense", "--name", "mixed", "seed=0,1",
                 "--store", str(root)]) == 0
    out = capsys.readouterr().out
    assert "sweep mixed: 2 runs, 2 to do; dry run, nothing written" in out
    assert not root.exists()


def test_long_sweep_names_end_in_a_hash_of_the_whole_grid():
    from orchestrator.grid import MAX_NAME, default_sweep_name

    def grid(last: str) -> dict[str, list[str]]:
        return {f"train.key_{i:02d}": [f"train.key_{i:02d}=1"] for i in range(12)} | {"zz": [f"zz={last}"]}

    first, second = default_sweep_name(grid("a")), default_sweep_name(grid("b"))
    assert max(len(first), len(second)) <= MAX_NAME and first != second
    (cut, digest), (cut_too, _) = first.rsplit("-", 1), second.rsplit("-", 1)
    assert cut == cut_too and len(digest) == 8
    assert default_sweep_name({"family": ["family=dense", "family=lidas"]}) == "family-dense-lidas"  # short: as before
