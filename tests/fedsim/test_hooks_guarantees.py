"""Defense.guarantees through chains: concatenated, earlier parts' wrapped in FollowedBy."""

from fedsim.hooks import Defense, FollowedBy, chain, unwrap_guarantee


def _d(name, *guarantees):
    return Defense(init=lambda p: (), apply=lambda v, s, **kw: (v, s), stage="upload",
                   name=name, guarantees=guarantees)


def test_a_chain_names_what_acts_after_each_part_in_order():
    a, b, c, d = _d("a", "ga"), _d("b"), _d("c", "gc"), _d("d")
    inner = chain(a, b)
    assert inner.guarantees == (FollowedBy("ga", ("b",)),)
    outer = chain(inner, c, d)
    assert [unwrap_guarantee(g) for g in outer.guarantees] == [("ga", ("b", "c", "d")),
                                                               ("gc", ("d",))]
    assert unwrap_guarantee("plain") == ("plain", ())
    assert chain(_d("x"), c).guarantees == ("gc",)  # the last part's: unwrapped
