"""The node: its parts (trio drivers around the sans-IO core) and the composition root."""

from .node import Node, NodeStatistics, open_node

__all__ = ["Node", "NodeStatistics", "open_node"]
