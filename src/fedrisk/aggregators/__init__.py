"""Aggregators: how the server combines the clients' replies."""

from fedrisk.aggregators.base import Aggregator, InMemoryReplies, Mean, Replies, WeightedMean
from fedrisk.registry import Registry

AGGREGATORS: Registry = Registry("aggregator")
AGGREGATORS.add("mean", Mean, "uniform mean of the replies (sum kind)")
AGGREGATORS.add("weighted_mean", WeightedMean, "mean weighted by client sample counts (sum kind)")

__all__ = ["AGGREGATORS", "Aggregator", "InMemoryReplies", "Mean", "Replies", "WeightedMean"]
