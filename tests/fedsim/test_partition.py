import numpy as np
import pytest

from fedsim import partition


@pytest.fixture
def labels():
    return np.random.default_rng(0).integers(0, 10, 5000)


def _assert_disjoint_cover(parts, n, exact=True):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "an example was assigned twice"
    if exact:
        assert len(allidx) == n and set(allidx) == set(range(n))


def test_iid_assigns_every_example_once_and_is_shuffled(labels):
    parts = partition.iid(labels, 10, seed=1)
    _assert_disjoint_cover(parts, len(labels))
    # Not contiguous blocks: client 0 holds examples from across the dataset.
    assert parts[0].max() - parts[0].min() > len(labels) // 2
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_partitions_are_seeded(labels):
    for fn in (lambda s: partition.iid(labels, 7, s),
               lambda s: partition.dirichlet(labels, 7, 0.3, s),
               lambda s: partition.shards(labels, 7, 2, s)):
        a, b, c = fn(3), fn(3), fn(4)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_dirichlet_skew_grows_as_alpha_shrinks(labels):
    def mean_max_share(alpha):
        parts = partition.dirichlet(labels, 20, alpha, seed=0)
        _assert_disjoint_cover(parts, len(labels))
        return np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts])

    skewed, mild, flat = mean_max_share(0.1), mean_max_share(1.0), mean_max_share(1000.0)
    assert skewed > mild > flat
    assert flat < 0.2  # near-uniform label mix at large alpha


def test_shards_give_k_classes_per_client():
    labels = np.repeat(np.arange(10), 100)  # balanced: shards never straddle classes
    parts = partition.shards(labels, 100 // 2, 2, seed=0)
    _assert_disjoint_cover(parts, len(labels))
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)
    capped = partition.shards(labels, 10, 2, seed=0, examples_per_client=40)
    assert all(len(p) == 40 for p in capped)
    _assert_disjoint_cover(capped, len(labels), exact=False)


def test_natural_groups_and_missing_ids():
    groups = np.array([5, 5, 7, 9, 7, 5])
    parts = partition.natural(groups)
    assert [sorted(p.tolist()) for p in parts] == [[0, 1, 5], [2, 4], [3]]
    with pytest.raises(ValueError, match="natural"):
        partition.natural(None)


def test_pad_indices():
    idx, n = partition.pad_indices([np.array([3, 1]), np.array([0, 2, 4])])
    assert idx.tolist() == [[3, 1, -1], [0, 2, 4]]
    assert n.tolist() == [2, 3]


def test_bad_arguments_are_named(labels):
    with pytest.raises(ValueError, match="alpha"):
        partition.dirichlet(labels, 5, 0.0, 0)
    with pytest.raises(ValueError, match="num_clients"):
        partition.iid(labels[:3], 5, 0)


def test_natural_needs_a_seed_only_to_draw_a_subset():
    groups = np.repeat(np.arange(6), 3)
    assert len(partition.natural(groups)) == 6  # every id, in order: no draw
    with pytest.raises(ValueError, match=r"natural\(num_clients=4\) draws its subset of the 6 "
                                         r"natural ids with seed=, which is missing"):
        partition.natural(groups, 4)
    a, b = partition.natural(groups, 4, seed=1), partition.natural(groups, 4, seed=1)
    assert [list(x) for x in a] == [list(x) for x in b]


def test_labels_and_counts_a_partition_would_misread_are_refused_by_name():
    labels = np.repeat(np.arange(4), 5)  # 20 examples
    one_hot = np.eye(4, dtype=np.float32)[labels]
    # Before, dirichlet read one-hot labels as 80 examples of classes 0/1 and dealt
    # out indices past 20.
    for call in (lambda y: partition.iid(y, 3, 0), lambda y: partition.dirichlet(y, 3, 0.5, 0),
                 lambda y: partition.shards(y, 3, 2, 0)):
        with pytest.raises(ValueError, match=r"labels must be one integer class per example, "
                                             r"shape \[N\]; got float32 of shape \(20, 4\) "
                                             r"\(one-hot\? pass labels.argmax\(-1\)\)"):
            call(one_hot)
        assert sum(map(len, call(labels))) == 20
    with pytest.raises(ValueError, match=r"labels must be one integer class"):
        partition.iid(labels.astype(np.float64), 3, 0)
    for bad in (2.5, True, "3"):  # iid(.., 2.5) made 2 clients
        with pytest.raises(ValueError, match=r"num_clients must be an integer >= 1"):
            partition.iid(labels, bad, 0)
    with pytest.raises(ValueError, match=r"dirichlet alpha must be a finite number > 0, got '0.5'"):
        partition.dirichlet(labels, 3, "0.5", 0)
    with pytest.raises(ValueError, match=r"classes_per_client must be an integer >= 1, got 2.5"):
        partition.shards(labels, 3, 2.5, 0)
    with pytest.raises(ValueError, match=r"num_clients must be an integer >= 1 \(or None"):
        partition.natural(labels, 0, seed=0)  # returned [] before
