// Fixed-point resampling weights for one axis (the normative rule is in README.md
// and must stay identical to tbl_kernels.reference.resample_weights).
#pragma once

#include <cstdint>
#include <vector>

namespace tbl {

constexpr int kPrecisionBits = 14;  // coefficients are integers in [0, 2**14]

// Output position o reads input positions start[o] .. start[o] + taps - 1 with the
// integer coefficients coef[o * taps + k]. Every window lies inside [0, in_size);
// positions outside the filter support carry coefficient 0.
struct AxisWeights {
    int64_t taps = 0;
    std::vector<int32_t> start;
    std::vector<int16_t> coef;
};

// The whole input [0, in_size) resized to out_size: the crop-resize rule, where
// the input is the box. in_size >= 1, out_size >= 1 (checked by the caller).
void compute_axis_weights(int64_t in_size, int64_t out_size, AxisWeights& w);

// Output o samples around box0 + (o + 0.5) * (box_size / out_size) with support
// max(box_size / out_size, 1), and the taps are clamped to the whole input
// [0, in_size), not to the window: the resize-crop rule (Pillow's resize with
// box=). The weights above are this one with box0 = 0, box_size = in_size, bit
// for bit. 0 <= box0, 0 < box_size, box0 + box_size <= in_size (checked by the caller).
void compute_axis_weights(int64_t in_size, double box0, double box_size, int64_t out_size, AxisWeights& w);

}  // namespace tbl
