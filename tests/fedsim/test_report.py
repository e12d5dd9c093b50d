"""fedsim report: a learning curve it cannot write is a warning, not the report's end."""

import pytest

from fedsim.cli import main


def _run(d):
    (d / "metrics.jsonl").write_text('{"round": 0, "train_loss": 1.0, "test_accuracy": 0.5}\n'
                                     '{"round": 1, "train_loss": 0.5, "test_accuracy": 0.75}\n')
    (d / "summary.json").write_text('{"test_accuracy": 0.75}')
    return d


@pytest.mark.parametrize("blocked", ["directory", "permission"])
def test_a_learning_curve_that_cannot_be_written_is_a_one_line_warning(
        tmp_path, capsys, monkeypatch, blocked):
    # A directory in the way, or a read-only run directory / another user's run
    # (simulated: the tests may run as root), ended the report in a traceback.
    run = _run(tmp_path)
    plot = run / "learning_curve.png"
    if blocked == "directory":
        plot.mkdir()
    else:
        import matplotlib.figure

        def refuse(self, path, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(matplotlib.figure.Figure, "savefig", refuse)
    assert main(["report", str(run)]) == 0
    captured = capsys.readouterr()
    assert '"test_accuracy": 0.75' in captured.out  # the report itself
    assert captured.out.splitlines()[-1].split() == ["1", "0.5000", "0.7500", "0.00"]
    why = "IsADirectoryError: Is a directory" if blocked == "directory" else \
        "PermissionError: Permission denied"
    assert captured.err == f"fedsim: warning: {plot} not written ({why})\n"

