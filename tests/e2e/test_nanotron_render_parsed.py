"""nanotron itself (in the side environment, tests/nanotron_side.py) parses every rendered stage.
The config is test_nanotron_render's."""
import nanotron_side
from jobs.families import family_of
from jobs.nanotron import render
from test_nanotron_render import config


def test_nanotron_itself_parses_every_rendered_stage(tmp_path):
    """nanotron's own get_config_from_file (the pinned commit, in the side environment made by
    `make test`: tests/nanotron_side.py) on every LIDAS stage; tests/e2e/test_nanotron_loader.py
    compares what it parsed with what the config means, for every size."""
    cfg = config("family=lidas")
    paths = []
    for i in range(len(family_of(cfg.family).stages(cfg.model, cfg.train.steps))):
        path = tmp_path / f"stage{i}.yaml"
        path.write_text(render.to_yaml(render.render_stage(cfg, tmp_path, i, f"r-{i}")))
        paths.append({"path": str(path)})
    results = nanotron_side.run("load_configs.py", {"configs": paths})["results"]
    assert [r["ok"] or r["error"] for r in results] == [True] * len(paths)
    for i, r in enumerate(results):
        assert r["derived"]["model_config_class"] == "Qwen2Config" and r["model_config_strict"] is None
        assert r["config"]["model"]["model_config"]["num_hidden_layers"] == 4 * (i + 1)
        par = r["config"]["parallelism"]
        assert par["dp"] * par["tp"] * par["pp"] == 8
