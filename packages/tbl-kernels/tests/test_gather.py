import mmap
import zlib

import numpy as np
import pytest
from conftest import all_values_images, split_sources

import tbl_kernels as tk
from tbl_kernels import _core
from tbl_kernels import reference as ref

MEAN3, STD3 = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

# (table dtype name, out dtype)
OUT_DTYPES = [
    ("float32", np.float32),
    ("float16", np.float16),
    ("bfloat16", np.uint16),
    ("bfloat16", np.int16),
]


def _table(dtype_name: str, c: int) -> np.ndarray:
    return tk.normalization_table(MEAN3[:c], STD3[:c], dtype_name)


def _out(b, h, w, c, layout, dtype):
    shape = (b, c, h, w) if layout == "CHW" else (b, h, w, c)
    return np.full(shape, 77, dtype=dtype)


@pytest.mark.parametrize("c", [1, 3])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("table_dtype,out_dtype", OUT_DTYPES)
def test_gather_normalize_matches_reference(simd, threads, c, layout, table_dtype, out_dtype):
    seed = zlib.crc32(repr((c, layout, table_dtype, np.dtype(out_dtype).name, threads)).encode())
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(16, 24)), int(rng.integers(17, 26)) | 1  # odd widths
    images = all_values_images(rng, 9, h, w, c)
    sources = split_sources(images, rng)
    b = 13
    indices = rng.integers(0, len(images), size=b).astype(np.int64)
    table = _table(table_dtype, c)
    for flip in (None, rng.integers(0, 2, size=b).astype(np.uint8), rng.integers(0, 2, size=b).astype(bool)):
        out = _out(b, h, w, c, layout, out_dtype)
        want = _out(b, h, w, c, layout, out_dtype)
        tk.gather_normalize(sources, indices, out, table, flip=flip, layout=layout)
        ref.gather_normalize(sources, indices, want, table, flip=flip, layout=layout)
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("c", [1, 3])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_gather_u8_matches_reference(simd, threads, c, layout):
    rng = np.random.default_rng(c * 10 + len(layout) + threads)
    h, w = 16, 21
    images = all_values_images(rng, 7, h, w, c)
    sources = split_sources(images, rng)
    indices = rng.integers(0, len(images), size=11).astype(np.int64)
    for flip in (None, rng.integers(0, 2, size=11).astype(np.uint8)):
        out, want = _out(11, h, w, c, layout, np.uint8), _out(11, h, w, c, layout, np.uint8)
        tk.gather_u8(sources, indices, out, flip=flip, layout=layout)
        ref.gather_u8(sources, indices, want, flip=flip, layout=layout)
        assert np.array_equal(out, want)


@pytest.mark.parametrize("w", [1, 15, 16, 17, 31, 32, 33, 47, 48, 50, 64, 65])
def test_row_widths_around_vector_blocks(simd, w):
    # The avx2 level deinterleaves RGB rows 16 pixels at a time (flipped rows from
    # the far end) and finishes with scalar code: every split of a row must agree.
    rng = np.random.default_rng(w)
    images = rng.integers(0, 256, size=(5, 3, w, 3), dtype=np.uint8)
    indices = np.array([4, 0, 2, 2, 1, 3], np.int64)
    flip = np.array([1, 0, 1, 1, 0, 0], np.uint8)
    table = _table("float16", 3)
    for layout in ("CHW", "HWC"):
        out, want = _out(6, 3, w, 3, layout, np.uint8), _out(6, 3, w, 3, layout, np.uint8)
        tk.gather_u8([images], indices, out, flip=flip, layout=layout)
        ref.gather_u8([images], indices, want, flip=flip, layout=layout)
        assert np.array_equal(out, want)
        out, want = _out(6, 3, w, 3, layout, np.float16), _out(6, 3, w, 3, layout, np.float16)
        tk.gather_normalize([images], indices, out, table, flip=flip, layout=layout)
        ref.gather_normalize([images], indices, want, table, flip=flip, layout=layout)
        assert np.array_equal(out.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("w", [1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 200, 224])
def test_float32_rows_around_lookup_blocks(simd, w):
    """The avx512 level looks float32 outputs up in registers, 64 per step and the last step masked: every split
    of a row, for any table (random bit patterns: no affine form, NaN payloads too), each layout, one and three
    channels, flipped or not, equals the reference bit for bit."""
    rng = np.random.default_rng(w)
    for c in (1, 3):
        images = rng.integers(0, 256, size=(4, 3, w, c), dtype=np.uint8)
        indices = np.array([3, 0, 2, 2, 1], np.int64)
        flip = np.array([1, 0, 1, 0, 0], np.uint8)
        table = rng.integers(0, 2**32, size=(c, 256), dtype=np.uint32).view(np.float32)
        for layout in ("CHW", "HWC"):
            out, want = _out(5, 3, w, c, layout, np.float32), _out(5, 3, w, c, layout, np.float32)
            tk.gather_normalize([images], indices, out, table, flip=flip, layout=layout)
            ref.gather_normalize([images], indices, want, table, flip=flip, layout=layout)
            assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), (c, layout)


