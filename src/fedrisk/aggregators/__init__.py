"""Aggregators: how the server combines the clients' replies.

``AGGREGATORS`` maps a config name (``algorithm.aggregator``) to an aggregator class; the robust
rules are also public pure functions on an ``(n, d)`` tensor (``fedrisk.aggregators.krum`` ...).
"""

from fedrisk.aggregators.base import Aggregator, InMemoryReplies, Mean, Replies, WeightedMean
from fedrisk.aggregators.extended import (
    MDA,
    Bulyan,
    CenteredClippingMomentum,
    Meamed,
    MoNNA,
    StaticClipping,
    arc,
    bulyan,
    centered_clipping_momentum,
    mda,
    meamed,
    monna,
    static_clipping,
)
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
AGGREGATORS.add("bulyan", Bulyan, "Bulyan: repeated Krum, then the mean around the median (gather kind)")
AGGREGATORS.add("mda", MDA, "minimum-diameter averaging: exact for small C(n, f), greedy beyond (gather kind)")
AGGREGATORS.add("meamed", Meamed, "mean around the median: per coordinate the n - f closest values (gather kind)")
AGGREGATORS.add("monna", MoNNA, "MoNNA: mean of the n - f replies nearest to the median (gather kind)")
AGGREGATORS.add("static_clipping", StaticClipping, "the mean of the replies clipped to norm tau (gather kind)")
AGGREGATORS.add(
    "centered_clipping_momentum",
    CenteredClippingMomentum,
    "centred clipping of worker momenta from the previous aggregate (gather kind, stateful)",
)

__all__ = [
    "AGGREGATORS",
    "MDA",
    "Aggregator",
    "Bulyan",
    "CenteredClipping",
    "CenteredClippingMomentum",
    "CoordinateMedian",
    "GeometricMedian",
    "InMemoryReplies",
    "Krum",
    "Meamed",
    "Mean",
    "MoNNA",
    "MultiKrum",
    "Replies",
    "RobustAggregator",
    "StaticClipping",
    "TrimmedMean",
    "WeightedMean",
    "arc",
    "bucketing",
    "bulyan",
    "centered_clipping",
    "centered_clipping_momentum",
    "coordinate_median",
    "geometric_median",
    "krum",
    "mda",
    "meamed",
    "mean",
    "monna",
    "multi_krum",
    "nearest_neighbor_mixing",
    "static_clipping",
    "trimmed_mean",
]
