import numpy as np
import pytest

import tbl_kernels as tk
from tbl_kernels import _core

IMAGES = np.random.default_rng(0).integers(0, 256, size=(6, 5, 7, 3), dtype=np.uint8)
TABLE = tk.normalization_table([0.5] * 3, [0.25] * 3, "float32")


def _out(b=3, dtype=np.float32):
    return np.full((b, 3, 5, 7), 9, dtype=dtype)


def _untouched(out):
    return bool((out == 9).all())


@pytest.mark.parametrize("bad", [6, 100, -1])
def test_out_of_range_index_raises_before_writing(bad):
    out = _out()
    with pytest.raises(IndexError, match=rf"indices\[2\] = {bad} is out of range for 6 samples"):
        tk.gather_normalize([IMAGES[:2], IMAGES[2:]], np.array([0, 5, bad], np.int64), out, TABLE)
    assert _untouched(out)
    with pytest.raises(IndexError, match=r"indices\[2\]"):
        _core.gather_u8([IMAGES], np.array([0, 5, bad], np.int64), _out(dtype=np.uint8), None, "CHW")
    rows = np.zeros((3, 4), np.uint8)
    with pytest.raises(IndexError):
        tk.gather_rows([np.zeros((6, 4), np.uint8)], np.array([0, 1, bad], np.int64), rows)


@pytest.mark.parametrize(
    "box,exc,msg",
    [
        ((0, 0, 6, 7), IndexError, "not inside the 5x7"),
        ((0, 1, 5, 7), IndexError, "not inside"),
        ((-1, 0, 2, 2), IndexError, "not inside"),
        ((0, 0, 0, 3), ValueError, "is empty"),
        ((0, 0, 3, -2), ValueError, "is empty"),
    ],
)
def test_bad_box_raises_before_writing(box, exc, msg):
    out = np.full((2, 3, 4, 4), 9, np.float32)
    boxes = np.array([(0, 0, 5, 7), box], np.int32)
    with pytest.raises(exc, match=r"boxes\[1\] = .*" + msg):
        tk.gather_crop_resize([IMAGES], np.array([0, 1], np.int64), boxes, out, TABLE)
    assert _untouched(out)


def test_wrong_arrays_raise_type_errors_instead_of_copying():
    idx = np.array([0, 1, 2], np.int64)
    out = _out()
    with pytest.raises(TypeError, match="dtype"):
        tk.gather_normalize([IMAGES.astype(np.int16)], idx, out, TABLE)
    with pytest.raises(TypeError):  # the binding itself refuses conversion
        _core.gather_normalize([IMAGES.astype(np.int16)], idx, out, TABLE, None, "CHW")
    with pytest.raises(TypeError, match="int64"):
        tk.gather_normalize([IMAGES], idx.astype(np.int32), out, TABLE)
    with pytest.raises(TypeError):
        _core.gather_normalize([IMAGES], idx.astype(np.int32), out, TABLE, None, "CHW")
    with pytest.raises(TypeError):
        _core.gather_normalize([IMAGES], idx, out, TABLE.astype(np.float64), None, "CHW")
    with pytest.raises(TypeError, match="out has dtype float64 but table is float32"):
        tk.gather_normalize([IMAGES], idx, out.astype(np.float64), TABLE)
    with pytest.raises(TypeError, match="table is float16"):
        tk.gather_normalize([IMAGES], idx, out.astype(np.uint16), TABLE.astype(np.float16))
    with pytest.raises(TypeError, match="expected uint8"):
        tk.gather_u8([IMAGES], idx, out)
    with pytest.raises(TypeError, match="flip must be"):
        tk.gather_normalize([IMAGES], idx, out, TABLE, flip=np.ones(3, np.float32))
    with pytest.raises(TypeError, match="list of uint8 arrays"):
        tk.gather_normalize(IMAGES, idx, out, TABLE)
    assert _untouched(out)