def test_gather_normalize_values_are_the_table():
    # Independent of the reference: every output value is table[c, pixel].
    rng = np.random.default_rng(5)
    images = all_values_images(rng, 2, 16, 16, 3)
    table = _table("float32", 3)
    out = np.empty((2, 3, 16, 16), np.float32)
    tk.gather_normalize([images], np.array([1, 0]), out, table)
    for c in range(3):
        assert np.array_equal(out[0, c], table[c][images[1, :, :, c]])
    flip = np.array([1, 0], np.uint8)
    tk.gather_normalize([images], np.array([1, 0]), out, table, flip=flip)
    assert np.array_equal(out[0, 2], table[2][images[1, :, ::-1, 2]])


def test_layout_is_inferred_from_out_shape():
    rng = np.random.default_rng(6)
    images = rng.integers(0, 256, size=(4, 8, 10, 3), dtype=np.uint8)
    idx = np.array([3, 1], np.int64)
    table = _table("float32", 3)
    hwc = np.empty((2, 8, 10, 3), np.float32)
    chw = np.empty((2, 3, 8, 10), np.float32)
    tk.gather_normalize([images], idx, hwc, table)
    tk.gather_normalize([images], idx, chw, table)
    assert np.array_equal(hwc.transpose(0, 3, 1, 2), chw)
    square = rng.integers(0, 256, size=(2, 3, 3, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="pass layout"):
        tk.gather_normalize([square], idx[:1] * 0, np.empty((1, 3, 3, 3), np.float32), table)


def test_read_only_sources_are_accepted(tmp_path):
    rng = np.random.default_rng(7)
    images = rng.integers(0, 256, size=(5, 8, 9, 3), dtype=np.uint8)
    path = tmp_path / "img.bin"
    images.tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=images.shape)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        fb = np.frombuffer(m, dtype=np.uint8).reshape(images.shape)
        idx = np.array([4, 0, 2], np.int64)
        out = np.empty((3, 3, 8, 9), np.uint8)
        tk.gather_u8([mm, fb], np.array([4, 5, 7], np.int64), out)
        assert np.array_equal(out, images[[4, 0, 2]].transpose(0, 3, 1, 2))
        del fb
        m.close()
    assert idx.size == 3


def test_empty_batch_is_a_no_op():
    images = np.zeros((3, 4, 4, 3), np.uint8)
    tk.gather_normalize(
        [images], np.empty(0, np.int64), np.empty((0, 3, 4, 4), np.float32), _table("float32", 3)
    )


@pytest.mark.parametrize("rowbytes", [1, 8, 13, 4096])
def test_gather_rows_matches_reference(threads, rowbytes):
    rng = np.random.default_rng(rowbytes)
    rows = rng.integers(0, 256, size=(5000, rowbytes), dtype=np.uint8)
    sources = split_sources(rows, rng)
    idx = rng.integers(0, 5000, size=3000).astype(np.int64)
    out = np.zeros((3000, rowbytes), np.uint8)
    tk.gather_rows(sources, idx, out)
    assert np.array_equal(out, ref.gather_rows(sources, idx, np.zeros_like(out)))
    assert np.array_equal(out, rows[idx])


@pytest.mark.parametrize("batch", [0, 7, 3000])
def test_gather_columns_matches_reference(threads, batch):
    rng = np.random.default_rng(batch)
    n = 5000
    widths = [8, 1, 4, 2, 13, 8, 300]
    full = [rng.integers(0, 256, size=(n, rb), dtype=np.uint8) for rb in widths]
    cuts = sorted(rng.integers(0, n + 1, size=3).tolist())  # the same segments for every column
    columns = [[np.ascontiguousarray(s) for s in np.split(col, cuts)] for col in full]
    idx = rng.integers(0, n, size=batch).astype(np.int64)
    outs = [np.zeros((batch, rb), np.uint8) for rb in widths]
    tk.gather_columns(columns, idx, outs)
    want = ref.gather_columns(columns, idx, [np.zeros_like(o) for o in outs])
    for col, out, w in zip(full, outs, want, strict=True):
        assert np.array_equal(out, w)
        assert np.array_equal(out, col[idx])


def test_typed_columns_through_gather_rows():
    labels = np.arange(100, dtype=np.int64) * 3
    out = np.empty(4, np.int64)
    tk.gather_rows(
        [labels.view(np.uint8).reshape(100, 8)], np.array([5, 99, 0, 5]), out.view(np.uint8).reshape(4, 8)
    )
    assert out.tolist() == [15, 297, 0, 15]


