#include "pillow_resize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "dispatch.hpp"
#include "errors.hpp"

// The passes are integer-only, so every instruction set gives the same bytes: where the
// compiler can, the vertical pass is built twice (AVX2 and the baseline) and the loader picks one.
#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__)
#define TBL_PASS_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TBL_PASS_CLONES
#endif
// The horizontal pass has an AVX2 body of its own, chosen at run time on x86-64.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TBL_X86_DISPATCH 1
#include <immintrin.h>
#else
#define TBL_X86_DISPATCH 0
#endif

namespace tbl {
namespace {

constexpr double kPi = 3.14159265358979323846;  // M_PI's value, which not every compiler defines

// The filters and their supports exactly as Pillow writes them (double precision; the
// build uses -ffp-contract=off, as Pillow's x86-64 builds have no FMA to contract into).
double box_filter(double x) { return (x > -0.5 && x <= 0.5) ? 1.0 : 0.0; }

double bilinear_filter(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

double hamming_filter(double x) {
    if (x < 0.0) x = -x;
    if (x == 0.0) return 1.0;
    if (x >= 1.0) return 0.0;
    x = x * kPi;
    return std::sin(x) / x * (0.54f + 0.46f * std::cos(x));  // float constants, as in Pillow
}

double bicubic_filter(double x) {
    const double a = -0.5;
    if (x < 0.0) x = -x;
    if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
    if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
    return 0.0;
}

double sinc_filter(double x) {
    if (x == 0.0) return 1.0;
    x = x * kPi;
    return std::sin(x) / x;
}

double lanczos_filter(double x) {
    if (-3.0 <= x && x < 3.0) return sinc_filter(x) * sinc_filter(x / 3);
    return 0.0;
}

struct Filter {
    double (*fn)(double);
    double support;
};

Filter filter_of(int code) {
    switch (static_cast<PillowFilter>(code)) {
        case PillowFilter::Box: return {box_filter, 0.5};
        case PillowFilter::Bilinear: return {bilinear_filter, 1.0};
        case PillowFilter::Hamming: return {hamming_filter, 1.0};
        case PillowFilter::Bicubic: return {bicubic_filter, 2.0};
        case PillowFilter::Lanczos: return {lanczos_filter, 3.0};
    }
    throw ValueError("pillow_resize: unknown filter code " + std::to_string(code) +
                     " (Pillow's Resampling: 1 lanczos, 2 bilinear, 3 bicubic, 4 box, 5 hamming)");
}

constexpr int32_t kHalf = 1 << (kPillowPrecisionBits - 1);

inline uint8_t clip8(int32_t v) {
    v >>= kPillowPrecisionBits;  // arithmetic shift, as Pillow's table index
    return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// A pixel's sums, rounded as Pillow rounds them, as C bytes (4: an intermediate image as Pillow keeps
// it; 3: the RGB result).
template <int C>
inline void store_pixel(const int32_t* acc, uint8_t* d) {
    for (int c = 0; c < C; ++c) d[c] = clip8(acc[c]);
}

// The horizontal pass reads each output pixel's window from `first` on, `even` taps (an even number,
// two pixels per step), with the weights laid out per byte: weights[(x * even + t) * 4 + c] is the
// weight of tap t for every byte c of that pixel. Integer addition in any order gives Pillow's sum.
struct HorizontalPlan {
    int64_t even = 0;
    std::vector<int64_t> first;
    std::vector<int32_t> weights;
};

template <int C>
void horizontal_rows_plain(const uint8_t* src, int64_t src_stride, int64_t row0, int64_t rows, int64_t out_w,
                           const HorizontalPlan& plan, uint8_t* dst) {
    const int64_t even = plan.even;
    for (int64_t y = 0; y < rows; ++y) {
        const uint8_t* s = src + (row0 + y) * src_stride;
        uint8_t* d = dst + y * out_w * C;
        const int32_t* w = plan.weights.data();
        for (int64_t x = 0; x < out_w; ++x, w += even * 4) {
            const uint8_t* p = s + plan.first[x] * 4;
            int32_t acc[4] = {kHalf, kHalf, kHalf, kHalf};
            for (int64_t t = 0; t < even; ++t)
                for (int c = 0; c < 4; ++c) acc[c] += static_cast<int32_t>(p[t * 4 + c]) * w[t * 4 + c];
            store_pixel<C>(acc, d + x * C);
        }
    }
}

#if TBL_X86_DISPATCH
// Eight int32 lanes hold two pixels: one 8-byte load, widened, times eight weights, per step.
template <int C>
__attribute__((target("avx2"))) void horizontal_rows_avx2(const uint8_t* src, int64_t src_stride, int64_t row0,
                                                          int64_t rows, int64_t out_w, const HorizontalPlan& plan,
                                                          uint8_t* dst) {
    const int64_t even = plan.even;
    const __m128i half = _mm_set1_epi32(kHalf);
    for (int64_t y = 0; y < rows; ++y) {
        const uint8_t* s = src + (row0 + y) * src_stride;
        uint8_t* d = dst + y * out_w * C;
        const int32_t* w = plan.weights.data();
        for (int64_t x = 0; x < out_w; ++x) {
            const uint8_t* p = s + plan.first[x] * 4;
            __m256i acc = _mm256_setzero_si256();
            for (int64_t t = 0; t < even; t += 2, w += 8) {
                const __m256i px = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + t * 4)));
                const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
                acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(px, k));
            }
            __m128i sum = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
            sum = _mm_srai_epi32(_mm_add_epi32(sum, half), kPillowPrecisionBits);
            // Saturating packs to int16 then uint8: the clamp to [0, 255] of clip8, for any int32.
            const __m128i bytes = _mm_packus_epi16(_mm_packs_epi32(sum, sum), _mm_setzero_si128());
            const uint32_t v = static_cast<uint32_t>(_mm_cvtsi128_si32(bytes));
            std::memcpy(d + x * C, &v, C);
        }
    }
}
#endif

