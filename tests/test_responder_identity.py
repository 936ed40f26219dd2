"""Answers count for the node that gave them, never for the node that was asked.

An address can change hands (a node restarted on another's old port) or be
claimed by a peer; when one node answers at the address of two members, its
one copy must not count as two acks, and its vote not as two votes.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ketten import criterion_key
from ketten._core.membership import Member
from ketten._core.messages import Locate
from ketten._node.replica_sets import ReplicaSets
from ketten.errors import KettenError, PeerUnreachable
from ketten.testing import open_cluster


async def test_an_answer_from_another_key_is_a_failure(
        autojump_clock: trio.testing.MockClock) -> None:
    async with open_cluster(3, seed=31) as cluster:
        rpc = cluster[0]._rpc
        asked_as = cluster[2].identity.public_key
        with pytest.raises(PeerUnreachable, match=r"answered as node .* not as the node"):
            await rpc.call(cluster[1].address, Locate((bytes(32),)), expect=asked_as)
        assert rpc.statistics().wrong_responders == 1
        peer, _ = await rpc.call(cluster[1].address, Locate((bytes(32),)),
                                 expect=cluster[1].identity.public_key)
        assert peer.public_key == cluster[1].identity.public_key


async def test_one_copy_behind_two_members_addresses_is_not_two_acks(
        autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch) -> None:
    async with open_cluster(5, seed=32, replication=5) as cluster:
        key = criterion_key("twice")
        await cluster[0].publish(key, b"genesis", deadline=20)
        with trio.fail_after(60):
            while True:
                leaders = [i for i in range(5)
                           if (r := cluster[i]._replicator.loaded(key)) is not None
                           and r.is_leader]
                if leaders:
                    break
                await trio.sleep(0.5)
        leader = leaders[0]
        alive, impostor, *down = [i for i in range(5) if i != leader]
        # `impostor`'s address now leads to `alive`: its answers come from `alive`'s key
        moved = {cluster[impostor].identity.public_key: cluster[alive].address}
        real_address = ReplicaSets.address

        def address(self: ReplicaSets, member: Member) -> str:
            return moved.get(member.key) or real_address(self, member)

        monkeypatch.setattr(ReplicaSets, "address", address)
        await cluster.stop(impostor)
        for index in down:
            await cluster.stop(index)
        # leader + alive hold it: 2 of 5, not a majority, however `alive` is counted
        with pytest.raises(KettenError):
            await cluster[leader].publish(key, b"must not be acknowledged", deadline=8)
        stats = cluster[leader]._rpc.statistics()
        assert stats.wrong_responders > 0
        commit = cluster[leader]._replicator.loaded(key).commit  # type: ignore[union-attr]
        assert commit is not None and commit[0] == 0