def test_torch_bfloat16_output_viewed_as_int16():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    images = rng.integers(0, 256, size=(4, 6, 7, 3), dtype=np.uint8)
    idx = np.array([2, 3], np.int64)
    out = torch.empty((2, 3, 6, 7), dtype=torch.bfloat16)
    tk.gather_normalize([images], idx, out.view(torch.int16).numpy(), _table("bfloat16", 3))
    want = np.empty((2, 3, 6, 7), np.uint16)
    ref.gather_normalize([images], idx, want, _table("bfloat16", 3))
    assert np.array_equal(out.view(torch.int16).numpy().view(np.uint16), want)
    # torch tensors are accepted directly too (DLPack), bfloat16 included.
    out2 = torch.empty((2, 3, 6, 7), dtype=torch.bfloat16)
    tk.gather_normalize([images], torch.from_numpy(idx), out2, _table("bfloat16", 3))
    assert torch.equal(out, out2)


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_affine_hint_never_changes_results(simd, dtype_name, layout):
    # Outputs may be computed from an (a, b) hint instead of looked up;
    # the hint is used only when it reproduces the whole table, so wrong hints and
    # tables that the float32 formula cannot reproduce still give the table's bits.
    rng = np.random.default_rng(11)
    images = all_values_images(rng, 4, 16, 33, 3)
    idx = np.array([3, 0, 2, 1, 3], np.int64)
    flip = np.array([0, 1, 1, 0, 1], np.uint8)
    shape = (5, 3, 16, 33) if layout == "CHW" else (5, 16, 33, 3)
    cases = [
        (MEAN3, STD3),  # ImageNet: the float32 formula reproduces both 16-bit tables
        ([0.5] * 3, [0.5] * 3),  # bfloat16: exact ties the float32 formula misses
        ([0.3, 0.1, 0.9], [0.07, 0.3, 0.11]),
    ]
    for mean, std in cases:
        table = tk.normalization_table(mean, std, dtype_name)
        hint = table.affine_hint
        assert hint is not None and len(hint) == 6
        want = ref.gather_normalize(
            [images], idx, np.empty(shape, table.dtype), table, flip=flip, layout=layout
        )
        for h in (hint, None, [x * 1.0001 for x in hint], [0.0] * 6):
            out = np.zeros(shape, table.dtype)
            _core.gather_normalize([images], idx, out, table, flip, layout, h)
            assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), (mean, h)


@pytest.mark.parametrize("dtype_name", ["float32", "float16", "bfloat16"])
def test_table_changed_in_place_is_looked_up(simd, dtype_name):
    # The ImageNet tables take the arithmetic path where the level has one; one
    # entry changed in place no longer fits the attached hint, and must be read.
    rng = np.random.default_rng(12)
    images = all_values_images(rng, 3, 16, 33, 3)
    idx = np.array([2, 0, 1, 2], np.int64)
    boxes = np.array([[0, 0, 16, 33], [1, 2, 9, 20], [0, 0, 16, 33], [3, 3, 3, 3]], np.int32)
    table = _table(dtype_name, 3)
    table[1, 77] = table[1, 78]
    assert table.affine_hint is not None
    out, want = _out(4, 16, 33, 3, "CHW", table.dtype), _out(4, 16, 33, 3, "CHW", table.dtype)
    tk.gather_normalize([images], idx, out, table)
    ref.gather_normalize([images], idx, want, table)
    assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
    tk.gather_crop_resize([images], idx, boxes, out, table)
    ref.gather_crop_resize([images], idx, boxes, want, table)
    assert np.array_equal(out.view(np.uint8), want.view(np.uint8))


def test_wrappers_pass_the_tables_hint(monkeypatch):
    # The hint only saves time, so nothing else would notice it going missing.
    seen = []
    monkeypatch.setattr(_core, "gather_normalize", lambda *args: seen.append(args[-1]))
    monkeypatch.setattr(_core, "gather_crop_resize", lambda *args: seen.append(args[-1]))
    images = np.zeros((1, 4, 5, 3), np.uint8)
    idx = np.zeros(1, np.int64)
    boxes = np.array([[0, 0, 4, 5]], np.int32)
    table = _table("float16", 3)
    out = np.zeros((1, 3, 4, 5), np.float16)
    tk.gather_normalize([images], idx, out, table)
    tk.gather_crop_resize([images], idx, boxes, out, table)
    tk.gather_normalize([images], idx, out, np.array(table))  # a plain array: no hint
    tk.gather_crop_resize([images], idx, boxes, np.zeros((1, 3, 4, 5), np.uint8))
    assert seen == [table.affine_hint, table.affine_hint, None, None]
