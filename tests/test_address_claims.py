"""AddressClaims: which claimed addresses are proven, and when a claim is checked."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ketten._core.claims import AddressClaims


def test_a_claim_is_checked_once_then_taken_once_proven() -> None:
    claims = AddressClaims(retry_after=60.0)
    assert not claims.proven(1, "a:1")
    assert claims.check(1, "a:1", now=0.0)
    assert not claims.check(1, "a:1", now=1.0)  # its ping is still out
    claims.checked(1, "a:1")
    assert not claims.check(1, "a:1", now=2.0)  # tried a moment ago
    claims.prove(1, "a:1")
    assert claims.proven(1, "a:1")
    assert not claims.check(1, "a:1", now=100.0)  # proven: nothing to check
    assert not claims.proven(1, "b:1") and not claims.proven(2, "a:1")


def test_an_unproven_claim_is_checked_again_only_after_retry_after() -> None:
    claims = AddressClaims(retry_after=60.0)
    assert claims.check(7, "x:1", now=0.0)
    claims.checked(7, "x:1")
    assert not claims.check(7, "x:1", now=59.0)
    assert claims.check(7, "x:1", now=60.0)


def test_one_node_has_one_claim_checked_at_a_time() -> None:
    claims = AddressClaims(max_checks=8)
    assert claims.check(1, "a:1", now=0.0)
    assert not claims.check(1, "a:2", now=0.0)  # another address of the same node
    assert claims.check(2, "a:2", now=0.0)
    claims.checked(1, "a:9")  # not the check that is out: changes nothing
    assert not claims.check(1, "a:2", now=0.0)
    claims.checked(1, "a:1")
    assert claims.check(1, "a:2", now=0.0)


def test_checks_at_the_same_time_are_bounded() -> None:
    claims = AddressClaims(max_checks=3)
    assert [claims.check(n, f"h:{n}", now=0.0) for n in range(5)] == [True] * 3 + [False] * 2
    assert claims.checking == 3
    claims.checked(0, "h:0")
    assert claims.check(3, "h:3", now=0.0)


def test_both_memories_are_bounded_least_recently_used_first() -> None:
    claims = AddressClaims(limit=2)
    claims.prove(1, "a")
    claims.prove(2, "b")
    assert claims.proven(1, "a")  # touched: 2 is the oldest now
    claims.prove(3, "c")
    assert claims.proven(1, "a") and claims.proven(3, "c") and not claims.proven(2, "b")
    for n in range(10):
        assert claims.check(100 + n, "t", now=0.0)
        claims.checked(100 + n, "t")
    assert not claims.check(109, "t", now=1.0)  # remembered as tried
    assert claims.check(100, "t", now=1.0)  # pushed out: it may be tried again


@given(st.lists(st.tuples(st.sampled_from(["check", "checked", "prove", "refute"]),
                          st.integers(0, 5), st.sampled_from(["a", "b"]),
                          st.floats(0, 100)), max_size=60))
def test_a_proven_pair_is_never_pinged_and_checks_stay_bounded(
        steps: list[tuple[str, int, str, float]]) -> None:
    claims = AddressClaims(limit=64, retry_after=10.0, max_checks=4)
    now = 0.0
    out: set[tuple[int, str]] = set()
    for op, node, address, dt in steps:
        now += dt
        if op == "check":
            was_proven = claims.proven(node, address)
            if claims.check(node, address, now):
                assert not was_proven
                assert all(n != node for n, _ in out)  # one check per node
                out.add((node, address))
        elif op == "checked":
            claims.checked(node, address)
            out.discard((node, address))
        elif op == "refute":
            claims.refute(node, address, now)
            assert claims.refuted(node, address, now)
        else:
            claims.prove(node, address)
            assert claims.proven(node, address) and not claims.refuted(node, address, now)
        assert claims.checking == len(out) <= 4


def test_a_refuted_claim_stays_refuted_for_retry_after_unless_proven() -> None:
    claims = AddressClaims(retry_after=60.0)
    assert claims.check(5, "h:1", now=0.0)
    claims.refute(5, "h:1", now=1.0)
    claims.checked(5, "h:1")
    assert claims.refuted(5, "h:1", now=60.0)
    assert not claims.refuted(5, "h:1", now=61.0)
    assert not claims.refuted(5, "h:2", now=2.0)
    claims.refute(5, "h:2", now=2.0)
    claims.prove(5, "h:2")  # it answered there after all
    assert not claims.refuted(5, "h:2", now=3.0) and claims.proven(5, "h:2")


def test_a_settled_check_proves_the_claim_only_when_the_claimants_key_answered() -> None:
    claims = AddressClaims(max_checks=1)
    assert claims.check(5, "h:1", now=0.0)
    assert not claims.check(6, "h:2", now=0.0)  # one check out at a time
    assert not claims.settle(5, "h:1", b"another key", b"key of 5")
    assert not claims.proven(5, "h:1") and claims.checking == 0
    assert claims.check(6, "h:2", now=0.0)
    assert not claims.settle(6, "h:2", None, b"key of 6")  # nobody answered
    assert claims.check(7, "h:3", now=0.0)
    assert claims.settle(7, "h:3", b"key of 7", b"key of 7")
    assert claims.proven(7, "h:3") and not claims.check(7, "h:3", now=1.0)
    assert (claims.checks, claims.refutations) == (3, 2)