// Rows [row0, row0 + rows) of src (4 bytes per pixel, rows src_stride apart) resampled along x into
// dst: C bytes per pixel, out_w pixels per row.
template <int C>
void horizontal_pass(const uint8_t* src, int64_t src_stride, int64_t in_w, int64_t row0, int64_t rows,
                     const PillowAxis& ax, uint8_t* dst) {
    const int64_t out_w = static_cast<int64_t>(ax.start.size()), taps = ax.taps;
    HorizontalPlan plan;
    // An even window, moved left where it would run past the row's end (the extra tap weighs 0); a row
    // narrower than that keeps Pillow's odd window.
    plan.even = (taps + 1) / 2 * 2 <= in_w ? (taps + 1) / 2 * 2 : taps;
    plan.first.resize(out_w);
    plan.weights.assign(static_cast<size_t>(out_w * plan.even * 4), 0);
    for (int64_t x = 0; x < out_w; ++x) {
        plan.first[x] = std::min<int64_t>(ax.start[x], in_w - plan.even);
        const int64_t shift = ax.start[x] - plan.first[x];
        for (int64_t k = 0; k < taps; ++k)
            for (int c = 0; c < 4; ++c) plan.weights[((x * plan.even) + shift + k) * 4 + c] = ax.coef[x * taps + k];
    }
#if TBL_X86_DISPATCH
    // The level `tbl_kernels.set_simd` selects (an AVX2 level only where this CPU has it).
    if (plan.even % 2 == 0 && active_kernels().avx2) {
        horizontal_rows_avx2<C>(src, src_stride, row0, rows, out_w, plan, dst);
        return;
    }
#endif
    horizontal_rows_plain<C>(src, src_stride, row0, rows, out_w, plan, dst);
}

