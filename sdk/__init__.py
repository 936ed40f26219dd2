"""ketten: an embeddable, decentralized event system for trio programs.

Applications publish events under criteria; each criterion is a signed,
hash-linked chain replicated on the overlay nodes closest to its key.
"""

from __future__ import annotations

import logging as _logging

from . import errors, hookspecs, interfaces, logs, wire
from ._core.chain import (
    AncestorSearch,
    Chain,
    Fork,
    Placement,
    Verify,
    WriterPolicy,
    check_successor,
    choose_branch,
    classify,
    highest_match,
    make_locator,
    scan_encoded_chain,
)
from ._core.claims import AddressClaims
from ._core.event import DEFAULT_MAX_EVENT_SIZE, Event
from ._core.identity import (
    Identity,
    criterion_key,
    leading_zero_bits,
    node_id_of,
    puzzle_ok,
    solve_puzzle,
    verify_signature,
)
from ._core.membership import ChainConfig, Member
from ._node.agent import Agent
from ._node.config import NodeConfig
from ._node.copies import CopyStatistics
from ._node.feeds import (
    BrokerSubscriptionStatistics,
    DurableSubscription,
    Subscription,
    SubscriptionStatistics,
)
from ._node.node import Node, NodeStatistics, open_node
from ._node.option_schema import Option, PluginSpec
from ._node.plugins import broken_plugins, installed_names, plugin_manager
from ._node.replicator import ReplicationStatistics
from ._process import tune_gc
from .errors import (
    BrokenLink,
    CommandIdReused,
    ConfigError,
    DecodeError,
    DependencyUnavailable,
    EventsDropped,
    HoldbackFull,
    InternalError,
    InvalidEvent,
    InvalidSignature,
    KettenError,
    NodeClosed,
    PeerUnreachable,
    PluginNotFound,
    ProtocolError,
    PublishOutcomeUnknown,
    QuorumUnavailable,
    QuotaExceeded,
    RemoteError,
    StoreConflict,
    StoreCorrupted,
    StoreError,
    StoreFormatError,
    Unavailable,
    UsageError,
    WriterNotAllowed,
)
from .hookspecs import hookimpl

__version__ = "0.1.0"

# The application decides where ketten's log records go (logger "ketten").
_logging.getLogger("ketten").addHandler(_logging.NullHandler())

__all__ = [
    "DEFAULT_MAX_EVENT_SIZE",
    "AddressClaims",
    "Agent",
    "AncestorSearch",
    "BrokenLink",
    "BrokerSubscriptionStatistics",
    "Chain",
    "ChainConfig",
    "CommandIdReused",
    "ConfigError",
    "CopyStatistics",
    "DecodeError",
    "DependencyUnavailable",
    "DurableSubscription",
    "Event",
    "EventsDropped",
    "Fork",
    "HoldbackFull",
    "Identity",
    "InternalError",
    "InvalidEvent",
    "InvalidSignature",
    "KettenError",
    "Member",
    "Node",
    "NodeClosed",
    "NodeConfig",
    "NodeStatistics",
    "Option",
    "PeerUnreachable",
    "Placement",
    "PluginNotFound",
    "PluginSpec",
    "ProtocolError",
    "PublishOutcomeUnknown",
    "QuorumUnavailable",
    "QuotaExceeded",
    "RemoteError",
    "ReplicationStatistics",
    "StoreConflict",
    "StoreCorrupted",
    "StoreError",
    "StoreFormatError",
    "Subscription",
    "SubscriptionStatistics",
    "Unavailable",
    "UsageError",
    "Verify",
    "WriterNotAllowed",
    "WriterPolicy",
    "__version__",
    "broken_plugins",
    "check_successor",
    "choose_branch",
    "classify",
    "criterion_key",
    "errors",
    "highest_match",
    "hookimpl",
    "hookspecs",
    "installed_names",
    "interfaces",
    "leading_zero_bits",
    "logs",
    "make_locator",
    "node_id_of",
    "open_node",
    "plugin_manager",
    "puzzle_ok",
    "scan_encoded_chain",
    "solve_puzzle",
    "tune_gc",
    "verify_signature",
    "wire",
]