def test_non_contiguous_and_read_only_arrays_are_refused():
    idx = np.array([0, 1, 2], np.int64)
    strided = IMAGES[:, :, ::-1]
    with pytest.raises(ValueError, match="C-contiguous"):
        tk.gather_normalize([strided], idx, _out(), TABLE)
    with pytest.raises(TypeError):
        _core.gather_normalize([strided], idx, _out(), TABLE, None, "CHW")
    big = np.zeros((3, 3, 5, 14), np.float32)[..., ::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        tk.gather_normalize([IMAGES], idx, big, TABLE)
    with pytest.raises(TypeError):
        _core.gather_normalize([IMAGES], idx, big, TABLE, None, "CHW")
    ro = _out()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        tk.gather_normalize([IMAGES], idx, ro, TABLE)
    with pytest.raises(TypeError):
        _core.gather_normalize([IMAGES], idx, ro, TABLE, None, "CHW")


def test_shape_mismatches_raise_value_errors():
    idx = np.array([0, 1, 2], np.int64)
    with pytest.raises(ValueError, match="first dimension must equal len"):
        tk.gather_normalize([IMAGES], idx, _out(b=4), TABLE)
    with pytest.raises(ValueError, match="source images are 5x7x3"):
        tk.gather_normalize([IMAGES], idx, np.zeros((3, 3, 5, 8), np.float32), TABLE)
    with pytest.raises(ValueError, match=r"table has shape \(1, 256\)"):
        tk.gather_normalize([IMAGES], idx, _out(), TABLE[:1])
    with pytest.raises(ValueError, match="same per-sample shape"):
        tk.gather_normalize([IMAGES, IMAGES[:, :4].copy()], idx, _out(), TABLE)
    with pytest.raises(ValueError, match="expected 1 or 3"):
        tk.gather_u8(
            [np.zeros((2, 5, 7, 4), np.uint8)], idx[:1] * 0, np.zeros((1, 4, 5, 7), np.uint8), layout="CHW"
        )
    with pytest.raises(ValueError, match=r"flip has shape \(2,\)"):
        tk.gather_normalize([IMAGES], idx, _out(), TABLE, flip=np.ones(2, np.uint8))
    with pytest.raises(ValueError, match="sources is empty"):
        tk.gather_normalize([], idx, _out(), TABLE)
    with pytest.raises(ValueError, match="layout must be"):
        tk.gather_normalize([IMAGES], idx, _out(), TABLE, layout="NCHW")
    with pytest.raises(ValueError, match=r"boxes has shape"):
        tk.gather_crop_resize([IMAGES], idx, np.zeros((3, 3), np.int32), _out())
    with pytest.raises(ValueError, match=r"expected \(3, 4\)"):
        tk.gather_rows([np.zeros((6, 4), np.uint8)], idx, np.zeros((3, 5), np.uint8))


def test_gather_columns_checks_everything_before_writing():
    a = [np.arange(12, dtype=np.uint8).reshape(6, 2)]
    b = [np.arange(24, dtype=np.uint8).reshape(6, 4)]
    idx = np.array([5, 0, 3], np.int64)

    def outs():
        return [np.full((3, 2), 9, np.uint8), np.full((3, 4), 9, np.uint8)]

    o = outs()
    with pytest.raises(IndexError, match=r"indices\[1\] = 6 is out of range for 6 rows"):
        tk.gather_columns([a, b], np.array([5, 6, 0], np.int64), o)
    assert all(_untouched(x) for x in o)
    o = outs()
    with pytest.raises(ValueError, match=r"outs\[1\] has shape \(3, 4\); expected \(3, 2\)"):
        tk.gather_columns([a, a], idx, o)
    assert all(_untouched(x) for x in o)
    with pytest.raises(ValueError, match="segments of other row counts"):
        tk.gather_columns([a, [b[0][:3], b[0][3:]]], idx, outs())
    with pytest.raises(ValueError, match="one output per column"):
        tk.gather_columns([a, b], idx, outs()[:1])
    shared = np.full((6, 2), 9, np.uint8)
    with pytest.raises(ValueError, match=r"outs\[1\] overlaps outs\[0\]"):
        tk.gather_columns([a, a], idx, [shared[:3], shared[2:5]])
    with pytest.raises(TypeError, match="uint8"):
        tk.gather_columns([[a[0].view(np.int8)]], idx, [np.zeros((3, 2), np.uint8)])
    with pytest.raises(TypeError, match="list of lists"):
        tk.gather_columns(a[0], idx, outs())
    tk.gather_columns([], idx, [])  # nothing to gather


def test_out_overlapping_a_source_is_refused():
    buf = np.zeros((4, 2, 2, 3), np.uint8)
    with pytest.raises(ValueError, match="overlaps"):
        tk.gather_u8([buf], np.array([0, 1], np.int64), buf[2:], layout="HWC")


def test_settings_are_validated():
    with pytest.raises(ValueError):
        tk.set_num_threads(0)
    with pytest.raises(ValueError, match="available here"):
        tk.set_simd("avx512-imaginary")


def test_package_metadata():
    from importlib.metadata import version

    assert tk.__version__ == version("tbl-kernels")
    assert isinstance(tk.KERNELS_ABI, int) and tk.KERNELS_ABI == _core.KERNELS_ABI
    assert tk.__all__ == sorted(tk.__all__)
    assert "scalar" in tk.simd_levels() and tk.simd_level() in tk.simd_levels()


def test_simd_level_from_environment():
    import os
    import subprocess
    import sys

    code = "import tbl_kernels; print(tbl_kernels.simd_level())"
    env = {**os.environ, "TBL_KERNELS_SIMD": "scalar"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert res.stdout.strip() == "scalar"
    env["TBL_KERNELS_SIMD"] = "bogus"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode != 0 and "unknown or unsupported SIMD level 'bogus'" in res.stderr
