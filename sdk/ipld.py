"""Events as IPLD blocks, for plugin authors: CIDs, blocks and CAR files.

A chain is a DAG of dag-cbor blocks addressed by CIDv1 (sha2-256), each
linking its predecessor's block (see :mod:`ketten._core.ipld` for the block
layout). Everything a plugin needs to serve, fetch and check blocks without
importing ketten's private modules:

* :func:`event_block` - the block of an event that links a given predecessor block;
* :func:`decode_block` - check untrusted bytes against a CID and read the event;
  raises only :class:`~ketten.errors.DecodeError`;
* :func:`block_cid`, :func:`cid_bytes`, :func:`cid_from_bytes`, :func:`cid_text` -
  CIDs as objects, binary and text.
"""

from __future__ import annotations

from ._core.ipld import (
    BLOCK_OVERHEAD,
    DAG_CBOR,
    SHA2_256,
    EventBlock,
    block_cid,
    cid_bytes,
    cid_from_bytes,
    cid_text,
    decode_block,
    event_block,
)

__all__ = [
    "BLOCK_OVERHEAD",
    "DAG_CBOR",
    "SHA2_256",
    "EventBlock",
    "block_cid",
    "cid_bytes",
    "cid_from_bytes",
    "cid_text",
    "decode_block",
    "event_block",
]
