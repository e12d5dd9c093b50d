"""benchmarks/x64_invariance.py: its child processes, its comparison and its output."""

import json

import pytest

from benchmarks import x64_invariance as bench

RUN = """
seed: 0
data: {dataset: synthetic, num_clients: 4, image_size: 8, max_train: 64, max_test: 32}
model: {name: mlp}
training: {rounds: 1, clients_per_round: 2, batch_size: 8, client_parallelism: loop,
           optimizer: adam, lr: 0.01, server_optimizer: yogi, server_lr: 0.1}
"""

ATTACK = """
seed: 0
data: {dataset: synthetic, num_clients: 8, image_size: 8, max_train: 64, max_test: 32,
       examples_per_client: 1}
model: {name: mlp}
training: {algorithm: fedsgd, rounds: 1, clients_per_round: 2, lr: 0.1, client_parallelism: loop}
observer: {clients: [0, 1], rounds: [0]}
attack: {name: inverting_gradients, grants: {batch_size: true}, config: {iterations: 5}}
output: {plots: false}
"""


def test_rejects_a_baseline_without_fedsim(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--baseline", f"old={tmp_path}"])
    assert "expected a new LABEL=PATH" in capsys.readouterr().err


def test_render_names_a_missing_or_foreign_file(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--render", str(tmp_path / "none.json"), "--out", str(tmp_path)])
    assert "none.json: cannot read a saved result" in capsys.readouterr().err
    (tmp_path / "other.json").write_text('{"rows": []}')
    with pytest.raises(SystemExit):
        bench.main(["--render", str(tmp_path / "other.json"), "--out", str(tmp_path)])
    assert "not an x64_invariance result" in capsys.readouterr().err


@pytest.mark.slow  # four fresh processes (~30 s)
def test_runs_each_case_under_both_settings_and_writes_its_verdict(tmp_path):
    (tmp_path / "run.yaml").write_text(RUN)
    (tmp_path / "attack.yaml").write_text(ATTACK)
    cases = {"tiny run": ["run", str(tmp_path / "run.yaml"), [], 1],
             "tiny attack": ["attack", str(tmp_path / "attack.yaml"), [], None]}
    result = bench.main(["--cases", json.dumps(cases), "--out", str(tmp_path / "out")])
    run, attack = result["cases"]["tiny run"]["this"], result["cases"]["tiny attack"]["this"]
    assert (run["off"]["x64"], run["on"]["x64"]) == (False, True)
    assert run["on"]["params_dtypes"] == ["float32"]
    # Adam and Yogi are what rounded otherwise under x64 before fedsim.x64.
    assert run["same"] and run["max_abs_param_difference"] == 0.0
    assert len(attack["off"]["victims"]) == 2 and attack["same"]
    saved = json.loads((tmp_path / "out" / "x64_invariance.json").read_text())
    assert saved["cases"]["tiny run"]["this"]["same"] is True
    md = (tmp_path / "out" / "x64_invariance.md").read_text()
    assert "| tiny run | this | yes | 0.0 % |" in md and "| tiny attack | this | yes | (attack) |" in md


def test_the_markdown_compares_each_tree_without_x64_to_this_one(tmp_path):
    def run(sha, same=True):
        off = {"params_sha1": sha, "train_losses": [1.0], "test_accuracy": 0.5, "x_train_sha1": "d"}
        return {"off": off, "on": off, "same": same, "max_abs_param_difference": 0.0,
                "params_differing": 0.0}

    result = {"device": "cpu", "jax": "x", "commit": "a" * 40,
              "tree_commits": {t: "b" * 40 for t in ("this", "old", "odd")},
              "trees": {"this": "/a", "old": "/b", "odd": "/c"},
              "cases": {"case": {"this": run("p"), "old": run("p", same=False), "odd": run("q")}}}
    (tmp_path / "saved.json").write_text(json.dumps(result))
    bench.main(["--render", str(tmp_path / "saved.json"), "--out", str(tmp_path)])
    md = (tmp_path / "x64_invariance.md").read_text()
    assert "| case | old | **no** | 0.0 % |" in md
    assert "| case | `old` | `odd` |" in md and "| case | yes | **no** |" in md
