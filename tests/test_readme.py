"""The README's library snippets run as doctests."""

import doctest
from pathlib import Path


README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_snippets():
    result = doctest.testfile(str(README), module_relative=False,
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 10
    assert result.failed == 0, f"{result.failed} README doctest(s) failed"
