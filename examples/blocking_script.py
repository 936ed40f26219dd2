"""ketten from a plain script (no trio, no asyncio): three nodes on loopback TCP,
a publish from each, a read, and a subscriber thread.

    python examples/blocking_script.py
"""

from __future__ import annotations

import threading
import time

import ketten
import ketten.blocking


def main() -> None:
    listen = {"transport": {"listen": "127.0.0.1:0"}}
    first = ketten.blocking.open_node(ketten.NodeConfig(transport="tcp", overlay="static",
                                                        options=listen))
    others = [ketten.blocking.open_node(ketten.NodeConfig(
        transport="tcp", overlay="static",
        options={**listen, "overlay": {"seeds": [first.address]}})) for _ in range(2)]
    nodes = [first, *others]
    # Let the membership spread before the first publish: a criterion first
    # published on nodes that have never heard of each other is started twice.
    time.sleep(3.0)
    try:
        got: list[bytes] = []
        with nodes[2].subscribe("greetings") as sub:
            def listen() -> None:
                try:
                    for event in sub:
                        got.append(event.payload)
                        if len(got) == 3:
                            return
                except ketten.blocking.NodeClosed:
                    return  # the subscription was closed before three arrived

            listener = threading.Thread(target=listen)
            listener.start()
            for index, node in enumerate(nodes):
                node.publish("greetings", b"hello from node %d" % index, command=index)
            listener.join(timeout=60)
        chain = nodes[1].read("greetings")
        print("chain:", [event.payload.decode() for event in chain])
        print("subscriber got:", [payload.decode() for payload in got])
        assert sorted(got) == sorted(event.payload for event in chain)
    finally:
        for node in nodes:
            node.close()
    print("done")


if __name__ == "__main__":
    main()
