"""The normalization table: the normative definition of every normalized output value.

For channel ``c`` and byte ``v`` the value is ``(v / 255 - mean[c]) / std[c]``
evaluated in float64 and rounded once to the output type with round-to-nearest-even.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["TABLE_DTYPES", "NormalizationTable", "float64_to_bfloat16_bits", "normalization_table"]

# Output dtype name -> dtype of the table (bfloat16 is stored as its uint16 bit pattern).
TABLE_DTYPES = {
    "float32": np.dtype(np.float32),
    "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(np.uint16),
}


def float64_to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """Round float64 values to bfloat16 (round to nearest, ties to even) in one step.

    Returns the uint16 bit patterns. Rounding goes straight from the float64 bits:
    going through float32 first would round twice and can differ on near-ties.
    Values beyond the bfloat16 range become +-inf, NaN stays NaN; float64 values
    below bfloat16's subnormal range round correctly as well, because the rounding
    is done on the exact binary value.
    """
    x = np.asarray(x, dtype=np.float64)
    bits = x.view(np.uint64)
    sign = (bits >> np.uint64(63)).astype(np.uint16) << np.uint16(15)
    mag = np.abs(x)
    out = np.zeros(x.shape, dtype=np.uint16)
    nan = np.isnan(x)
    finite = np.isfinite(x)
    # Exact decomposition mag = m * 2**e with m integer (float64 mantissa, 53 bits).
    m, e = np.frexp(np.where(finite, mag, 0.0))  # mag = m * 2**e, 0.5 <= m < 1
    mant = (m * 2.0**53).astype(np.uint64)  # exact: m has at most 53 significant bits
    exp2 = e.astype(np.int64) - 53  # mag = mant * 2**exp2
    # bfloat16: 8 significant bits for normals (exponent of the value >= -126), fixed
    # quantum 2**-133 for subnormals. The value's binary exponent is e - 1.
    quantum_exp = np.maximum(e.astype(np.int64) - 1 - 7, -133)
    shift = quantum_exp - exp2  # number of low mantissa bits dropped, >= 0 for finite non-zero
    shift = np.where(finite & (mag > 0), shift, 0)
    big = shift >= 64  # everything dropped; rounds to 0 (value < quantum / 2 ** 10)
    s = np.minimum(shift, 63).astype(np.uint64)
    q = mant >> s
    rem = mant - (q << s)
    half = np.where(s > 0, np.uint64(1) << (s - np.uint64(1)), np.uint64(0))
    round_up = (s > 0) & ((rem > half) | ((rem == half) & ((q & np.uint64(1)) == np.uint64(1))))
    q = q + round_up.astype(np.uint64)
    q = np.where(big, np.uint64(0), q)
    # Value = q * 2**quantum_exp. Build the bfloat16 encoding: for quantum_exp == -133
    # q is the subnormal field (q == 128 promotes to the smallest normal, which the
    # encoding handles by carrying into the exponent); otherwise q in [128, 256].
    qe = quantum_exp
    enc = np.where(
        qe == -133,
        q,  # subnormal field; carry into exponent works naturally
        (((qe + 7 + 127).astype(np.int64) << 7) + (q.astype(np.int64) - 128)).astype(np.uint64),
    )
    # Overflow to infinity: exponent field 255 or beyond.
    inf_bits = np.uint64(0x7F80)
    enc = np.where(enc >= inf_bits, inf_bits, enc)
    mag_bits = np.where(finite, enc, np.where(nan, np.uint64(0x7FC0), inf_bits))
    mag_bits = np.where(finite & (mag == 0), np.uint64(0), mag_bits)
    out[...] = mag_bits.astype(np.uint16) | sign
    return out


class NormalizationTable(np.ndarray):
    """The ``(C, 256)`` array returned by ``normalization_table``, carrying its affine hint.

    It is a numpy array in every respect; ``affine_hint`` adds the float64
    ``(a_0..a_C-1, b_0..b_C-1)`` with ``v * a[c] + b[c] ~= (v / 255 - mean[c]) / std[c]``
    (``a = 1 / (255 std)``, ``b = -mean / std``). The AVX2 kernels may compute outputs
    this way (float64 for float32 outputs, float32 for 16-bit ones) instead of looking
    them up, but only after checking that it reproduces every entry of the table
    exactly, so a hint that no longer fits (a table changed in place) costs speed,
    never correctness. Copies keep the hint; any other array derived from a table
    (another shape or dtype) has ``affine_hint`` None.
    """

    affine_hint: tuple[float, ...] | None

    def __array_finalize__(self, obj: object) -> None:
        if isinstance(obj, NormalizationTable) and obj.shape == self.shape and obj.dtype == self.dtype:
            self.affine_hint = obj.affine_hint
        else:
            self.affine_hint = None

    # Pickling keeps the hint (numpy's own state has no room for it).
    def __reduce__(self) -> tuple[Any, ...]:
        rebuild, args, state = super().__reduce__()
        return rebuild, args, (state, self.affine_hint)

    def __setstate__(self, state: tuple[Any, Any]) -> None:
        array_state, self.affine_hint = state
        super().__setstate__(array_state)


def normalization_table(
    mean: Sequence[float], std: Sequence[float], dtype: str = "float32"
) -> NormalizationTable:
    """Return the ``(C, 256)`` table mapping byte ``v`` of channel ``c`` to its normalized value.

    ``value = (v / 255 - mean[c]) / std[c]`` computed in float64 and rounded once to
    ``dtype``: ``"float32"``, ``"float16"`` (round-to-nearest-even, direct from
    float64) or ``"bfloat16"`` (returned as ``uint16`` bit patterns, rounded directly
    from float64, never through float32). ``mean`` and ``std`` are in the 0..1 scale,
    one entry per channel (C is 1 or 3 for the image kernels). The table carries
    the affine hint the kernels may use for it (see ``NormalizationTable``).
    """
    if dtype not in TABLE_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(TABLE_DTYPES)}, got {dtype!r}")
    mean64 = np.asarray(mean, dtype=np.float64)
    std64 = np.asarray(std, dtype=np.float64)
    if mean64.ndim != 1 or std64.shape != mean64.shape or mean64.size == 0:
        raise ValueError(
            f"mean and std must be non-empty 1-D sequences of equal length, got shapes {mean64.shape} and {std64.shape}"
        )
    if not (np.all(np.isfinite(mean64)) and np.all(np.isfinite(std64))) or np.any(std64 == 0):
        raise ValueError(f"mean and std must be finite and std non-zero, got mean={mean!r} std={std!r}")
    v = np.arange(256, dtype=np.float64)
    exact = (v[None, :] / 255.0 - mean64[:, None]) / std64[:, None]
    if dtype == "float32":
        table = exact.astype(np.float32)
    elif dtype == "float16":
        table = exact.astype(np.float16)  # numpy casts float64 -> float16 with one rounding
    else:
        table = float64_to_bfloat16_bits(exact)
    result = table.view(NormalizationTable)
    result.affine_hint = tuple(float(x) for x in np.concatenate([1.0 / (255.0 * std64), -mean64 / std64]))
    return result
