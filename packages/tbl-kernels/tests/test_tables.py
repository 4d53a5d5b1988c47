import bisect
import copy
import pickle
from fractions import Fraction

import numpy as np
import pytest

from tbl_kernels import NormalizationTable, normalization_table
from tbl_kernels.tables import float64_to_bfloat16_bits

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


# All finite non-negative bfloat16 values in increasing order, with their bits.
_POS_BITS = np.arange(0, 0x7F80, dtype=np.uint16)
_POS_VALUES = [Fraction(float(v)) for v in _bf16_to_f64(_POS_BITS)]


def _exact_bf16_bits(x: float) -> int:
    """Round-to-nearest-even of float x to bfloat16, by exact rational comparison."""
    sign = 0x8000 if np.signbit(x) else 0
    a = Fraction(abs(x))
    max_finite = _POS_VALUES[-1]
    ulp_top = max_finite - _POS_VALUES[-2]
    if a >= max_finite + ulp_top / 2:  # halfway to the next binade's first value rounds to inf (even)
        return sign | 0x7F80
    i = bisect.bisect_left(_POS_VALUES, a)
    if i < len(_POS_VALUES) and _POS_VALUES[i] == a:
        return sign | i
    lo, hi = i - 1, i
    if hi == len(_POS_VALUES):
        return sign | lo
    dlo, dhi = a - _POS_VALUES[lo], _POS_VALUES[hi] - a
    if dlo < dhi:
        return sign | lo
    if dhi < dlo:
        return sign | hi
    return sign | (lo if lo % 2 == 0 else hi)


def test_float32_table_is_float64_rounded_once():
    t = normalization_table(MEAN, STD, "float32")
    assert t.shape == (3, 256) and t.dtype == np.float32
    v = np.arange(256, dtype=np.float64)
    for c in range(3):
        exact = (v / 255 - MEAN[c]) / STD[c]
        assert np.array_equal(t[c], exact.astype(np.float32))
        assert t[c][0] == np.float32((0 / 255 - MEAN[c]) / STD[c])


def test_float16_table_rounds_once_from_float64():
    t = normalization_table(MEAN, STD, "float16")
    assert t.dtype == np.float16
    # Check against exact rounding for every entry: nearest float16 by rationals.
    v = np.arange(256, dtype=np.float64)
    for c in range(3):
        exact = (v / 255 - MEAN[c]) / STD[c]
        for x, got in zip(exact, t[c], strict=True):
            g = Fraction(float(got))
            up = Fraction(float(np.nextafter(got, np.float16(np.inf))))
            dn = Fraction(float(np.nextafter(got, np.float16(-np.inf))))
            fx = Fraction(float(x))
            assert abs(fx - g) <= abs(fx - up) and abs(fx - g) <= abs(fx - dn)


def test_bfloat16_table_matches_exact_rounding():
    t = normalization_table(MEAN, STD, "bfloat16")
    assert t.dtype == np.uint16 and t.shape == (3, 256)
    v = np.arange(256, dtype=np.float64)
    for c in range(3):
        exact = (v / 255 - MEAN[c]) / STD[c]
        assert [int(b) for b in t[c]] == [_exact_bf16_bits(float(x)) for x in exact]


def _tie_cases(rng: np.random.Generator, n: int) -> np.ndarray:
    """Exact midpoints between adjacent bfloat16 values, and values one float64 ulp off them."""
    bits = rng.integers(1, 0x7F7F, size=n).astype(np.uint16)
    lo, hi = _bf16_to_f64(bits), _bf16_to_f64(bits + np.uint16(1))
    mid = lo + (hi - lo) / 2  # exact in float64 (8-bit significands)
    return np.concatenate([mid, np.nextafter(mid, np.inf), np.nextafter(mid, -np.inf), -mid])


def test_bfloat16_rounding_many_values_and_ties():
    rng = np.random.default_rng(1)
    values = np.concatenate(
        [
            rng.standard_normal(3000) * 10.0 ** rng.integers(-40, 39, 3000),
            _tie_cases(rng, 1500),
            # Values that round differently via float32 (double rounding): a tie in
            # bfloat16 only after a float32 rounding.
            _bf16_to_f64(np.arange(0x3F80, 0x3F90, dtype=np.uint16)) * (1 + 2.0**-8 + 2.0**-30),
            _bf16_to_f64(np.arange(0x3F80, 0x3F90, dtype=np.uint16)) * (1 + 2.0**-8 - 2.0**-30),
            np.array([0.0, -0.0, 1e-45, 5e-324, -5e-324, 9.2e-41, 3.4e38, 3.39e38, -3.4e38, 1e300, -1e300]),
            _bf16_to_f64(np.array([0x0001, 0x007F, 0x0080, 0x7F7F], dtype=np.uint16)),
        ]
    )
    got = float64_to_bfloat16_bits(values)
    want = np.array([_exact_bf16_bits(float(x)) for x in values], dtype=np.uint16)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(float(values[i]), hex(got[i]), hex(want[i])) for i in bad[:5]]


def test_bfloat16_double_rounding_case_differs_from_float32_path():
    # 1 + 2**-8 + 2**-30: nearest bfloat16 is 1 + 2**-7 (above the tie); through
    # float32 it becomes exactly the tie 1 + 2**-8 and rounds to even 1.0.
    x = np.array([1 + 2.0**-8 + 2.0**-30])
    assert float64_to_bfloat16_bits(x)[0] == 0x3F81
    via_f32 = x.astype(np.float32).view(np.uint32)[0]
    assert via_f32 == 0x3F808000  # the tie, which a float32 path would round down


def test_bfloat16_special_values():
    x = np.array([np.inf, -np.inf, np.nan])
    bits = float64_to_bfloat16_bits(x)
    assert bits[0] == 0x7F80 and bits[1] == 0xFF80 and (bits[2] & 0x7F80) == 0x7F80 and (bits[2] & 0x7F)


@pytest.mark.parametrize(
    "mean,std,dtype",
    [([0.5], [0.0], "float32"), ([0.5, 0.5], [0.2], "float32"), ([], [], "float32"), ([0.5], [0.2], "int8")],
)
def test_table_rejects_bad_arguments(mean, std, dtype):
    with pytest.raises(ValueError):
        normalization_table(mean, std, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_table_carries_its_affine_hint(dtype):
    t = normalization_table(MEAN, STD, dtype)
    assert type(t) is NormalizationTable and isinstance(t, np.ndarray)
    mean, std = np.array(MEAN), np.array(STD)
    assert t.affine_hint == tuple(1.0 / (255.0 * std)) + tuple(-mean / std)
    plain = np.asarray(t)  # the numbers are the table's whatever the class
    assert type(plain) is np.ndarray and np.array_equal(plain, t) and plain.dtype == t.dtype
    # Copies (and pickles) keep the hint; arrays of another shape or dtype do not.
    for same in (t.copy(), copy.deepcopy(t), pickle.loads(pickle.dumps(t))):
        assert type(same) is NormalizationTable and np.array_equal(same, t)
        assert same.affine_hint == t.affine_hint
    for other in (t[:1], t[:, :128], t.view(np.int16 if dtype != "float32" else np.int32)[:, ::2]):
        assert other.affine_hint is None
    assert t.astype(np.float64).affine_hint is None
