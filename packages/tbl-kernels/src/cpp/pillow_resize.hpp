// Pillow's resize of an 8-bit RGB image, bit for bit, written straight into RGB (3 bytes per pixel).
//
// The same arithmetic as Pillow's Image.resize (libImaging/Resample.c and _imaging.c's
// _resize): double-precision filter weights normalized to 22-bit fixed point, a horizontal
// pass then a vertical pass, each summing in int32 and rounding to uint8, the crop shortcut
// for an integral box of the output's size, and no pass on an axis that does not change.
// What differs is only how the work is laid out: every output position of an axis reads the
// same number of taps (positions outside Pillow's window carry weight 0 and add exactly
// nothing), the loops run over whole rows, and the result lands in the caller's buffer as
// RGB instead of in a new 4-byte-per-pixel image that tobytes() would then pack.
#pragma once

#include <cstdint>
#include <vector>

namespace tbl {

// Pillow's Resampling codes for the filters this resize takes.
enum class PillowFilter : int { Lanczos = 1, Bilinear = 2, Bicubic = 3, Box = 4, Hamming = 5 };

constexpr int kPillowPrecisionBits = 32 - 8 - 2;  // Pillow's PRECISION_BITS for 8-bit images

// One axis: output position o reads input positions start[o] .. start[o] + taps - 1 with the
// int32 weights coef[o * taps ..]; every window lies inside [0, in_size).
struct PillowAxis {
    int64_t taps = 0;
    std::vector<int32_t> start;
    std::vector<int32_t> coef;
};

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for the box [in0, in1) of an axis of
// in_size positions resized to out_size, with the windows widened to a common tap count.
PillowAxis pillow_axis(int in_size, float in0, float in1, int out_size, PillowFilter filter);

// src: in_h rows of in_w pixels of 4 bytes (R, G, B, pad), rows `src_stride` bytes apart.
// dst: out_h * out_w * 3 bytes. box: Pillow's (left, upper, right, lower) in single precision.
// horizontal_first: the pass order where both axes change (always true before Pillow 13, which
// runs the vertical pass first where the height shrinks by more than twice the width).
// ValueError for sizes or a box Pillow refuses, or a filter code it does not know.
void pillow_resize_rgb(const uint8_t* src, int64_t src_stride, int in_w, int in_h, const float box[4],
                       int out_w, int out_h, int filter, bool horizontal_first, uint8_t* dst);

}  // namespace tbl
