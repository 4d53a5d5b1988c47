"""verify="never" | "open" | "lazy": a flipped data byte is caught, named, and never served when asked for."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import write_dataset

import tbl_format
from tbl_loader import ImageDataset, ImageLoader, PyTreeDataset, PyTreeLoader
from tbl_loader.source import VERIFY_MODES

ROWS = 300
SHAPE = (64, 64, 3)  # 12 KiB per image: the image column spans several 1 MiB checksum blocks
BAD_ROW = 250


def _flip_a_byte_of(path, needle: bytes) -> None:
    """Flip one byte inside ``needle``'s only occurrence in the file (the test's own file)."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0
    data[at + len(needle) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def corrupt_images(tmp_path):
    images = np.random.default_rng(5).integers(0, 256, (ROWS, *SHAPE), dtype=np.uint8)
    path = write_dataset(tmp_path / "images.tbl", images, np.arange(ROWS))
    _flip_a_byte_of(path, images[BAD_ROW].tobytes())
    return path


def test_lazy_verify_raises_at_the_first_batch_touching_the_bad_block(corrupt_images):
    seen = []
    with ImageLoader(corrupt_images, 16, shuffle=False, verify="lazy", backend="numpy", prefetch=2) as loader:
        with pytest.raises(tbl_format.DataChecksumError) as caught:
            for batch in loader:
                seen.append(batch.indices.copy())
    err = caught.value
    assert err.path is not None and str(corrupt_images) in str(err.path)
    assert err.rows and all(isinstance(r, int) for r in err.rows)
    served = np.concatenate(seen) if seen else np.empty(0, np.int64)
    # Every batch handed out lies before the failing one, and none holds a row of the bad block.
    assert BAD_ROW not in served and not set(err.rows) & set(served.tolist())
    assert served.size == 16 * len(seen) and served.size <= BAD_ROW


def test_never_serves_the_flipped_byte_silently_and_open_refuses_the_dataset(corrupt_images):
    with ImageLoader(corrupt_images, 50, shuffle=False, verify="never", backend="numpy") as loader:
        assert sum(b.indices.shape[0] for b in loader) == ROWS
    with pytest.raises(tbl_format.DataChecksumError):
        ImageLoader(corrupt_images, 50, verify="open", backend="numpy")
    with pytest.raises(tbl_format.DataChecksumError):
        ImageLoader(corrupt_images, 50, verify=True, backend="numpy")  # the older boolean form


def test_lazy_verify_passes_clean_data_and_changes_nothing(tmp_path):
    images = np.random.default_rng(6).integers(0, 256, (ROWS, *SHAPE), dtype=np.uint8)
    path = write_dataset(tmp_path / "clean", images, np.arange(ROWS), shard_rows=70)
    kwargs = {"seed": 3, "hflip": 0.5, "backend": "numpy"}
    with ImageLoader(path, 32, verify="lazy", **kwargs) as lazy, ImageLoader(path, 32, **kwargs) as plain:
        for _ in range(2):  # the second epoch runs on checked blocks
            for a, b in zip(lazy, plain, strict=True):
                assert np.array_equal(a.indices, b.indices) and np.array_equal(a.images, b.images)


def test_pytree_loader_lazy_verify(tmp_path):
    rows = [{"id": i, "vec": np.full(512, i, dtype=np.float64)} for i in range(ROWS)]  # 4 KiB per row
    path = tbl_format.write(rows, tmp_path / "rows.tbl")
    _flip_a_byte_of(path, rows[BAD_ROW]["vec"].tobytes())
    with PyTreeLoader(path, 20, shuffle=False, verify="lazy", backend="numpy") as loader:
        with pytest.raises(tbl_format.DataChecksumError):
            for _ in loader:
                pass


def test_image_dataset_takes_the_same_verify_modes(corrupt_images):
    with pytest.raises(tbl_format.DataChecksumError):
        ImageDataset(corrupt_images, verify="open", backend="numpy")
    lazy = ImageDataset(corrupt_images, verify="lazy", backend="numpy")
    plain = ImageDataset(corrupt_images, backend="numpy")
    assert np.array_equal(lazy.get_batch([0, 1]).images, plain.get_batch([0, 1]).images)  # a clean block
    with pytest.raises(tbl_format.DataChecksumError):
        lazy.get_batch([BAD_ROW])
    with ImageLoader(corrupt_images, 16, verify="lazy", backend="numpy", prefetch=0) as loader:
        twin = ImageDataset.from_loader(loader)
        assert twin.verify == "lazy"
        with pytest.raises(tbl_format.DataChecksumError):
            twin.get_batch([BAD_ROW])
    for ds in (lazy, plain, twin):
        ds.close()


def test_pytree_dataset_takes_the_same_verify_modes(tmp_path):
    rows = [{"id": i, "vec": np.full(512, i, dtype=np.float64)} for i in range(ROWS)]  # 4 KiB per row
    path = tbl_format.write(rows, tmp_path / "rows.tbl")
    _flip_a_byte_of(path, rows[BAD_ROW]["vec"].tobytes())
    with pytest.raises(tbl_format.DataChecksumError):
        PyTreeDataset(path, verify="open")
    lazy = PyTreeDataset(path, verify="lazy")  # rows 256.. lie in the second 1 MiB block, the bad one in the first
    assert lazy[280]["id"] == 280 and np.array_equal(lazy.get_batch([290, 291])["vec"], [r["vec"] for r in rows[290:292]])
    bad_block_reads = [lambda: lazy[BAD_ROW], lambda: lazy[BAD_ROW - ROWS], lambda: lazy.get_batch([0, BAD_ROW]),
                       lambda: lazy.collate_row([BAD_ROW], 0), lambda: list(lazy)]
    for read in bad_block_reads:
        with pytest.raises(tbl_format.DataChecksumError):
            read()
    with pytest.raises(IndexError):
        lazy[ROWS]
    never = PyTreeDataset(path)  # "never": the flipped byte is served, as documented
    assert not np.array_equal(never[BAD_ROW]["vec"], rows[BAD_ROW]["vec"])
    for ds in (lazy, never):
        ds.close()


@pytest.mark.parametrize("bad", ["sometimes", 1, None])
def test_verify_mode_is_checked(single_file_path, bad):
    with pytest.raises(ValueError, match="verify must be one of"):
        ImageLoader(single_file_path, 4, verify=bad)
    assert VERIFY_MODES == ("never", "open", "lazy")


def test_lazy_verify_needs_a_tbl_dataset(single_file_path):
    class Wrapped:  # an "already open dataset" without the block checks
        def __init__(self, ds):
            self._ds = ds
            self.leaf_paths, self.fingerprint, self.segments = ds.leaf_paths, ds.fingerprint, ds.segments

    ds = tbl_format.open(single_file_path)
    with pytest.raises(TypeError, match="tbl_format.Dataset"):
        ImageLoader(Wrapped(ds), 4, verify="lazy")
    ds.close()


@pytest.mark.parametrize("pack", [None, "best_fit"])
def test_token_loader_takes_the_same_verify_modes(tmp_path, pack):
    """TokenLoader: "open" refuses the dataset, "lazy" serves every window before the bad block's and raises at
    the first batch whose windows (or packed pieces) span it, "never" serves the flipped token."""
    from tbl_loader import TokenLoader, write_tokens

    tokens = np.random.default_rng(2).integers(1, 60_000, 400_000, dtype=np.int64)
    docs = np.split(tokens, [90_000, 200_000, 310_000])  # 4 documents
    # one shard of 1.6 MB of uint32 tokens: two 1 MiB checksum blocks, the flipped byte in the second
    path = write_tokens(docs, tmp_path / "tok", dtype="uint32", chunk=4096, shard_tokens=1 << 20)
    bad_token = 350_000
    shard = sorted(path.glob("*.tbl"))[0]
    _flip_a_byte_of(shard, tokens[bad_token : bad_token + 8].astype(np.uint32).tobytes())
    opts = {"batch_size": 4, "seq_len": 1000, "shuffle": False, "backend": "numpy", "pack": pack}
    with pytest.raises(tbl_format.DataChecksumError):
        TokenLoader(path, verify="open", **opts)
    seen = []
    with TokenLoader(path, verify="lazy", **opts) as loader:
        with pytest.raises(tbl_format.DataChecksumError):
            for batch in loader:
                seen.append(np.array(batch.tokens))
    assert seen, "the windows before the bad block are served"
    with TokenLoader(path, **opts) as plain:  # "never": the same windows, then the flipped one
        want = [np.array(b.tokens) for b in plain]
    assert all(np.array_equal(a, b) for a, b in zip(seen, want, strict=False))
    assert len(want) > len(seen)
