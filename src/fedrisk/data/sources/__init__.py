"""Dataset sources that register themselves in :data:`~fedrisk.data.loaders.DATASETS`.

Users' own data from the command line: ``table`` (CSV / Parquet), ``arrays`` (``.npz``) and
``image_folder`` (``root/class/*.png``).  Importing this package registers them.

Example:
    >>> from fedrisk.data import DATASETS
    >>> {"table", "arrays", "image_folder"} <= set(DATASETS.names())
    True
"""

from fedrisk.data.sources import arrays, image_folder, table

__all__ = ["arrays", "image_folder", "table"]
