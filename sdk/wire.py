"""The wire format, for plugin authors: strict CBOR, message envelopes, field checks.

Everything a plugin needs to speak to other nodes or to keep small records
in a store cursor, without importing ketten's private modules:

* :func:`dumps` / :func:`loads` - CBOR for messages; :func:`loads` decodes
  untrusted bytes strictly and raises only :class:`~ketten.errors.DecodeError`.
* :func:`dumps_canonical` - the deterministic encoding (RFC 8949 core
  deterministic), for anything that is hashed or signed.
* :func:`encode_message` / :func:`decode_message` - the ``[service, body]``
  envelope that :meth:`ketten.Node.request` and ``register_service`` use.
* :func:`field` - one checked field of a decoded map.
"""

from __future__ import annotations

from ._core.codec import MAX_UINT, head_size, loads
from ._core.codec import dumps as dumps_canonical
from ._core.codec import dumps_wire as dumps
from ._wire import MAX_MESSAGE_SIZE, decode_message, encode_message, field

__all__ = [
    "MAX_MESSAGE_SIZE",
    "MAX_UINT",
    "decode_message",
    "dumps",
    "dumps_canonical",
    "encode_message",
    "field",
    "head_size",
    "loads",
]
