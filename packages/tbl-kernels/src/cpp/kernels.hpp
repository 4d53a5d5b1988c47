// Per-sample kernel entry points, one table per instruction-set level.
//
// Each isa_*.cpp file includes isa_impl.inl inside its own namespace and is built
// with its own target flags; the bodies are integer-only, so every level produces
// the same bits. dispatch.cpp picks the level at run time.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "resample_weights.hpp"

namespace tbl {

// One HWC uint8 image (or a transposed one, see `transposed`) written to one output
// sample: optional horizontal flip, CHW or HWC layout, value mapped by `table`
// ((C, 256) entries of the output type) or copied when table is null (uint8 out).
struct WriteSpec {
    int64_t H = 0, W = 0, C = 0;  // output geometry
    bool flip = false;
    bool chw = true;
    // false: pixel (y, x) at src + (y * W + x) * C. true: at src + (x * H + y) * C.
    bool transposed = false;
    // Bytes between source rows when not transposed (0: W * C, a packed image).
    int64_t row_stride = 0;
};

// A 32-bit (float32) table plus an optional arithmetic shortcut. When
// `affine_kind` is non-zero the caller has verified (with affine32_matches, on
// every byte value of every channel) that the level's float64 evaluation
// `v * a[c] + b[c]`, rounded to float32, reproduces the table bit for bit, so the
// writer may compute instead of look up.
struct Lut32 {
    const uint32_t* table = nullptr;
    int affine_kind = 0;
    double a[3] = {0, 0, 0}, b[3] = {0, 0, 0};
};

// A 16-bit table plus an optional arithmetic shortcut. When `affine_kind` is
// non-zero the caller has verified (with affine16_matches, on every byte value of
// every channel) that the level's float32 evaluation `v * a[c] + b[c]`, rounded to
// float16 (kind 1) or bfloat16 (kind 2), reproduces the table bit for bit, so the
// writer may compute instead of look up.
struct Lut16 {
    const uint16_t* table = nullptr;
    const uint32_t* wide = nullptr;  // the same table zero-extended to 32 bits (for gathers)
    int affine_kind = 0;
    float a[3] = {0, 0, 0}, b[3] = {0, 0, 0};
};

constexpr int64_t kTransposePad = 32;

struct IsaKernels {
    const char* name;
    void (*write_u8)(const uint8_t* src, const WriteSpec& s, uint8_t* out);
    void (*write_lut16)(const uint8_t* src, const WriteSpec& s, const Lut16& lut, uint16_t* out);
    void (*write_lut32)(const uint8_t* src, const WriteSpec& s, const Lut32& lut, uint32_t* out);
    // dst row r (r < w.start.size()) = rounded sum_k w.coef[r*taps+k] * src row (w.start[r] + k);
    // rows hold `row_len` bytes; acc holds row_len int32.
    void (*resample_rows)(const uint8_t* src, int64_t src_stride, const AxisWeights& w, int64_t row_len,
                          uint8_t* dst, int32_t* acc);
    // dst (cols x rows pixels) = transpose of src (rows x cols pixels of C bytes);
    // src must carry kTransposePad readable bytes past its end.
    void (*transpose_pixels)(const uint8_t* src, int64_t rows, int64_t cols, int64_t C, uint8_t* dst);
    // null where the level has no arithmetic shortcut.
    bool (*affine16_matches)(int kind, int64_t C, const float* a, const float* b, const uint16_t* table);
    bool (*affine32_matches)(int64_t C, const double* a, const double* b, const uint32_t* table);
    // The level runs AVX2 code (avx2, avx512): code outside these tables with an AVX2 body of its own
    // (pillow_resize) follows the level `set_simd` selected.
    bool avx2;
};

const IsaKernels& isa_scalar();
const IsaKernels& isa_baseline();
#if TBL_HAVE_AVX2
const IsaKernels& isa_avx2();
#endif
#if TBL_HAVE_AVX512
const IsaKernels& isa_avx512();
#endif

}  // namespace tbl
