"""benchmarks/results_file.py: a results JSON named on the command line is read,
or named with its option and path when it cannot be; the scripts' --render use it."""

import importlib

import pytest

from benchmarks.results_file import ResultsFileError, read_results_json


def test_an_object_is_returned(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"rows": [1, 2]}')
    assert read_results_json(path, "--render") == {"rows": [1, 2]}


@pytest.mark.parametrize("content, message", [
    (None, "--render {path}: no such file"),
    ('{"rows": [1,', "--render {path}: not valid JSON (line 1, column 13"),
    ("| a | b |\n|---|---|\n", "--render {path}: not valid JSON (line 1, column 1"),
    ("[1, 2]", "--render {path}: expected a JSON object (a results file), found a list"),
    (b"\xff\xfe\x00", "--render {path}: not a text file"),
])
def test_a_bad_file_is_named_with_its_option(tmp_path, content, message):
    path = tmp_path / "r.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ResultsFileError) as e:
        read_results_json(path, "--render")
    assert str(e.value).startswith(message.format(path=path))


@pytest.mark.parametrize("module, argv", [
    ("chu2023_tv_tuned", ["--render", "{path}"]),
    ("conv_im2col_cpu", ["--render", "{path}"]),
    ("vmapped_conv_cpu", ["--render", "{path}"]),
    ("soteria_gs_architecture", ["--render", "{path}"]),
    ("reproduce_sun2021", ["--render", "{path}"]),
    ("compile_time_cpu", ["--render", "--out", "{dir}"]),
    ("suite_compile_profile", ["--render", "{path}"]),
])
def test_render_of_a_truncated_json_names_the_file(module, argv, tmp_path, capsys):
    # A run killed while writing leaves a truncated JSON: --render says which file.
    name = "compile_time_cpu.json" if module == "compile_time_cpu" else "r.json"
    path = tmp_path / name
    path.write_text('{"rows": [')
    main = importlib.import_module(f"benchmarks.{module}").main
    with pytest.raises(SystemExit) as e:
        main([a.format(path=path, dir=tmp_path) for a in argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{path}: not valid JSON (line 1, column 11" in err
    assert path.read_text() == '{"rows": ['  # left as it was
