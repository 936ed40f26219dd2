"""The GosSkip pub/sub layer: handover rules, fairness quotient, subscription
protocol, publishing through the pubnode ring, adaptation procedures, the
simulator and its command."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from ketten import DecodeError, ProtocolError
from ketten._cli import main
from ketten.plugins.gosskip._adaptation import GlobalView, SampleRequest, SampleResponse, topic_size
from ketten.plugins.gosskip._fairness import TopicLoad, fairness_quotient, max_difference
from ketten.plugins.gosskip._pubsub import (
    MAX_HANDOVER,
    Alive,
    AliveAck,
    Handover,
    LookupRequest,
    Name,
    ProvideChurnnode,
    Publish,
    Pubnode,
    Ref,
    Send,
    Subscribe,
    Unsubscribe,
    Workingnode,
    handover,
    manager_of,
)
from ketten.plugins.gosskip._pubsub_sim import PubSubSimulation, SimConfig
from ketten.plugins.gosskip._report import table_csv


def name(topic: int, order: int) -> Name:
    return Name(topic.to_bytes(32, "big"), order)


# -- handover rules 1-5, case by case ------------------------------------------------

HANDOVER_CASES = [
    # (manager, neighbour, pubnode, side, rule, hand over)
    pytest.param((3, 5), (5, 1), (5, 7), "right", 1, True, id="1-right-neighbour-has-the-topic"),
    pytest.param((7, 1), (5, 9), (5, 12), "left", 1, True, id="1-left-neighbour-has-the-topic"),
    pytest.param((3, 5), (7, 1), (5, 2), "right", 2, False, id="2-right-topic-between-keep"),
    pytest.param((3, 5), (7, 1), (9, 1), "right", 2, True, id="2-right-topic-beyond-hand-over"),
    pytest.param((250, 5), (2, 1), (1, 4), "right", 2, False, id="2-right-between-across-zero"),
    pytest.param((250, 5), (2, 1), (100, 4), "right", 2, True, id="2-right-not-between-wraps"),
    pytest.param((7, 1), (3, 5), (5, 2), "left", 2, True, id="2-left-in-the-neighbours-gap"),
    pytest.param((7, 1), (3, 5), (9, 2), "left", 2, False, id="2-left-outside-the-gap"),
    pytest.param((5, 1), (5, 9), (7, 3), "right", 3, True, id="3-right-shared-topic-hand-over"),
    pytest.param((5, 9), (5, 1), (7, 3), "left", 3, False, id="3-left-shared-topic-keep"),
    pytest.param((5, 9), (5, 3), (5, 4), "left", 4, True, id="4a-below-the-manager"),
    pytest.param((5, 9), (5, 3), (5, 8), "left", 4, True, id="4a-just-below-the-manager"),
    pytest.param((5, 9), (5, 3), (5, 12), "left", 4, False, id="4a-above-the-manager"),
    pytest.param((5, 3), (5, 9), (5, 12), "right", 4, True, id="4b-above-the-neighbour"),
    pytest.param((5, 3), (5, 9), (5, 6), "right", 4, False, id="4b-between-them"),
    pytest.param((5, 3), (5, 9), (5, 10), "right", 4, True, id="4b-just-above-the-neighbour"),
    pytest.param((5, 3), (7, 1), (5, 8), "right", 5, False, id="5-manager-has-the-topic"),
    pytest.param((5, 3), (3, 1), (5, 1), "left", 5, False, id="5-leftmost-keeps-low-orders"),
]


@pytest.mark.parametrize(("manager", "neighbour", "pub", "side", "rule", "hand"), HANDOVER_CASES)
def test_handover_rules_case_by_case(manager: tuple[int, int], neighbour: tuple[int, int],
                                     pub: tuple[int, int], side: str, rule: int,
                                     hand: bool) -> None:
    assert handover(name(*manager), name(*neighbour), name(*pub), side) == (rule, hand)


def test_handover_rules_agree_with_who_manages_what() -> None:
    """On random rings the true manager keeps each pubnode against both neighbours,
    and each neighbour holding it would hand it to the true manager."""
    rng = random.Random(7)
    for _ in range(300):
        topics = rng.sample(range(1, 40), rng.randint(3, 6))
        workers = sorted({name(rng.choice(topics), rng.randrange(1, 1000)) for _ in range(8)},
                         key=lambda n: n.position)
        pub = name(rng.choice(topics + [rng.randrange(1, 40)]), rng.randrange(1, 1000))
        before = [w for w in workers if w.position <= pub.position]
        left = before[-1] if before else workers[-1]
        i = workers.index(left)
        right = workers[(i + 1) % len(workers)]
        owner = manager_of(pub, left, right)
        j = workers.index(owner)
        lower, upper = workers[j - 1], workers[(j + 1) % len(workers)]
        assert not handover(owner, upper, pub, "right")[1], (workers, pub, owner)
        assert not handover(owner, lower, pub, "left")[1], (workers, pub, owner)
        assert handover(lower, owner, pub, "right")[1], (workers, pub, owner)
        assert handover(upper, owner, pub, "left")[1], (workers, pub, owner)


# -- the fairness quotient -------------------------------------------------------------


def test_fairness_quotient_on_a_hand_made_example() -> None:
    # (churn + 1) / (lookup + join + 1), worked out by hand:
    # a: (9 + 1) / (3 + 1 + 1) = 2.0;  b: (0 + 1) / (4 + 0 + 1) = 0.2;  c: (3 + 1) / (1 + 2 + 1) = 1.0
    loads = [TopicLoad("a", 0, 1, 9, 3, 1), TopicLoad("b", 0, 1, 0, 4, 0),
             TopicLoad("c", 0, 1, 3, 1, 2)]
    assert [load.quotient for load in loads] == [2.0, 0.2, 1.0]
    assert max_difference(load.quotient for load in loads) == pytest.approx(1.8)
    assert fairness_quotient(0, 0, 0) == 1.0
    with pytest.raises(ValueError):
        fairness_quotient(-1, 0, 0)


def test_the_simulator_computes_the_quotient_as_defined() -> None:
    sim = PubSubSimulation(SimConfig(nodes=8, topics=3, churn_topic=0, rounds=1, warmup=0))
    sim.churn, sim.lookups, sim.joins = [9, 0, 3], [3, 4, 1], [1, 0, 2]
    result = sim.result()
    by_topic = {load.topic: load for load in result.loads}
    assert by_topic["t0"].quotient == 2.0
    assert by_topic["t1"].quotient == 0.2
    assert by_topic["t2"].quotient == 1.0
    assert result.max_difference == pytest.approx(1.8)
    assert "2.0000" in table_csv([result]) and "1.8000" in table_csv([result])


def test_a_run_counts_only_forwards_of_the_measured_rounds() -> None:
    result = PubSubSimulation(SimConfig(nodes=16, topics=2, churn_topic=1, rounds=20,
                                        warmup=8, seed=3)).run()
    assert sum(load.churn for load in result.loads) > 0
    assert sum(load.lookups for load in result.loads) > 0
    for load in result.loads:
        assert load.quotient == (load.churn + 1) / (load.lookups + load.joins + 1)


# -- the subscription protocol -------------------------------------------------------------


def test_subscription_with_nonce_alive_messages_and_resubscription() -> None:
    worker = Workingnode(Ref("w:1", name(5, 10)))
    pub = Pubnode(Ref("p:1", name(5, 20)), lookup_timeout=3.0, alive_timeout=4.0,
                  first_nonce=41)
    assert pub.subscribe(0.0) == [LookupRequest(41, pub.me.name)]
    assert pub.tick(2.0) == []
    assert pub.tick(3.0) == [LookupRequest(41, pub.me.name)]  # lost: again, same nonce
    assert pub.on_lookup_result(40, worker.me, 3.5) == []  # a stale nonce is ignored
    [subscribe] = pub.on_lookup_result(41, worker.me, 3.5)
    assert subscribe == Send("w:1", Subscribe(41, pub.me, again=False))
    [alive] = worker.on_subscribe(subscribe.message, 3.6)
    assert alive.to == "p:1" and isinstance(alive.message, Alive)
    assert pub.on_alive(alive.message, 3.7) == [Send("w:1", AliveAck(pub.me))]
    assert pub.manager == worker.me
    assert pub.tick(7.0) == []
    # The workingnode falls silent: after alive_timeout the pubnode looks up again,
    # with a new nonce, and says so when it subscribes.
    [again] = pub.tick(7.7)
    assert again.nonce == 42 and pub.resubscriptions == 1
    [subscribe] = pub.on_lookup_result(42, Ref("w:2", name(5, 15)), 8.0)
    assert isinstance(subscribe.message, Subscribe) and subscribe.message.again


def test_a_workingnode_drops_a_silent_pubnode_and_counts_churn() -> None:
    worker = Workingnode(Ref("w:1", name(5, 10)), alive_timeout=4.0, churn_interval=10.0)
    a, b = Ref("p:a", name(5, 20)), Ref("p:b", name(5, 30))
    worker.on_subscribe(Subscribe(1, a), 1.0)
    worker.on_subscribe(Subscribe(1, b), 1.0)
    worker.on_subscribe(Subscribe(2, b, again=True), 2.0)  # not churn
    worker.on_alive_ack(AliveAck(a), 4.0)
    worker.tick(6.5)  # b was last heard at 2.0
    assert worker.managed() == [a]
    assert worker.on_unsubscribe(Unsubscribe(a), 7.0) == []
    worker.tick(10.0)
    assert worker.churn == 3  # two subscriptions and one unsubscription


def test_alive_messages_name_the_pubnode_ring_neighbours_in_order() -> None:
    worker = Workingnode(Ref("w:1", name(5, 10)))
    refs = [Ref(f"p:{o}", name(5, o)) for o in (40, 20, 30)]
    for ref in refs:
        worker.on_subscribe(Subscribe(1, ref), 1.0)
    sends = worker.tick(5.0)
    alive = {s.to: s.message for s in sends if isinstance(s.message, Alive)}
    assert [r.name.order for r in worker.managed()] == [20, 30, 40]
    assert alive["p:30"] == Alive(worker.me, refs[1], refs[0])


def test_procedure_1_asks_for_one_churnnode_at_a_time() -> None:
    worker = Workingnode(Ref("w:1", name(5, 10)), churnnode_lifetime=30.0)
    asked = []
    for i in range(5):
        sends = worker.on_subscribe(Subscribe(1, Ref(f"p:{i}", name(5, 20 + i))), 1.0 + i)
        asked += [s for s in sends if isinstance(s.message, ProvideChurnnode)]
    assert len(asked) == 1 and asked[0].message == ProvideChurnnode(name(5, 0).topic, 31.0)


def test_malformed_input_is_refused_not_crashing() -> None:
    with pytest.raises(DecodeError):
        Name(b"short", 1)
    with pytest.raises(DecodeError):
        Name(bytes(32), -1)
    with pytest.raises(DecodeError):
        Ref("", name(1, 1))
    worker = Workingnode(Ref("w:1", name(5, 10)), max_pubnodes=2)
    worker.on_subscribe(Subscribe(1, Ref("p:1", name(5, 11))), 0.0)
    worker.on_subscribe(Subscribe(1, Ref("p:2", name(5, 12))), 0.0)
    with pytest.raises(ProtocolError):
        worker.on_subscribe(Subscribe(1, Ref("p:3", name(5, 13))), 0.0)
    big = tuple(Ref(f"p:{i}", name(5, i)) for i in range(MAX_HANDOVER + 1))
    with pytest.raises(ProtocolError):
        Workingnode(Ref("w:2", name(5, 1))).on_handover(Handover(big), 0.0)
    pub = Pubnode(Ref("p:1", name(5, 11)))
    with pytest.raises(ProtocolError):
        pub.on_publish(Publish("p:9", 1, name(6, 0).topic, b""), "p:9")
    view = GlobalView()
    with pytest.raises(ProtocolError):
        view.on_response(SampleResponse(99, bytes(32), 1, 1))
    [request] = view.requests(0)
    with pytest.raises(ProtocolError):
        view.on_response(SampleResponse(request.nonce, bytes(32), -1, 1))


# -- procedure 2 (Algorithm 1) ---------------------------------------------------------------


def test_algorithm_1_on_a_hand_made_example() -> None:
    a, b, own = name(1, 0).topic, name(2, 0).topic, name(3, 0).topic
    view = GlobalView()
    requests = view.requests(2)
    assert len(requests) == 3  # one per level 0 .. 2
    for request, (topic, c, g) in zip(requests, [(a, 4, 2), (a, 2, 4), (b, 0, 5)], strict=True):
        view.on_response(GlobalView.answer(SampleRequest(request.nonce), topic, c, g))
    # Averages: a (3, 3), b (0, 5), own (6, 2): c_total 9, g_total 10;
    # k = 6 / (9 + 1) * 10 - 2 = 4 > 0: insert with probability min(1, 4 / 2).
    decision = view.decide(own, 6, 2, 0.99, alone=False)
    assert decision.k == pytest.approx(4.0)
    assert (decision.insert_probability, decision.action) == (1.0, "insert")
    # No churn here: k = 0 - 2 = -2; leave with probability |k| / g_total = 2 / 2.
    decision = view.decide(own, 0, 2, 0.5, alone=False)
    assert decision.k == pytest.approx(-2.0) and decision.action == "leave"
    assert view.decide(own, 0, 2, 0.5, alone=True).action == "stay"


def test_topic_size_estimate() -> None:
    assert topic_size([None, None]) == 1
    assert topic_size([3, 1]) == 1 + 8 + 2


# -- the simulation ------------------------------------------------------------------------


def small(**changes: object) -> SimConfig:
    base: dict[str, object] = dict(nodes=24, topics=3, churn_topic=1, rounds=25, warmup=8,
                                   lookups=1.0, churn_rate=2.0, seed=5)
    base.update(changes)
    return SimConfig(**base)  # type: ignore[arg-type]


def test_publishing_reaches_every_subscriber_of_the_topic_through_the_pubnode_ring() -> None:
    sim = PubSubSimulation(small(churn="subscribe-unsubscribe"))
    sim.run()
    for _ in range(6):  # quiet rounds: the last subscriptions settle
        sim.step(load=False)
    topic = sim.pubs[next(iter(sim.pubs))].me.name.topic
    members = [a for a, p in sim.pubs.items() if p.me.name.topic == topic]
    assert len(members) > 10
    event = sim.publish(members[len(members) // 2], b"hello")
    got = {a for a, p in sim.pubs.items() if event in p.delivered}
    assert got == set(members)


def test_pubnodes_of_a_failed_workingnode_resubscribe() -> None:
    sim = PubSubSimulation(small(churn="none", lookups=0.0))
    sim.run()
    victim = max(sim.workers, key=lambda a: len(sim.workers[a].managed()))
    orphans = [r.address for r in sim.workers[victim].managed()]
    assert orphans
    del sim.workers[victim]  # it fails silently
    for _ in range(12):
        sim.step(load=False)
    for address in orphans:
        pub = sim.pubs[address]
        assert pub.resubscriptions >= 1
        assert pub.manager is not None and pub.manager.address in sim.workers
        assert pub.me in sim.workers[pub.manager.address].managed()


def test_the_simulation_is_deterministic() -> None:
    first = table_csv([PubSubSimulation(small(adaptation="1")).run()])
    second = table_csv([PubSubSimulation(small(adaptation="1")).run()])
    other = table_csv([PubSubSimulation(small(adaptation="1", seed=6)).run()])
    assert first == second
    assert first != other


def test_a_workingnode_has_churn_to_report_only_after_one_whole_interval() -> None:
    worker = Workingnode(Ref("w:1", name(5, 10)), churn_interval=10.0, started=3.0)
    worker.on_subscribe(Subscribe(1, Ref("p:1", name(5, 20))), 4.0)
    worker.tick(12.9)
    assert not worker.measured and worker.churn == 0
    worker.tick(13.0)
    assert worker.measured and worker.churn == 1


@pytest.mark.parametrize("mode", ["2", "2s"])
def test_algorithm_1_waits_for_a_measured_interval(mode: str) -> None:
    # Within its first interval a workingnode reads churn 0; deciding on that
    # would make it leave with probability g_lokal / g_gesamt, whatever the churn.
    config = dict(nodes=32, topics=4, churn_topic=1, warmup=4, interval=30, lookups=1.0,
                  churn_rate=3.0, seed=3, adaptation=mode)
    first = PubSubSimulation(SimConfig(rounds=24, **config)).run()  # type: ignore[arg-type]
    assert (first.inserted, first.removed) == (0, 0)
    later = PubSubSimulation(SimConfig(rounds=90, **config)).run()  # type: ignore[arg-type]
    assert later.inserted + later.removed > 0


def test_adaptation_makes_work_fairer_under_churn_in_one_topic() -> None:
    config = dict(nodes=48, topics=4, churn_topic=1, rounds=80, warmup=10, lookups=1.0,
                  churn_rate=3.0, interval=10, seed=2)
    diff = {mode: PubSubSimulation(SimConfig(adaptation=mode, **config)).run().max_difference  # type: ignore[arg-type]
            for mode in ("off", "1", "2", "2s")}
    assert diff["1"] < diff["off"]
    assert diff["2"] < diff["off"]
    assert diff["2s"] < diff["off"]


# -- the command -----------------------------------------------------------------------------


ARGS = ["sim", "gosskip", "--nodes", "16", "--topics", "3", "--churn-topic", "2",
        "--rounds", "10", "--warmup", "4", "--adaptation", "1"]


def test_the_command_writes_the_table_and_the_chart(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert main([*ARGS, "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert (out / "topics.csv").read_text().startswith("adaptation,topic,pubnodes,nodes,churn")
    text = (out / "topics.md").read_text()
    assert "| topic | pubnodes | nodes | churn | lookup forwards | join forwards " in text
    assert "Max difference of the fairness quotients" in text
    assert (out / "work_vs_churn.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "work_vs_churn.png" in capsys.readouterr().out


def test_the_command_without_matplotlib_still_writes_the_tables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main([*ARGS, "--out", str(tmp_path)]) == 0
    assert (tmp_path / "topics.csv").exists() and (tmp_path / "topics.md").exists()
    assert not (tmp_path / "work_vs_churn.png").exists()
    assert "pip install 'ketten[sim]'" in capsys.readouterr().out


def test_the_command_has_help_and_refuses_bad_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "gosskip", "--help"]) == 0
    assert "--adaptation" in capsys.readouterr().out
    assert main(["sim", "gosskip", "--topics", "2", "--churn-topic", "5"]) == 2
