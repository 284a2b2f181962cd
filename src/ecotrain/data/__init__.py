"""Data: built-in and user datasets, validation, seeded splits, resumable batching, augmentation."""

from ecotrain.data.sources import ArraySource, DataBundle, LoaderSource, MapSource, Source, Subset, subset
from ecotrain.data.builtin import load_data
from ecotrain.data.sampler import EpochSampler
from ecotrain.data.split import stratified_split

__all__ = [
    "ArraySource", "DataBundle", "LoaderSource", "MapSource", "Source", "Subset", "subset",
    "load_data", "EpochSampler", "stratified_split",
]
