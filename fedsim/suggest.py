"""Close-match hints for misspelt names in error messages ("did you mean ...?").

An error that lists sixty allowed config keys names the problem but leaves the
reader to find ``training.rounds`` among them; one that adds "did you mean
'training.rounds'?" does not. The matching is :func:`difflib.get_close_matches`
(Ratcliff/Obershelp similarity) on lower-cased names, so that ``LeNet5`` finds
``lenet5``.
"""

from __future__ import annotations

import difflib
from typing import Iterable

#: difflib's similarity ratio a choice needs to be offered (its own default).
CUTOFF = 0.6


def close_matches(word, choices: Iterable, *, n: int = 1) -> list[str]:
    """Up to ``n`` of ``choices`` closest to ``word``, best first; [] where none is
    close enough, or ``word`` is not a string (a list or number typed in place of a
    name has no spelling to correct)."""
    if not isinstance(word, str) or not word:
        return []
    by_lower: dict[str, str] = {}
    for choice in choices:
        if isinstance(choice, str):
            by_lower.setdefault(choice.lower(), choice)
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=n, cutoff=CUTOFF)
    return [by_lower[f] for f in found]


def did_you_mean(word, choices: Iterable, *, n: int = 1) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices`` to ``word``, else "".

    Meant to end an error message that already names ``word`` and what is allowed.
    """
    found = close_matches(word, choices, n=n)
    if not found:
        return ""
    return "; did you mean " + " or ".join(repr(f) for f in found) + "?"


def did_you_mean_each(words: Iterable, choices: Iterable) -> str:
    """The hint for several unknown names at once, e.g. ``"; did you mean
    'iterations' for 'iteratons'?"``; "" where none has a close match."""
    choices = list(choices)
    words = sorted(words, key=str)
    if len(words) == 1:
        return did_you_mean(words[0], choices)
    pairs = [(w, found[0]) for w in words if (found := close_matches(w, choices))]
    if not pairs:
        return ""
    return "; did you mean " + ", ".join(f"{m!r} for {w!r}" for w, m in pairs) + "?"
