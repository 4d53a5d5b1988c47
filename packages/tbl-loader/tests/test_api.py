"""The public API: what each audience imports, sorted and complete; torch not imported by the package."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import tbl_loader

# The sub-packages with an __all__ of their own: the top level for users, the rest for loader
# authors and sibling packages (tbl-resident, tbl-bench).
PUBLIC = ["tbl_loader", "tbl_loader.errors", "tbl_loader.stream", "tbl_loader.host", "tbl_loader.source",
          "tbl_loader.image", "tbl_loader.pytree", "tbl_loader.tokens", "tbl_loader.conversion"]


@pytest.mark.parametrize("name", PUBLIC)
def test_all_is_sorted_and_complete(name):
    module = importlib.import_module(name)
    assert module.__all__ == sorted(module.__all__)
    assert len(set(module.__all__)) == len(module.__all__)
    for attr in module.__all__:
        assert hasattr(module, attr), f"{name}.{attr}"


def test_top_level_is_what_training_code_calls():
    expected = {"ImageLoader", "ImageDataset", "EpochBatchSampler", "PyTreeLoader", "PyTreeDataset", "TokenLoader", "TokenDataset",
                "Mix", "Schedule", "Batch", "PyTreeBatch", "TokenBatch", "RandomResizedCrop", "IMAGENET_MEAN", "IMAGENET_STD", "convert", "write_tokens",
                "upload_dataset", "collate_identity", "collate_tensors", "Padded", "Masked", "errors",
                "LoaderError", "__version__",
                # the sub-packages, namespaces of the other audiences
                "conversion", "host", "image", "pytree", "source", "stream", "tokens"}
    assert set(tbl_loader.__all__) == expected


def test_every_error_is_a_loader_error_defined_once():
    from tbl_loader import errors

    for attr in errors.__all__:
        cls = getattr(errors, attr)
        if issubclass(cls, Warning) or cls.__module__.startswith("tbl_format"):
            continue
        assert issubclass(cls, errors.LoaderError), attr
        assert cls.__module__ == "tbl_loader.errors", attr
    # The file and destination errors are tbl-format's, not copies.
    import tbl_format

    assert errors.DestinationError is tbl_format.DestinationError
    assert errors.NotRegularFileError is tbl_format.NotRegularFileError


def test_import_does_not_import_torch():
    code = "import sys, tbl_loader; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
