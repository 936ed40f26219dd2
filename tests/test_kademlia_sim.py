"""Kademlia networks of 1,000 and 10,000 nodes in virtual time.

Approach: a deterministic discrete-event driver
(:class:`ketten.plugins.kademlia._sim.Simulation`) runs the very routing
tables and lookup state machines the trio overlay uses, with an event queue
instead of a transport: messages take 10-20 ms of virtual time, requests to
departed nodes time out after 1 s, and every random choice comes from one
seeded generator, so a seed replays exactly. Nodes join in waves of 50
(meet a random member, look up their own id). A lookup's answer is what
``closest(key, 3)`` of the overlay returns (the closest nodes that answered,
merged with the asking node), checked against the true 3 closest live nodes
found by brute force. The same overlay over real nodes on the memory and TCP
transports is tested in ``test_kademlia_overlay.py`` and ``test_tcp.py``.
"""

from __future__ import annotations

import heapq
import random

import pytest

from ketten.plugins.kademlia._sim import SimNode, Simulation


def success(sim: Simulation, pairs: list[tuple[SimNode, int]], *, paths: int = 1) -> float:
    lookups = sim.lookups(pairs, paths=paths)
    good = sum(
        sim.closest(src, lookup, 3) == sim.true_closest(target, 3)
        for (src, target), lookup in zip(pairs, lookups)
    )
    return good / len(pairs)


def random_pairs(sim: Simulation, count: int,
                 among: list[SimNode] | None = None) -> list[tuple[SimNode, int]]:
    nodes = among if among is not None else sim.alive()
    return [(sim.rng.choice(nodes), sim.rng.getrandbits(256)) for _ in range(count)]


def churn(sim: Simulation, fraction: float, rounds: int, lookups: int) -> float:
    """Replace ``fraction`` of the nodes over ``rounds``, looking up keys after each."""
    per_round = round(len(sim.alive()) * fraction / rounds)
    rates = []
    for _ in range(rounds):
        for victim in sim.rng.sample(sim.alive(), per_round):
            sim.kill(victim)
        sim.grow(per_round)
        rates.append(success(sim, random_pairs(sim, lookups)))
    return sum(rates) / len(rates)


def test_the_true_closest_nodes_are_those_brute_force_finds() -> None:
    sim = Simulation(seed=5)
    for _ in range(300):
        sim.new_node()
    rng = random.Random(1)
    for node in rng.sample(sim.nodes, 100):
        sim.kill(node)
    live = [n.contact.id for n in sim.alive()]
    for trial in range(1000):
        near = rng.choice(live) ^ rng.getrandbits(rng.randrange(1, 256))
        target = near if trial % 2 else rng.getrandbits(256)
        count = rng.choice([1, 3, 20, 199, 200, 250])
        brute = heapq.nsmallest(count, live, key=lambda i: i ^ target)
        assert sim.true_closest(target, count) == brute, (trial, count)
    sim.kill(sim.alive()[0])
    assert len(sim.true_closest(0, 250)) == 199


def test_1000_nodes_converge_and_survive_churn() -> None:
    sim = Simulation(seed=1000)
    sim.grow(1000)
    assert success(sim, random_pairs(sim, 1000)) >= 0.999
    assert churn(sim, 0.2, rounds=10, lookups=100) >= 0.99
    assert len(sim.nodes) == 1200 and len(sim.alive()) == 1000


def test_same_seed_same_run() -> None:
    def run(seed: int) -> list[list[int]]:
        sim = Simulation(seed=seed)
        sim.grow(200)
        pairs = random_pairs(sim, 50)
        return [[c.id for c in lookup.result(5)] + [lookup.statistics().queries]
                for lookup in sim.lookups(pairs)] + [[int(sim.now * 1000), sim.messages]]

    assert run(3) == run(3)
    assert run(3) != run(4)


@pytest.mark.slow
def test_10000_nodes_churn_and_adversaries() -> None:
    sim = Simulation(seed=10_000)
    sim.grow(10_000)
    converged = success(sim, random_pairs(sim, 1000))
    churned = churn(sim, 0.2, rounds=10, lookups=100)
    sim.make_adversaries(0.2)
    honest = [n for n in sim.alive() if not n.adversary]
    single = success(sim, random_pairs(sim, 300, honest), paths=1)
    disjoint = success(sim, random_pairs(sim, 300, honest), paths=4)
    print(f"\n10,000 nodes: converged {converged:.2%}, with 20% replaced {churned:.2%}; "
          f"20% adversaries: d=1 {single:.2%}, d=4 {disjoint:.2%}")
    assert converged >= 0.999
    assert churned >= 0.99
    assert disjoint >= 0.95
    assert disjoint - single >= 0.2
