"""Aggregators: how the server combines the clients' replies.

``AGGREGATORS`` maps a config name (``algorithm.aggregator``) to an aggregator class; the robust
rules are also public pure functions on an ``(n, d)`` tensor (``fedrisk.aggregators.krum`` ...).
"""

from fedrisk.aggregators.base import Aggregator, InMemoryReplies, Mean, Replies, WeightedMean
from fedrisk.aggregators.preaggregation import bucketing, nearest_neighbor_mixing
from fedrisk.aggregators.robust import (
    CenteredClipping,
    CoordinateMedian,
    GeometricMedian,
    Krum,
    MultiKrum,
    RobustAggregator,
    TrimmedMean,
    centered_clipping,
    coordinate_median,
    geometric_median,
    krum,
    mean,
    multi_krum,
    trimmed_mean,
)
from fedrisk.registry import Registry

AGGREGATORS: Registry = Registry("aggregator")
AGGREGATORS.add("mean", Mean, "uniform mean of the replies (sum kind)")
AGGREGATORS.add("weighted_mean", WeightedMean, "mean weighted by client sample counts (sum kind)")
AGGREGATORS.add("median", CoordinateMedian, "coordinate-wise median (gather kind)")
AGGREGATORS.add("trimmed_mean", TrimmedMean, "coordinate-wise mean without the f largest / f smallest (gather kind)")
AGGREGATORS.add("krum", Krum, "Krum: the reply closest to its n - f - 2 nearest others (gather kind)")
AGGREGATORS.add("multi_krum", MultiKrum, "Multi-Krum: mean of the m best Krum-scored replies (gather kind)")
AGGREGATORS.add("geometric_median", GeometricMedian, "geometric median by smoothed Weiszfeld (gather kind)")
AGGREGATORS.add("centered_clipping", CenteredClipping, "centred clipping around the median (gather kind)")

__all__ = [
    "AGGREGATORS",
    "Aggregator",
    "CenteredClipping",
    "CoordinateMedian",
    "GeometricMedian",
    "InMemoryReplies",
    "Krum",
    "Mean",
    "MultiKrum",
    "Replies",
    "RobustAggregator",
    "TrimmedMean",
    "WeightedMean",
    "bucketing",
    "centered_clipping",
    "coordinate_median",
    "geometric_median",
    "krum",
    "mean",
    "multi_krum",
    "nearest_neighbor_mixing",
    "trimmed_mean",
]
