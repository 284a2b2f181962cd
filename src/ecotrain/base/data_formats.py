"""The data formats `data.name` can name, in one table: each format's name (or prefix, `tokens:PATH`),
its reader, whether it takes `data.kwargs`, whether it gives token sequences and whether it is one file
of rows (`--data FILE`). Every place that asks what a data name is (the config's kwargs check,
load_data, `ecotrain update`'s NEW_DATA, eval and predict's --data) asks here.

Add a format: one row here and its reader, `(cfg) -> DataBundle | data.builtin.Found`. Kept free of
torch and of the readers' modules (a recipe is checked before torch is imported; a reader's module is
imported when a recipe names its format). A name that is none of these is an import path
(`pkg.module:Name`, a map-style Dataset)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class DataFormat:
    name: str  # data.name, or its prefix when it ends with ':' (the rest is a path)
    reader: str  # 'module:function' (cfg) -> DataBundle (split by the reader) or Found (split by load_data)
    kwargs: bool  # takes data.kwargs; else a kwarg would be silently ignored, so the config refuses it
    tokens: bool  # token sequences for a language model (NEW_DATA of a language model's update)
    file: bool = False  # one file of rows, named by its suffix: what `eval`/`predict --data FILE` reads


FORMATS = (
    DataFormat("mnist1d", "ecotrain.data.builtin:load_mnist1d", kwargs=True, tokens=False),  # make_dataset's args
    DataFormat("digits", "ecotrain.data.builtin:load_digits", kwargs=False, tokens=False),
    DataFormat("glyphs", "ecotrain.data.glyphs:load_glyphs", kwargs=True, tokens=False),  # 2-D images, made here
    DataFormat("npz", "ecotrain.data.builtin:load_npz", kwargs=False, tokens=False, file=True),
    DataFormat("csv", "ecotrain.data.builtin:load_csv", kwargs=False, tokens=False, file=True),
    DataFormat("text", "ecotrain.data.text:load_text", kwargs=True, tokens=True),  # the stdlib's source, as bytes
    DataFormat("tokens:", "ecotrain.data.tokens:load_tokens", kwargs=True, tokens=True),
    # .bin token shards take the tokens: options; tar or Parquet shards refuse kwargs when they are read
    DataFormat("shards:", "ecotrain.data.builtin:load_shards_pattern", kwargs=True, tokens=True),
    DataFormat("hf:", "ecotrain.data.builtin:load_on_disk", kwargs=False, tokens=False),
    DataFormat("parquet:", "ecotrain.data.builtin:load_on_disk", kwargs=False, tokens=False),
)

FILES = tuple(f.name for f in FORMATS if f.file)  # ("npz", "csv"): a --data FILE's suffix picks its format


def data_format(name: str) -> Optional[DataFormat]:
    """The format `name` names (`csv`, or `tokens:PATH` by its prefix); None: an import path."""
    return next((f for f in FORMATS if name == f.name or (f.name.endswith(":") and name.startswith(f.name))), None)
