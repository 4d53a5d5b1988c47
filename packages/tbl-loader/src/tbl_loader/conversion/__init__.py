"""Conversion: images (TAR, folder, list, WebDataset, Parquet / Arrow, `datasets`, manifest) into a .tbl dataset,
generic tables into a pytree .tbl (`convert_table`), and text corpora into a token dataset (`tokenize`:
``tokenize.tokenize_corpus``, ``tbl tokenize``). Never imported by the serving sub-packages.

``convert`` is the user's entry (also ``tbl_loader.convert``); the other names
are the conversion's internal API, named so that the Ray engine
(:mod:`tbl_loader.ray`) and tbl-bench build on them instead of private names:
the destination and report checks, the recipe, the decoder, the schema and
metadata a conversion writes, and the modules that define a converted row
(``decode``: the rule; ``variable``: the rule of ``--max-size``; ``chunk_writer``: writing rows in place),
every source's listing (``open_any_source``) and the columns stored beside the image (``ExtraColumns``).
"""

from __future__ import annotations

from . import chunk_writer, decode, tokenize, variable
from .extra_columns import ExtraColumns
from .formats import open_any_source
from .images import (
    ON_ERROR,
    ConvertReport,
    Decoder,
    FixedRecipe,
    ImageError,
    check_destination,
    check_report_path,
    convert,
    dataset_metadata,
    finish_report,
    fixed_schema,
    merge_parts,
    schema_with_extra,
)
from .table_pytree import convert_table
from .variable import VariableRecipe

__all__ = [
    "ConvertReport",
    "Decoder",
    "ExtraColumns",
    "FixedRecipe",
    "ImageError",
    "ON_ERROR",
    "VariableRecipe",
    "check_destination",
    "check_report_path",
    "chunk_writer",
    "convert",
    "convert_table",
    "dataset_metadata",
    "decode",
    "finish_report",
    "fixed_schema",
    "merge_parts",
    "open_any_source",
    "schema_with_extra",
    "tokenize",
    "variable",
]