// src (4 bytes per pixel, `width` pixels per row, rows src_stride apart; row r is input row r + row0)
// resampled along y into dst, C bytes per pixel. acc holds width * 4 int32.
template <int C>
TBL_PASS_CLONES void vertical_pass(const uint8_t* src, int64_t src_stride, int64_t row0, int64_t width,
                                   const PillowAxis& ax, uint8_t* dst, int32_t* acc) {
    const int64_t out_h = static_cast<int64_t>(ax.start.size()), taps = ax.taps, n = width * 4;
    for (int64_t y = 0; y < out_h; ++y) {
        for (int64_t i = 0; i < n; ++i) acc[i] = kHalf;
        for (int64_t t = 0; t < taps; ++t) {
            const uint8_t* r = src + (ax.start[y] + t - row0) * src_stride;
            const int32_t k = ax.coef[y * taps + t];
            for (int64_t i = 0; i < n; ++i) acc[i] += static_cast<int32_t>(r[i]) * k;
        }
        uint8_t* d = dst + y * width * C;
        for (int64_t x = 0; x < width; ++x) store_pixel<C>(acc + x * 4, d + x * C);
    }
}

// rows x cols pixels of 4 bytes from src (rows src_stride apart) to dst as RGB.
void drop_pad(const uint8_t* src, int64_t src_stride, int64_t rows, int64_t cols, uint8_t* dst) {
    for (int64_t y = 0; y < rows; ++y) {
        const uint8_t* s = src + y * src_stride;
        uint8_t* d = dst + y * cols * 3;
        for (int64_t x = 0; x < cols; ++x)
            for (int c = 0; c < 3; ++c) d[x * 3 + c] = s[x * 4 + c];
    }
}

}  // namespace

