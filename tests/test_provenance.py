import subprocess

import pytest

from benchmarks import provenance


@pytest.fixture
def repo(tmp_path):
    """A one-commit repository with code and a result file."""
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results" / "r.json").write_text("{}\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    return tmp_path


def git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_git_commit_is_dirty_for_code_changes_only(repo):
    head = git(repo, "rev-parse", "HEAD")
    assert provenance.git_commit(repo) == head
    assert provenance.git_state(repo) == {"commit": head, "dirty": False}
    # A result file rewritten by an earlier run of a chain: the code is unchanged.
    (repo / "benchmarks" / "results" / "r.json").write_text('{"rows": []}\n')
    assert provenance.git_commit(repo) == head
    (repo / "code.py").write_text("x = 2\n")
    assert provenance.git_commit(repo) == head + "-dirty"
    assert provenance.git_state(repo) == {"commit": head, "dirty": True}


def test_an_uncommitted_new_script_makes_the_checkout_dirty(repo):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "benchmarks" / "results" / "new.json").write_text("{}\n")  # output: not code
    assert provenance.git_commit(repo) == head
    (repo / ".gitignore").write_text("scratch/\n")
    git(repo, "add", ".gitignore")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "ignore")
    head = git(repo, "rev-parse", "HEAD")
    (repo / "scratch").mkdir()
    (repo / "scratch" / "notes.py").write_text("ignored\n")
    assert provenance.git_commit(repo) == head
    (repo / "benchmarks" / "new_script.py").write_text("print(1)\n")
    assert provenance.git_commit(repo) == head + "-dirty"


def test_git_commit_outside_a_repository_says_unknown(tmp_path):
    assert provenance.git_commit(tmp_path / "missing") == "unknown"
    assert provenance.git_state(tmp_path / "missing") == {"commit": None, "dirty": None}


def test_a_folder_inside_a_checkout_is_not_taken_for_its_code(repo):
    # fedsim installed into a virtual environment inside another repository: git
    # would answer with that repository's HEAD, which is not fedsim's code.
    site = repo / ".venv" / "lib" / "site-packages"
    site.mkdir(parents=True)
    assert provenance.git_state(site) == {"commit": None, "dirty": None}
    assert provenance.git_commit(site) == "unknown"


def test_environment_names_the_code_jax_device_and_convolution():
    import jax

    from fedsim import models
    env = provenance.environment()
    assert env["commit"] == provenance.git_commit()
    assert env["jax"] == jax.__version__ and env["backend"] == jax.default_backend()
    assert env["local_devices"] == jax.local_device_count() and env["processes"] == 1
    assert env["convolution"] == models.conv_settings()
    with models.conv_implementation("xla"):
        assert provenance.environment()["convolution"]["implementation"] == "xla"


def test_a_declared_commit_is_used_only_where_git_cannot_tell(tmp_path, monkeypatch, repo):
    # A copy of the tree without .git (a lent GPU machine's) records the commit
    # its sender declares, marked as declared; a real checkout ignores it.
    monkeypatch.setenv(provenance.SOURCE_COMMIT_ENV, "abc123")
    assert provenance.git_commit(tmp_path / "missing") == "abc123-declared"
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert provenance.git_commit(repo) == head
    monkeypatch.setenv(provenance.SOURCE_COMMIT_ENV, " ")
    assert provenance.git_commit(tmp_path / "missing") == "unknown"


@pytest.mark.parametrize("module", ["reproduce_chu2023", "reproduce_sun2021",
                                    "reproduce_tan2024", "conv_im2col_cpu", "dp_overhead",
                                    "attack_acceptance", "attack_throughput", "control_flow_cpu",
                                    "diagnose_ig_floor", "engine_throughput", "fedavg_inversion",
                                    "gflops", "paper001_table2_ig", "soteria_speed",
                                    "subnormal_eval_cpu", "diagnose_sgi_vs_gi",
                                    "random_draw_compile_cpu"])
def test_benchmarks_record_the_shared_provenance(module):
    # One meaning of "commit" in every results JSON: the scripts use this module's
    # functions, not copies of their own.
    mod = __import__(f"benchmarks.{module}", fromlist=["_"])
    shared = [getattr(mod, n) for n in ("git_commit", "git_state") if hasattr(mod, n)]
    assert shared and all(f in (provenance.git_commit, provenance.git_state) for f in shared)


def test_short_commit_keeps_the_dirty_mark():
    from benchmarks.provenance import short_commit
    h = "0123456789abcdef0123456789abcdef01234567"
    assert short_commit(h) == "0123456"
    assert short_commit(h + "-dirty") == "0123456-dirty"
    assert short_commit(h + "-declared") == "0123456-declared"
    assert short_commit("unknown") == "unknown"
