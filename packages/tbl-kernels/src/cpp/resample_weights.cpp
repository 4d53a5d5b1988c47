#include "resample_weights.hpp"

#include <algorithm>
#include <cmath>

namespace tbl {
namespace {

// Triangle ("bilinear") filter with support 1.
double triangle(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

}  // namespace

// Every double operation below is mirrored one for one by the numpy reference;
// the build uses -ffp-contract=off so no multiply-add is fused.
void compute_axis_weights(int64_t in_size, int64_t out_size, AxisWeights& w) {
    // 0.0 + x == x for every x the rule meets, so this is the window rule with the whole input.
    compute_axis_weights(in_size, 0.0, static_cast<double>(in_size), out_size, w);
}

void compute_axis_weights(int64_t in_size, double box0, double box_size, int64_t out_size, AxisWeights& w) {
    const double scale = box_size / static_cast<double>(out_size);
    const double filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = 1.0 * filterscale;
    const double ss = 1.0 / filterscale;
    const int64_t max_window = static_cast<int64_t>(std::ceil(support)) * 2 + 1;

    std::vector<int64_t> first(out_size), count(out_size);
    std::vector<int32_t> q(out_size * max_window, 0);
    std::vector<double> k(max_window);
    int64_t taps = 1;
    for (int64_t o = 0; o < out_size; ++o) {
        const double center = box0 + (static_cast<double>(o) + 0.5) * scale;
        int64_t xmin = static_cast<int64_t>(std::floor(center - support + 0.5));
        if (xmin < 0) xmin = 0;
        int64_t xmax = static_cast<int64_t>(std::floor(center + support + 0.5));
        if (xmax > in_size) xmax = in_size;
        const int64_t n = xmax - xmin;
        double total = 0.0;
        for (int64_t x = 0; x < n; ++x) {
            k[x] = triangle((static_cast<double>(x + xmin) - center + 0.5) * ss);
            total += k[x];
        }
        // Quantize: floor(w * 2**14 + 0.5) of the sum-normalized weight.
        int64_t lo = -1, hi = -1;
        for (int64_t x = 0; x < n; ++x) {
            const double nw = total != 0.0 ? k[x] / total : k[x];
            const int32_t v = static_cast<int32_t>(std::floor(nw * static_cast<double>(1 << kPrecisionBits) + 0.5));
            q[o * max_window + x] = v;
            if (v != 0) {
                if (lo < 0) lo = x;
                hi = x;
            }
        }
        if (lo < 0) lo = hi = 0;  // cannot happen for the triangle filter; keeps the window valid
        // Shift so the window starts at the first non-zero coefficient.
        for (int64_t x = lo; x <= hi; ++x) q[o * max_window + x - lo] = q[o * max_window + x];
        for (int64_t x = hi - lo + 1; x < max_window; ++x) q[o * max_window + x] = 0;
        first[o] = xmin + lo;
        count[o] = hi - lo + 1;
        taps = std::max(taps, count[o]);
    }
    taps = std::min(taps, in_size);
    w.taps = taps;
    w.start.assign(out_size, 0);
    w.coef.assign(out_size * taps, 0);
    for (int64_t o = 0; o < out_size; ++o) {
        // Move the window left where it would run past the end; the extra leading
        // positions get coefficient 0, which adds exactly nothing.
        const int64_t s = std::min(first[o], in_size - taps);
        w.start[o] = static_cast<int32_t>(s);
        for (int64_t x = 0; x < count[o]; ++x)
            w.coef[o * taps + (first[o] - s) + x] = static_cast<int16_t>(q[o * max_window + x]);
    }
}

}  // namespace tbl
