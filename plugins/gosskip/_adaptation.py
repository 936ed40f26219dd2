"""Adaptation procedure 2 of the seed (chapter 4.4, Algorithm 1), sans-IO.

Every workingnode periodically asks as many randomly chosen workingnodes as
its neighbour lists are high (levels ``0 .. height``) for their churn of
the last interval ``c`` and their estimate ``g`` of their topic's size,
answers such requests itself, and then decides:

* average the answers per topic, add its own ``(c_lokal, g_lokal)``;
* ``c_gesamt`` and ``g_gesamt`` are the sums of the per-topic averages;
* ``k = c_lokal / (c_gesamt + 1) * g_gesamt - g_lokal``;
* ``k > 0``: insert a workingnode into its own topic with probability
  ``k / g_lokal`` (capped at 1);
* ``k < 0``: leave with probability ``|k| / g_gesamt``, unless it is the
  only workingnode of its topic.

Procedure 1 (first come, first serve) is part of
:class:`~._pubsub.Workingnode`. The topic-size estimate of 5.2.3 is
:func:`topic_size`.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ketten.errors import ProtocolError

__all__ = ["MAX_SAMPLES", "Decision", "GlobalView", "SampleRequest", "SampleResponse",
           "topic_size"]

MAX_SAMPLES = 256
"""The most answers kept between two decisions."""


@attrs.frozen
class SampleRequest:
    nonce: int


@attrs.frozen
class SampleResponse:
    """A sampled workingnode's topic, churn of its last interval and topic-size estimate."""

    nonce: int
    topic: bytes
    churn: int
    size: int


@attrs.frozen
class Decision:
    """The outcome of one round of Algorithm 1."""

    k: float
    insert_probability: float
    leave_probability: float
    action: str
    """``"insert"``, ``"leave"`` or ``"stay"``."""


def topic_size(same_topic_levels: Sequence[int | None], k: int = 2) -> int:
    """5.2.3: the highest level ``r`` (right) and ``l`` (left) whose link still lies
    in the node's topic (on the right with a larger order, on the left with a
    smaller one) estimate the area at ``k**r + k**l``; a side without such a
    link adds nothing. The node itself is counted too (the seed leaves it out),
    so a lone workingnode estimates 1, not 0."""
    return 1 + sum(int(k ** level) for level in same_topic_levels if level is not None)


@attrs.define(eq=False)
class GlobalView:
    """One workingnode's window to the global view."""

    max_samples: int = MAX_SAMPLES
    _samples: list[tuple[bytes, int, int]] = attrs.field(factory=list, init=False)
    _nonces: set[int] = attrs.field(factory=set, init=False)
    _next_nonce: int = attrs.field(default=1, init=False)

    @staticmethod
    def answer(request: SampleRequest, topic: bytes, churn: int, size: int) -> SampleResponse:
        """UPON Receive(Samplerequest): this node's ``(c_lokal, g_lokal)``."""
        return SampleResponse(request.nonce, topic, churn, size)

    def requests(self, height: int) -> list[SampleRequest]:
        """UPON TIMER: one request per level ``0 .. height`` (the driver picks a random
        workingnode for each)."""
        out: list[SampleRequest] = []
        for _ in range(max(0, height) + 1):
            if len(self._nonces) >= self.max_samples:
                break
            self._nonces.add(self._next_nonce)
            out.append(SampleRequest(self._next_nonce))
            self._next_nonce += 1
        return out

    def on_response(self, response: SampleResponse) -> None:
        """UPON Receive(Samplerresponse): keep the tuple; an unasked nonce or an
        impossible value is refused."""
        if response.nonce not in self._nonces:
            raise ProtocolError("a sample answer nobody asked for")
        if response.churn < 0 or response.size < 1 or len(response.topic) != 32:
            raise ProtocolError("a sample answer with an impossible churn or size")
        self._nonces.discard(response.nonce)
        self._samples.append((response.topic, response.churn, response.size))

    def decide(self, topic: bytes, churn: float, size: int, draw: float, *,
               alone: bool, topic_churn: bool = False) -> Decision:
        """The rest of UPON TIMER: fold the answers and this node's own tuple into
        ``k`` and decide with the uniform ``draw`` in ``[0, 1)``; forget the answers.

        With ``topic_churn`` every churn value (the node's own and the sampled
        ones) is first multiplied by its topic-size estimate: a node's churn
        stands for its topic's churn *per node*, so ``c * g`` estimates the
        topic's churn and ``p_c`` becomes the topic's share of the total churn,
        the share the seed's prose asks the topic's share of nodes to follow.
        Read literally, Algorithm 1 maps the per-node rates instead, and a topic
        settles at a size growing with the square root of its churn."""
        by_topic: dict[bytes, list[tuple[float, int]]] = {}
        for t, c, g in [*self._samples, (topic, churn, size)]:
            by_topic.setdefault(t, []).append((c * g if topic_churn else c, g))
        if topic_churn:
            churn = churn * size
        self._samples.clear()
        self._nonces.clear()
        c_total = sum(sum(c for c, _ in v) / len(v) for v in by_topic.values())
        g_total = sum(sum(g for _, g in v) / len(v) for v in by_topic.values())
        k = churn / (c_total + 1) * g_total - size
        insert = min(1.0, k / size) if k > 0 and size > 0 else 0.0
        leave = min(1.0, -k / g_total) if k < 0 and g_total > 0 and not alone else 0.0
        action = "insert" if draw < insert else "leave" if draw < leave else "stay"
        return Decision(k, insert, leave, action)
