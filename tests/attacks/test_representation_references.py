"""Checks of attacks/representation.py (Soteria, paper 003 App. A,
Alg. 3): the class-peak rules at their documented boundaries, on kernels whose
column norms are exact in floating point."""

import numpy as np

from attacks import representation as R


def _kernel(norms):
    """A [2, C] kernel whose column c has norm ``norms[c]`` exactly (one nonzero entry)."""
    k = np.zeros((2, len(norms)))
    k[0] = norms
    return k


def test_gap_rule_cuts_at_a_ratio_equal_to_min_gap():
    """Kills R1 (``_gap_cut``: ``ratios[i] < min_gap`` → ``<=``).

    Reference: the docstring of :func:`infer_classes`: "if the largest ratio
    between consecutive ones is ≥ ``min_gap``, keep the classes ranked before
    it". Row norms (4, 8, 3): sorted 8, 4, 3, ratios 2 and 4/3; the largest,
    2, equals the default min_gap = 2, so only class 1 is kept (not all three).
    """
    k = _kernel([4.0, 8.0, 3.0])
    np.testing.assert_array_equal(R.infer_classes(k, rule="gap"), [1])
    assert R.largest_gap_ratio(k) == 2.0


def test_ratio_rule_keeps_a_class_at_exactly_peak_ratio_times_the_max():
    """Kills R2 (``norms >= peak_ratio * max`` → ``>``).

    Reference: the docstring ("keep classes with norm ≥ peak_ratio × max"):
    row norms (1, 4, 2, 0.5) with peak_ratio 0.5 keep classes 1 and 2
    (2 = 0.5 × 4 exactly).
    """
    np.testing.assert_array_equal(R.infer_classes(_kernel([1.0, 4.0, 2.0, 0.5]), peak_ratio=0.5),
                                  [1, 2])


def test_known_number_of_classes_keeps_the_largest_row_norms():
    """Kills R4 (``num_classes_present``: the smallest row norms kept instead of the largest).

    Reference: Alg. 3 (the row norms *peak* at the client's classes) and the
    docstring ("keep exactly this many largest"), ascending order: norms
    (1, 5, 3, 4) with 2 classes present → classes 1 and 3.
    """
    np.testing.assert_array_equal(
        R.infer_classes(_kernel([1.0, 5.0, 3.0, 4.0]), num_classes_present=2), [1, 3])