PillowAxis pillow_axis(int in_size, float in0, float in1, int out_size, PillowFilter filter) {
    const Filter f = filter_of(static_cast<int>(filter));
    // Each line mirrors precompute_coeffs; the single-precision subtraction is Pillow's too.
    const double scale = static_cast<double>(in1 - in0) / out_size;
    const double filterscale = scale < 1.0 ? 1.0 : scale;
    const double support = f.support * filterscale;
    const int ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
    std::vector<int> first(out_size), count(out_size);
    std::vector<int32_t> q(static_cast<size_t>(out_size) * ksize, 0);
    std::vector<double> k(ksize);
    int taps = 1;
    for (int xx = 0; xx < out_size; ++xx) {
        const double center = in0 + (xx + 0.5) * scale;
        double ww = 0.0;
        const double ss = 1.0 / filterscale;
        int xmin = static_cast<int>(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = static_cast<int>(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        for (int x = 0; x < xmax; ++x) {
            const double w = f.fn((x + xmin - center + 0.5) * ss);
            k[x] = w;
            ww += w;
        }
        for (int x = 0; x < xmax; ++x) {
            if (ww != 0.0) k[x] /= ww;
            // normalize_coeffs_8bpc
            q[static_cast<size_t>(xx) * ksize + x] = k[x] < 0 ? static_cast<int>(-0.5 + k[x] * (1 << kPillowPrecisionBits))
                                                               : static_cast<int>(0.5 + k[x] * (1 << kPillowPrecisionBits));
        }
        first[xx] = xmin;
        count[xx] = std::max(xmax, 0);
        taps = std::max(taps, count[xx]);
    }
    taps = std::min(taps, in_size);
    PillowAxis ax;
    ax.taps = taps;
    ax.start.assign(out_size, 0);
    ax.coef.assign(static_cast<size_t>(out_size) * taps, 0);
    for (int o = 0; o < out_size; ++o) {
        // A window that would run past the end starts earlier; its extra leading taps weigh 0.
        const int s = std::min(first[o], in_size - taps);
        ax.start[o] = s;
        for (int x = 0; x < count[o]; ++x)
            ax.coef[static_cast<size_t>(o) * taps + (first[o] - s) + x] = q[static_cast<size_t>(o) * ksize + x];
    }
    return ax;
}

void pillow_resize_rgb(const uint8_t* src, int64_t src_stride, int in_w, int in_h, const float box[4],
                       int out_w, int out_h, int filter, bool horizontal_first, uint8_t* dst) {
    // _resize's checks, in its order and with its messages.
    if (out_w < 1 || out_h < 1) throw ValueError("height and width must be > 0");
    if (box[0] < 0 || box[1] < 0) throw ValueError("box offset can't be negative");
    if (box[2] > in_w || box[3] > in_h) throw ValueError("box can't exceed original image size");
    if (box[2] - box[0] < 0 || box[3] - box[1] < 0) throw ValueError("box can't be empty");
    filter_of(filter);  // an unknown code fails here, before any work

    // An integral box of the output's size: Pillow crops, no filter.
    if (box[0] - static_cast<int>(box[0]) == 0 && box[2] - box[0] == out_w && box[1] - static_cast<int>(box[1]) == 0 &&
        box[3] - box[1] == out_h) {
        drop_pad(src + static_cast<int64_t>(box[1]) * src_stride + static_cast<int64_t>(box[0]) * 4, src_stride, out_h,
                 out_w, dst);
        return;
    }
    const auto code = static_cast<PillowFilter>(filter);
    // ImagingResampleInner: a pass only on an axis that changes (Pillow's tests, verbatim).
    const bool need_horizontal = out_w != in_w || box[0] != 0 || box[2] != out_w;
    const bool need_vertical = out_h != in_h || box[1] != 0 || box[3] != out_h;
    if (!need_horizontal && !need_vertical) {
        drop_pad(src, src_stride, in_h, in_w, dst);
        return;
    }
    std::vector<uint8_t> temp;
    if (need_horizontal && need_vertical && horizontal_first) {
        const PillowAxis horiz = pillow_axis(in_w, box[0], box[2], out_w, code);
        const PillowAxis vert = pillow_axis(in_h, box[1], box[3], out_h, code);
        // Only the input rows the vertical pass reads go through the horizontal one.
        const int64_t lo = vert.start.front(), hi = vert.start.back() + vert.taps;
        temp.resize(static_cast<size_t>((hi - lo) * out_w * 4));
        horizontal_pass<4>(src, src_stride, in_w, lo, hi - lo, horiz, temp.data());
        std::vector<int32_t> acc(static_cast<size_t>(out_w) * 4);
        vertical_pass<3>(temp.data(), static_cast<int64_t>(out_w) * 4, lo, out_w, vert, dst, acc.data());
    } else if (need_horizontal && need_vertical) {  // Pillow 13's vertical-first order
        const PillowAxis vert = pillow_axis(in_h, box[1], box[3], out_h, code);
        const PillowAxis horiz = pillow_axis(in_w, box[0], box[2], out_w, code);
        temp.resize(static_cast<size_t>(out_h) * in_w * 4);
        std::vector<int32_t> acc(static_cast<size_t>(in_w) * 4);
        vertical_pass<4>(src, src_stride, 0, in_w, vert, temp.data(), acc.data());
        horizontal_pass<3>(temp.data(), static_cast<int64_t>(in_w) * 4, in_w, 0, out_h, horiz, dst);
    } else if (need_horizontal) {
        const PillowAxis horiz = pillow_axis(in_w, box[0], box[2], out_w, code);
        horizontal_pass<3>(src, src_stride, in_w, 0, in_h, horiz, dst);
    } else {
        const PillowAxis vert = pillow_axis(in_h, box[1], box[3], out_h, code);
        std::vector<int32_t> acc(static_cast<size_t>(in_w) * 4);
        vertical_pass<3>(src, src_stride, 0, in_w, vert, dst, acc.data());
    }
}

}  // namespace tbl
