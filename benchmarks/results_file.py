"""Reading a results JSON that a command-line option names (``--render``,
``--results``, ``--runs``): one reader, so that a missing file, a file that is
not JSON (a run killed while writing it, a markdown file passed by mistake) or
JSON that is not an object is named with the option and the path, not shown as
json's own traceback."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


class ResultsFileError(ValueError):
    """A results file that cannot be used; the message names the option and the file."""


def read_results_json(path: str | Path, option: str) -> dict:
    """The JSON object in ``path``, named on the command line by ``option``.

    Raises:
        ResultsFileError: ``path`` is not a file, is not valid JSON (the message
            gives json's line and column), or holds something other than an object.
    """
    path = Path(path)
    if not path.is_file():
        raise ResultsFileError(f"{option} {path}: no such file")
    try:
        value = json.loads(path.read_text())
    except UnicodeDecodeError as e:
        raise ResultsFileError(f"{option} {path}: not a text file ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise ResultsFileError(f"{option} {path}: not valid JSON (line {e.lineno}, column "
                               f"{e.colno}: {e.msg})") from None
    if not isinstance(value, dict):
        raise ResultsFileError(f"{option} {path}: expected a JSON object (a results file), "
                               f"found a {type(value).__name__}")
    return value


def read_or_exit(ap: argparse.ArgumentParser, path: str | Path, option: str) -> dict:
    """:func:`read_results_json`, with a bad file reported through ``ap.error``
    (usage line, message, exit status 2) like any other bad argument."""
    try:
        return read_results_json(path, option)
    except ResultsFileError as e:
        ap.error(str(e))
