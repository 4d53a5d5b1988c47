#include "batch.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "dispatch.hpp"
#include "errors.hpp"
#include "jpeg_decode.hpp"
#include "kernels.hpp"
#include "resample_weights.hpp"
#include "thread_pool.hpp"

namespace tbl {
namespace {

std::string shape_str(const int64_t* shape, size_t ndim) {
    std::string s = "(";
    for (size_t i = 0; i < ndim; ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    if (ndim == 1) s += ",";
    return s + ")";
}
template <typename T>
std::string shape_of(const ArrayRef<T>& a) {
    return shape_str(a.shape, a.ndim);
}
std::string shape_of(const Indices& indices) { return shape_str(&indices.size, 1); }
std::string shape_of(const Boxes& boxes) {
    const int64_t shape[2] = {boxes.rows, boxes.cols};
    return shape_str(shape, 2);
}

bool is(const DType& d, DTypeCode code, int bits) { return d.code == code && d.bits == bits && d.lanes == 1; }

std::string dtype_name(const DType& d) {
    const char* base = "?";
    switch (d.code) {
        case DTypeCode::Int: base = "int"; break;
        case DTypeCode::UInt: base = "uint"; break;
        case DTypeCode::Float: base = "float"; break;
        case DTypeCode::Bfloat: base = "bfloat"; break;
        case DTypeCode::Complex: base = "complex"; break;
        case DTypeCode::Bool: base = "bool"; break;
        case DTypeCode::Other: break;  // newer DLPack codes (float8 variants, ...): "?" plus the bit width
    }
    return std::string(base) + std::to_string(d.bits);
}

// The concatenation of the source arrays, addressed by global sample index.
struct Sources {
    std::vector<const uint8_t*> base;
    std::vector<int64_t> end;  // cumulative row counts
    std::vector<int64_t> sample_shape;
    int64_t sample_bytes = 0;
    int64_t total = 0;
    std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // byte ranges, for the overlap check

    // (source, item within it) of global index i, 0 <= i < total.
    std::pair<size_t, int64_t> locate(int64_t i) const {
        const size_t s = std::upper_bound(end.begin(), end.end(), i) - end.begin();
        return {s, i - (s == 0 ? 0 : end[s - 1])};
    }
    const uint8_t* sample(int64_t i) const {
        const auto [s, item] = locate(i);
        return base[s] + item * sample_bytes;
    }
};

Sources make_sources(const std::vector<InArray>& sources, size_t ndim, const char* what) {
    if (sources.empty()) throw ValueError("sources is empty: pass at least one uint8 array");
    Sources S;
    for (size_t k = 0; k < sources.size(); ++k) {
        const InArray& a = sources[k];
        if (a.ndim != ndim)
            throw ValueError("sources[" + std::to_string(k) + "] has shape " + shape_of(a) + "; expected " + what);
        std::vector<int64_t> shape(a.shape + 1, a.shape + ndim);
        if (k == 0) {
            S.sample_shape = shape;
            S.sample_bytes = 1;
            for (int64_t v : shape) S.sample_bytes *= v;
        } else if (shape != S.sample_shape) {
            throw ValueError("sources[" + std::to_string(k) + "] has shape " + shape_of(a) +
                             " but sources[0] has shape " + shape_of(sources[0]) +
                             ": every source must have the same per-sample shape");
        }
        const auto* data = static_cast<const uint8_t*>(a.data);
        S.base.push_back(data);
        S.total += a.shape[0];
        S.end.push_back(S.total);
        auto p = reinterpret_cast<uintptr_t>(data);
        S.ranges.emplace_back(p, p + a.shape[0] * S.sample_bytes);
    }
    return S;
}

// IndexError unless indices[b] = i addresses one of the S.total items (`items`: what they are).
void check_index(const Sources& S, int64_t b, int64_t i, const char* items) {
    if (i < 0 || i >= S.total)
        throw IndexError("indices[" + std::to_string(b) + "] = " + std::to_string(i) + " is out of range for " +
                         std::to_string(S.total) + " " + items + " in " + std::to_string(S.base.size()) +
                         " source(s)");
}

std::vector<const uint8_t*> resolve(const Sources& S, const Indices& indices) {
    const int64_t B = indices.size;
    const int64_t* idx = indices.data;
    std::vector<const uint8_t*> ptrs(B);
    for (int64_t b = 0; b < B; ++b) {
        check_index(S, b, idx[b], "samples");
        ptrs[b] = S.sample(idx[b]);
    }
    return ptrs;
}

void check_no_overlap(const Sources& S, const OutArray& out) {
    const auto lo = reinterpret_cast<uintptr_t>(out.data);
    const uintptr_t hi = lo + out.nbytes;
    for (size_t k = 0; k < S.ranges.size(); ++k)
        if (lo < S.ranges[k].second && S.ranges[k].first < hi)
            throw ValueError("out overlaps sources[" + std::to_string(k) + "] in memory");
}

bool parse_layout(const std::string& layout) {
    if (layout == "CHW") return true;
    if (layout == "HWC") return false;
    throw ValueError("layout must be 'CHW' or 'HWC', got '" + layout + "'");
}

const uint8_t* check_flip(const InArray* flip, int64_t B) {
    if (flip == nullptr) return nullptr;
    const InArray& f = *flip;
    if (!(is(f.dtype, DTypeCode::UInt, 8) || is(f.dtype, DTypeCode::Bool, 8)))
        throw TypeError("flip must be a uint8 or bool array, got " + dtype_name(f.dtype));
    if (f.shape[0] != B)
        throw ValueError("flip has shape " + shape_of(f) + "; expected (" + std::to_string(B) +
                         ",), one entry per index");
    return static_cast<const uint8_t*>(f.data);
}

void check_batch(const Indices& indices, const OutArray& out) {
    if (out.ndim == 0 || out.shape[0] != indices.size)
        throw ValueError("out has shape " + shape_of(out) + " but indices has shape " + shape_of(indices) +
                         ": out's first dimension must equal len(indices)");
}

// Output (B, C, OH, OW) for CHW or (B, OH, OW, C) for HWC; returns (OH, OW).
std::pair<int64_t, int64_t> check_image_out(const OutArray& out, bool chw, int64_t C) {
    if (out.ndim != 4)
        throw ValueError("out has shape " + shape_of(out) + "; expected 4 dimensions (" +
                         (chw ? "B, C, H, W" : "B, H, W, C") + ")");
    const int64_t oc = chw ? out.shape[1] : out.shape[3];
    if (oc != C)
        throw ValueError("out has shape " + shape_of(out) + " with " + std::to_string(oc) + " channels for layout " +
                         (chw ? "CHW" : "HWC") + " but the sources have " + std::to_string(C));
    return chw ? std::make_pair(out.shape[2], out.shape[3]) : std::make_pair(out.shape[1], out.shape[2]);
}

// Element size (2 or 4) of the normalized output; table and out must agree.
int check_table(const InArray& table, const OutArray& out, int64_t C) {
    const DType td = table.dtype, od = out.dtype;
    if (table.shape[0] != C || table.shape[1] != 256)
        throw ValueError("table has shape " + shape_of(table) + "; expected (" + std::to_string(C) + ", 256) for " +
                         std::to_string(C) + "-channel sources");
    if (is(td, DTypeCode::Float, 32)) {
        if (!is(od, DTypeCode::Float, 32))
            throw TypeError("out has dtype " + dtype_name(od) + " but table is float32");
        return 4;
    }
    if (is(td, DTypeCode::Float, 16)) {
        if (!is(od, DTypeCode::Float, 16))
            throw TypeError("out has dtype " + dtype_name(od) + " but table is float16");
        return 2;
    }
    if (is(td, DTypeCode::UInt, 16)) {  // bfloat16 bits
        if (!(is(od, DTypeCode::UInt, 16) || is(od, DTypeCode::Int, 16) || is(od, DTypeCode::Bfloat, 16)))
            throw TypeError("out has dtype " + dtype_name(od) +
                            " but table is uint16 (bfloat16 bits): out must be uint16, int16 or bfloat16");
        return 2;
    }
    throw TypeError("table has dtype " + dtype_name(td) +
                    "; expected float32, float16 or uint16 (bfloat16 bits), see normalization_table");
}

void check_u8_out(const OutArray& out) {
    if (!is(out.dtype, DTypeCode::UInt, 8))
        throw TypeError("out has dtype " + dtype_name(out.dtype) + "; expected uint8");
}

int64_t sample_elems(const OutArray& out) {
    int64_t n = 1;
    for (size_t d = 1; d < out.ndim; ++d) n *= out.shape[d];
    return n;
}

// ---------------------------------------------------------------- image output

// Zero-extended 32-bit copy of a 16-bit table (empty for other element sizes).
std::vector<uint32_t> widen_table(const void* table, int elem, int64_t C) {
    std::vector<uint32_t> wide;
    if (elem == 2) {
        const auto* t = static_cast<const uint16_t*>(table);
        wide.assign(t, t + C * 256);
    }
    return wide;
}

// The 16-bit lookup description; the affine hint (a, b per channel) is used only
// if the active level reproduces every entry of the table with it.
Lut16 make_lut16(const IsaKernels& K, const InArray& table, const std::vector<uint32_t>& wide, int64_t C,
                 const std::vector<double>* hint) {
    Lut16 lut;
    lut.table = static_cast<const uint16_t*>(table.data);
    lut.wide = wide.data();
    if (!hint || !K.affine16_matches || hint->size() != static_cast<size_t>(2 * C)) return lut;
    const int kind = is(table.dtype, DTypeCode::Float, 16) ? 1 : 2;
    // float32 constants: the nearest floats to the float64 hint.
    for (int64_t c = 0; c < C; ++c)
        lut.a[c] = static_cast<float>((*hint)[c]), lut.b[c] = static_cast<float>((*hint)[C + c]);
    if (K.affine16_matches(kind, C, lut.a, lut.b, lut.table)) lut.affine_kind = kind;
    return lut;
}

Lut32 make_lut32(const IsaKernels& K, const InArray& table, int64_t C, const std::vector<double>* hint) {
    Lut32 lut;
    lut.table = static_cast<const uint32_t*>(table.data);
    if (!hint || !K.affine32_matches || hint->size() != static_cast<size_t>(2 * C)) return lut;
    for (int64_t c = 0; c < C; ++c) lut.a[c] = (*hint)[c], lut.b[c] = (*hint)[C + c];
    if (K.affine32_matches(C, lut.a, lut.b, lut.table)) lut.affine_kind = 1;
    return lut;
}

// The output side of one image call, shared by its threads: the element size
// (elem: 4 or 2 for normalized outputs, 1 for uint8) and the lookup state.
// Not copyable: lut16.wide points into `wide`.
struct OutputLuts {
    const IsaKernels& K;
    const int elem;
    std::vector<uint32_t> wide;
    Lut16 lut16{};
    Lut32 lut32{};

    OutputLuts(const IsaKernels& kernels, const InArray* table, int elem_bytes, int64_t C,
               const std::vector<double>* hint)
        : K(kernels), elem(elem_bytes), wide(widen_table(table ? table->data : nullptr, elem_bytes, C)) {
        if (elem == 2) lut16 = make_lut16(K, *table, wide, C, hint);
        if (elem == 4) lut32 = make_lut32(K, *table, C, hint);
    }
    OutputLuts(const OutputLuts&) = delete;
    OutputLuts& operator=(const OutputLuts&) = delete;

    // One HWC image (see WriteSpec) into output sample `o`.
    void write(const uint8_t* img, const WriteSpec& s, uint8_t* o) const {
        if (elem == 4)
            K.write_lut32(img, s, lut32, reinterpret_cast<uint32_t*>(o));
        else if (elem == 2)
            K.write_lut16(img, s, lut16, reinterpret_cast<uint16_t*>(o));
        else
            K.write_u8(img, s, o);
    }
};

// Image sources (N_k, H, W, C) with C in {1, 3}.
Sources image_sources(const std::vector<InArray>& sources) {
    Sources S = make_sources(sources, 4, "(N, H, W, C) uint8 with C in {1, 3}");
    const int64_t C = S.sample_shape[2];
    if (C != 1 && C != 3) throw ValueError("sources have " + std::to_string(C) + " channels; expected 1 or 3");
    return S;
}

// Element size of out (4 or 2 through the table, 1 for uint8), after checking it.
int check_image_dtype(const InArray* table, const OutArray& out, int64_t C) {
    if (table) return check_table(*table, out, C);
    check_u8_out(out);
    return 1;
}

// Resampling weights of one (input size, output size) pair, cached per thread:
// random crops of a batch repeat sizes, and computing the float64 weights per
// image cost about a tenth of the crop path. The cache is emptied when it grows
// past a few MiB, which only ever happens before either lookup of a sample.
class AxisWeightsCache {
   public:
    // Weights for (h, OH) and (w, OW); valid until the next call.
    std::pair<const AxisWeights*, const AxisWeights*> get(int64_t h, int64_t OH, int64_t w, int64_t OW) {
        if (bytes_ > kMaxBytes) map_.clear(), bytes_ = 0;
        const AxisWeights* v = &lookup(h, OH);
        return {v, &lookup(w, OW)};  // unordered_map never moves its elements on insert
    }

   private:
    static constexpr size_t kMaxBytes = size_t{8} << 20;
    const AxisWeights& lookup(int64_t in, int64_t out) {
        const uint64_t key = (static_cast<uint64_t>(in) << 32) | static_cast<uint64_t>(out);
        auto [it, inserted] = map_.try_emplace(key);
        if (inserted) {
            compute_axis_weights(in, out, it->second);
            bytes_ += it->second.start.size() * sizeof(int32_t) + it->second.coef.size() * sizeof(int16_t) + 64;
        }
        return it->second;
    }
    std::unordered_map<uint64_t, AxisWeights> map_;
    size_t bytes_ = 0;
};

// Resampling weights of one window (input size, float64 start and size, output size), cached per
// thread the same way: the evaluation transform gives every image of one size the same windows, and
// computing them cost about a tenth of its resize. Keyed on the exact float64 bits, so a hit returns
// what compute_axis_weights would.
class WindowWeightsCache {
   public:
    // Weights of the rows' window and the columns' window; valid until the next call.
    std::pair<const AxisWeights*, const AxisWeights*> get(int64_t H, double top, double height, int64_t OH,
                                                          int64_t W, double left, double width, int64_t OW) {
        if (bytes_ > kMaxBytes) map_.clear(), bytes_ = 0;
        const AxisWeights* v = &lookup(H, top, height, OH);
        return {v, &lookup(W, left, width, OW)};  // unordered_map never moves its elements on insert
    }

   private:
    const AxisWeights& lookup(int64_t in_size, double start, double size, int64_t out_size) {
        const Key key{in_size, out_size, bits(start), bits(size)};
        auto [it, inserted] = map_.try_emplace(key);
        if (inserted) {
            compute_axis_weights(in_size, start, size, out_size, it->second);
            bytes_ += it->second.start.size() * sizeof(int32_t) + it->second.coef.size() * sizeof(int16_t) + 96;
        }
        return it->second;
    }
    struct Key {
        int64_t in_size, out_size;
        uint64_t start, size;
        bool operator==(const Key& o) const {
            return in_size == o.in_size && out_size == o.out_size && start == o.start && size == o.size;
        }
    };
    struct KeyHash {
        size_t operator()(const Key& k) const {
            uint64_t h = static_cast<uint64_t>(k.in_size) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(k.out_size);
            for (const uint64_t v : {k.start, k.size}) h = (h ^ v) * 0x100000001B3ull + (h >> 29);
            return static_cast<size_t>(h);
        }
    };
    static uint64_t bits(double v) {
        uint64_t u;
        std::memcpy(&u, &v, sizeof u);
        return u;
    }
    static constexpr size_t kMaxBytes = size_t{8} << 20;
    std::unordered_map<Key, AxisWeights, KeyHash> map_;
    size_t bytes_ = 0;
};

struct ResampleBuffers {
    std::vector<uint8_t> vpass, transposed, result, image;
    std::vector<int32_t> acc;
};

// ---------------------------------------------------------------- crop-resize

// Sample b of a crop-resize call: an H x W x C image at `data`, rows packed.
struct CropSource {
    const uint8_t* data;
    int64_t H, W;
};

struct CropOutput {
    bool chw;
    int64_t OH, OW;
};

// out's geometry and the boxes' shape for a batch of B crops of C-channel images.
CropOutput check_crop_output(const OutArray& out, bool chw, int64_t C, const Boxes& boxes, int64_t B) {
    int64_t OH = 0, OW = 0;
    std::tie(OH, OW) = check_image_out(out, chw, C);
    if (OH < 1 || OW < 1 || OH > (1 << 24) || OW > (1 << 24))
        throw ValueError("out has shape " + shape_of(out) + ": output height and width must be >= 1");
    if (boxes.rows != B || boxes.cols != 4)
        throw ValueError("boxes has shape " + shape_of(boxes) + "; expected (" + std::to_string(B) +
                         ", 4) as (top, left, height, width)");
    return {chw, OH, OW};
}

// Every box non-empty and inside its own sample's image.
void check_boxes(const Boxes& boxes, const std::vector<CropSource>& src) {
    const int32_t* bx = boxes.data;
    for (size_t b = 0; b < src.size(); ++b) {
        const int64_t t = bx[4 * b], l = bx[4 * b + 1], h = bx[4 * b + 2], w = bx[4 * b + 3];
        const std::string desc = "boxes[" + std::to_string(b) + "] = (" + std::to_string(t) + ", " +
                                 std::to_string(l) + ", " + std::to_string(h) + ", " + std::to_string(w) + ")";
        if (h < 1 || w < 1) throw ValueError(desc + " is empty: height and width must be >= 1");
        if (t < 0 || l < 0 || t + h > src[b].H || l + w > src[b].W)
            throw IndexError(desc + " (top, left, height, width) is not inside the " + std::to_string(src[b].H) +
                             "x" + std::to_string(src[b].W) + " source image");
    }
}

// One sample of the crop-resize rule: the h x w box at `box` (rows `stride` bytes
// apart) resized to OH x OW, flipped, written through luts into `dst`.
void crop_resize_box(const OutputLuts& luts, const uint8_t* box, int64_t stride, int64_t h, int64_t w, int64_t C,
                     int64_t OH, int64_t OW, bool chw, bool flip, ResampleBuffers& buf, AxisWeightsCache& weights,
                     uint8_t* dst) {
    const IsaKernels& K = luts.K;
    WriteSpec s;
    s.H = OH, s.W = OW, s.C = C, s.chw = chw, s.flip = flip;
    const uint8_t* img = box;  // the resized HWC image handed to the writer
    if (h == OH && w == OW) {
        // Both axes are identities under the rule (one tap of 2**14): read the box in place.
        s.row_stride = stride;
    } else {
        const auto [wv, wh] = weights.get(h, OH, w, OW);
        // Padding: transpose_pixels reads past the end of its source.
        buf.vpass.resize(OH * w * C + kTransposePad);
        buf.transposed.resize(OH * w * C);
        buf.result.resize(OW * OH * C + kTransposePad);
        buf.image.resize(OW * OH * C);
        buf.acc.resize(std::max(w, OH) * C);
        // Vertical pass over the box columns; transpose so that the horizontal
        // pass is the same contiguous row operation; transpose back.
        K.resample_rows(box, stride, *wv, w * C, buf.vpass.data(), buf.acc.data());
        K.transpose_pixels(buf.vpass.data(), OH, w, C, buf.transposed.data());
        K.resample_rows(buf.transposed.data(), OH * C, *wh, OH * C, buf.result.data(), buf.acc.data());
        K.transpose_pixels(buf.result.data(), OW, OH, C, buf.image.data());
        img = buf.image.data();
    }
    luts.write(img, s, dst);
}

// The checked batch: crop boxes[b] out of src[b], resize it to (OH, OW), write it through luts.
void run_crop_resize(const std::vector<CropSource>& src, int64_t C, const Boxes& boxes, const OutArray& out,
                     const CropOutput& o, const uint8_t* fl, const OutputLuts& luts) {
    const int64_t n = sample_elems(out), OH = o.OH, OW = o.OW;
    const int elem = luts.elem;
    const bool chw = o.chw;
    const int32_t* bx = boxes.data;
    auto* dst = static_cast<uint8_t*>(out.data);
    parallel_for(static_cast<int64_t>(src.size()), 1, [&](int64_t b0, int64_t b1) {
        thread_local ResampleBuffers buf;
        thread_local AxisWeightsCache weights;
        for (int64_t b = b0; b < b1; ++b) {
            const int64_t t = bx[4 * b], l = bx[4 * b + 1], h = bx[4 * b + 2], w = bx[4 * b + 3];
            const int64_t W = src[b].W;
            const uint8_t* box = src[b].data + (t * W + l) * C;
            crop_resize_box(luts, box, W * C, h, w, C, OH, OW, chw, fl && fl[b], buf, weights, dst + b * n * elem);
        }
    });
}

// ---------------------------------------------------------------- images of their own sizes

struct SampleImages {
    bool chw;
    int64_t B, C;
    std::vector<CropSource> src;
};

// The checked images of a per-sample call (one (H_b, W_b, C) uint8 image per output sample).
SampleImages check_sample_images(const SampleImagesBatch& batch) {
    const bool chw = parse_layout(batch.layout);
    const OutArray& out = batch.out;
    const int64_t B = static_cast<int64_t>(batch.images.size());
    if (out.ndim == 0 || out.shape[0] != B)
        throw ValueError("out has shape " + shape_of(out) + " but images has " + std::to_string(B) +
                         " entries: out's first dimension must equal len(images)");
    // Channels: the images' (all equal); with no image, whatever out says.
    int64_t C = out.ndim == 4 ? (chw ? out.shape[1] : out.shape[3]) : 3;
    std::vector<CropSource> src(B);
    for (int64_t b = 0; b < B; ++b) {
        const InArray& a = batch.images[b];
        const std::string name = "images[" + std::to_string(b) + "]";
        if (a.ndim != 3)
            throw ValueError(name + " has shape " + shape_of(a) + "; expected (H, W, C) uint8 with C in {1, 3}");
        if (!is(a.dtype, DTypeCode::UInt, 8)) throw TypeError(name + " has dtype " + dtype_name(a.dtype) + "; expected uint8");
        if (b == 0) C = a.shape[2];
        if (a.shape[2] != C)
            throw ValueError(name + " has shape " + shape_of(a) + " but images[0] has " + std::to_string(C) +
                             " channels: every image must have the same channel count");
        src[b] = CropSource{static_cast<const uint8_t*>(a.data), a.shape[0], a.shape[1]};
    }
    if (C != 1 && C != 3) throw ValueError("images have " + std::to_string(C) + " channels; expected 1 or 3");
    return {chw, B, C, std::move(src)};
}

void check_images_no_overlap(const SampleImagesBatch& batch, const std::vector<CropSource>& src) {
    const auto lo = reinterpret_cast<uintptr_t>(batch.out.data), hi = lo + batch.out.nbytes;
    for (size_t b = 0; b < src.size(); ++b) {
        const auto p = reinterpret_cast<uintptr_t>(src[b].data);
        if (lo < p + batch.images[b].nbytes && p < hi)
            throw ValueError("out overlaps images[" + std::to_string(b) + "] in memory");
    }
}

// Every window finite, non-empty and inside its own sample's image (the sums in float64).
void check_windows(const Windows& windows, const std::vector<CropSource>& src) {
    const double* wd = windows.data;
    for (size_t b = 0; b < src.size(); ++b) {
        const double t = wd[4 * b], l = wd[4 * b + 1], h = wd[4 * b + 2], w = wd[4 * b + 3];
        std::string desc = "windows[" + std::to_string(b) + "] = (";
        for (int k = 0; k < 4; ++k) {
            char num[32];
            std::snprintf(num, sizeof(num), "%.17g", wd[4 * b + k]);
            desc += (k ? ", " : "") + std::string(num);
        }
        desc += ")";
        if (!std::isfinite(t) || !std::isfinite(l) || !std::isfinite(h) || !std::isfinite(w))
            throw ValueError(desc + " is not finite");
        if (!(h > 0.0) || !(w > 0.0)) throw ValueError(desc + " is empty: height and width must be > 0");
        if (t < 0.0 || l < 0.0 || t + h > static_cast<double>(src[b].H) || l + w > static_cast<double>(src[b].W))
            throw IndexError(desc + " (top, left, height, width) is not inside the " + std::to_string(src[b].H) +
                             "x" + std::to_string(src[b].W) + " source image");
    }
}

// `w` with every window start moved by -origin (the taps then index a region that starts at origin).
void shift_weights(const AxisWeights& w, int64_t origin, AxisWeights& shifted) {
    shifted.taps = w.taps;
    shifted.coef = w.coef;
    shifted.start.resize(w.start.size());
    for (size_t o = 0; o < w.start.size(); ++o) shifted.start[o] = static_cast<int32_t>(w.start[o] - origin);
}

// First and one-past-last input position any output of `w` reads.
std::pair<int64_t, int64_t> weights_span(const AxisWeights& w) {
    int64_t lo = w.start[0], hi = w.start[0] + w.taps;
    for (const int32_t s : w.start) lo = std::min<int64_t>(lo, s), hi = std::max<int64_t>(hi, s + w.taps);
    return {lo, hi};
}

// One sample of the resize-crop rule: the packed rows x cols region at `region`
// (kTransposePad readable bytes past its end) resampled with weights local to the
// region, horizontal pass first, flipped, written through luts into `dst`.
void resize_crop_region(const OutputLuts& luts, const uint8_t* region, int64_t rows, int64_t cols, int64_t C,
                        const AxisWeights& wv_local, const AxisWeights& wh_local, int64_t OH, int64_t OW, bool chw,
                        bool flip, ResampleBuffers& buf, uint8_t* dst) {
    const IsaKernels& K = luts.K;
    buf.transposed.resize(cols * rows * C);
    buf.vpass.resize(OW * rows * C + kTransposePad);  // horizontal pass, transposed
    buf.result.resize(rows * OW * C);                  // horizontal pass
    buf.acc.resize(std::max(rows, OW) * C);
    // Horizontal pass as a row operation on the transposed region; transpose
    // back; the vertical pass gives the output rows.
    K.transpose_pixels(region, rows, cols, C, buf.transposed.data());
    K.resample_rows(buf.transposed.data(), rows * C, wh_local, rows * C, buf.vpass.data(), buf.acc.data());
    K.transpose_pixels(buf.vpass.data(), OW, rows, C, buf.result.data());
    thread_local std::vector<uint8_t> resized;
    resized.resize(OH * OW * C);
    K.resample_rows(buf.result.data(), OW * C, wv_local, OW * C, resized.data(), buf.acc.data());
    WriteSpec s;
    s.H = OH, s.W = OW, s.C = C, s.chw = chw, s.flip = flip;
    luts.write(resized.data(), s, dst);
}

// The checked batch: resize src[b] so that windows[b] becomes (OH, OW), horizontal
// pass first then vertical (Pillow's order), write it through luts.
void run_resize_crop(const std::vector<CropSource>& src, int64_t C, const Windows& windows, const OutArray& out,
                     const CropOutput& o, const uint8_t* fl, const OutputLuts& luts) {
    const int64_t n = sample_elems(out), OH = o.OH, OW = o.OW;
    const int elem = luts.elem;
    const bool chw = o.chw;
    const double* wd = windows.data;
    auto* dst = static_cast<uint8_t*>(out.data);
    parallel_for(static_cast<int64_t>(src.size()), 1, [&](int64_t b0, int64_t b1) {
        thread_local ResampleBuffers buf;
        thread_local WindowWeightsCache weights;
        thread_local AxisWeights wv_local, wh_local;
        for (int64_t b = b0; b < b1; ++b) {
            const int64_t H = src[b].H, W = src[b].W;
            const auto [pv, ph] = weights.get(H, wd[4 * b], wd[4 * b + 2], OH, W, wd[4 * b + 1], wd[4 * b + 3], OW);
            const AxisWeights &wv = *pv, &wh = *ph;
            // The region of the image the taps read: rows [r0, r1), columns [c0, c1).
            const auto [r0, r1] = weights_span(wv);
            const auto [c0, c1] = weights_span(wh);
            const int64_t rows = r1 - r0, cols = c1 - c0;
            shift_weights(wv, r0, wv_local);
            shift_weights(wh, c0, wh_local);
            // Padding: transpose_pixels reads past the end of its source.
            buf.image.resize(rows * cols * C + kTransposePad);  // the region, packed
            for (int64_t y = 0; y < rows; ++y)
                std::memcpy(buf.image.data() + y * cols * C, src[b].data + ((r0 + y) * W + c0) * C,
                            static_cast<size_t>(cols * C));
            resize_crop_region(luts, buf.image.data(), rows, cols, C, wv_local, wh_local, OH, OW, chw, fl && fl[b],
                               buf, dst + b * n * elem);
        }
    });
}

// ---------------------------------------------------------------- rows

// out_l[b] = row indices[b] of column l, for every column at once. Each column is
// one fixed-size leaf split over the same segments (shards), so the segment and
// local row of every index are found once and reused for all of them.
// `rows_api`: called as gather_rows (one column; errors name `out`, not `outs[0]`).
// Columns and outputs come as L-entry arrays, so that gather_rows copies nothing.
void run_gather_columns(const std::vector<InArray>* columns, const OutArray* outs, size_t L, const Indices& indices,
                        bool rows_api) {
    std::vector<Sources> S;
    S.reserve(L);
    for (size_t l = 0; l < L; ++l) {
        S.push_back(make_sources(columns[l], 2, "(N, rowbytes) uint8"));
        const std::string name = rows_api ? "out" : "outs[" + std::to_string(l) + "]";
        const OutArray& out = outs[l];
        check_batch(indices, out);
        check_u8_out(out);
        if (out.ndim != 2 || out.shape[1] != S[l].sample_bytes)
            throw ValueError(name + " has shape " + shape_of(out) + "; expected (" + std::to_string(indices.size) +
                             ", " + std::to_string(S[l].sample_bytes) + ")");
        if (l > 0 && S[l].end != S[0].end)
            throw ValueError("columns[" + std::to_string(l) +
                             "] is split into segments of other row counts than columns[0]: every "
                             "column must hold the same rows of the same segments");
    }
    for (size_t l = 0; l < L; ++l) {
        for (const Sources& src : S) check_no_overlap(src, outs[l]);
        const auto lo = reinterpret_cast<uintptr_t>(outs[l].data);
        for (size_t m = 0; m < l; ++m) {
            const auto mlo = reinterpret_cast<uintptr_t>(outs[m].data);
            if (outs[l].nbytes && outs[m].nbytes && lo < mlo + outs[m].nbytes && mlo < lo + outs[l].nbytes)
                throw ValueError("outs[" + std::to_string(l) + "] overlaps outs[" + std::to_string(m) + "] in memory");
        }
    }
    if (L == 0) return;
    // Rows as (segment, row within it); every column shares them.
    const Sources& S0 = S[0];
    const int64_t B = indices.size;
    const int64_t* idx = indices.data;
    std::vector<int32_t> seg(B);
    std::vector<int64_t> row(B);
    for (int64_t b = 0; b < B; ++b) {
        check_index(S0, b, idx[b], "rows");
        const auto [k, r] = S0.locate(idx[b]);
        seg[b] = static_cast<int32_t>(k);
        row[b] = r;
    }
    int64_t total_bytes = 0;
    for (const Sources& src : S) total_bytes += src.sample_bytes;
    // Small rows are copied in chunks of about 64 KiB per task; small batches run inline.
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(total_bytes, 1));
    parallel_for(B, grain, [&](int64_t b0, int64_t b1) {
        for (size_t l = 0; l < L; ++l) {
            const int64_t rb = S[l].sample_bytes;
            const uint8_t* const* base = S[l].base.data();
            auto* dst = static_cast<uint8_t*>(outs[l].data);
            // Fixed-size copies for the common scalar widths compile to single moves.
            auto copy = [&](auto width) {
                for (int64_t b = b0; b < b1; ++b)
                    std::memcpy(dst + b * rb, base[seg[b]] + row[b] * rb, static_cast<size_t>(width));
            };
            switch (rb) {
                case 1: copy(std::integral_constant<size_t, 1>{}); break;
                case 2: copy(std::integral_constant<size_t, 2>{}); break;
                case 4: copy(std::integral_constant<size_t, 4>{}); break;
                case 8: copy(std::integral_constant<size_t, 8>{}); break;
                default: copy(static_cast<size_t>(rb));
            }
        }
    });
}

// ---------------------------------------------------------------- JPEG: decode the region, then the rules

// The DCT scale denominator of a box or window of h x w for an OH x OW output: the
// largest k in (8, 4, 2, 1) with h >= k * OH and w >= k * OW (comparisons in float64).
int jpeg_scale_for(double h, double w, int64_t OH, int64_t OW) {
    for (const int k : {8, 4, 2}) {
        if (h >= static_cast<double>(k * OH) && w >= static_cast<double>(k * OW)) return k;
    }
    return 1;
}

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Box [start, start + size) of an axis of `full` pixels mapped onto the `dec` pixels of
// the scaled decode: start' = floor(start * dec / full), end' = ceil((start + size) *
// dec / full), at least one pixel, inside the image (tbl_loader.image.jpeg.scale_boxes).
std::pair<int64_t, int64_t> scale_span(int64_t start, int64_t size, int64_t full, int64_t dec) {
    int64_t lo = start * dec / full;
    int64_t hi = div_up((start + size) * dec, full);
    hi = std::min(std::max(hi, lo + 1), dec);
    lo = std::min(lo, hi - 1);
    return {lo, hi - lo};
}

// Window [start, start + size) of an axis of `full` pixels scaled onto `dec` pixels,
// float64: size * (dec / full) capped at dec, the start lowered by ulps until the
// window fits (tbl_loader.image.spec.fit_windows).
std::pair<double, double> scale_window(double start, double size, int64_t full, int64_t dec) {
    const double ratio = static_cast<double>(dec) / static_cast<double>(full);
    double s = start * ratio, z = size * ratio;
    const double side = static_cast<double>(dec);
    z = std::min(z, side);
    while (s + z > side) s = std::max(std::nextafter(s, 0.0), 0.0);
    return {s, z};
}

// The checked arguments of a JPEG batch call.
struct JpegInputs {
    bool chw;
    int64_t B;
    std::vector<const uint8_t*> data;
    std::vector<size_t> size;
    std::vector<CropSource> declared;  // data null; H, W = the declared sizes
};

JpegInputs check_jpeg_inputs(const JpegBatch& batch) {
    const bool chw = parse_layout(batch.layout);
    const int64_t B = static_cast<int64_t>(batch.buffers.size());
    const OutArray& out = batch.out;
    if (out.ndim == 0 || out.shape[0] != B)
        throw ValueError("out has shape " + shape_of(out) + " but buffers has " + std::to_string(B) +
                         " entries: out's first dimension must equal len(buffers)");
    if (batch.sizes.rows != B || batch.sizes.cols != 2) {
        const int64_t shape[2] = {batch.sizes.rows, batch.sizes.cols};
        throw ValueError("sizes has shape " + shape_str(shape, 2) + "; expected (" + std::to_string(B) +
                         ", 2) as (height, width)");
    }
    JpegInputs in{chw, B, {}, {}, {}};
    in.data.resize(B);
    in.size.resize(B);
    in.declared.resize(B);
    for (int64_t b = 0; b < B; ++b) {
        const InArray& a = batch.buffers[b];
        const std::string name = "buffers[" + std::to_string(b) + "]";
        if (a.ndim != 1) throw ValueError(name + " has shape " + shape_of(a) + "; expected 1-D uint8 JPEG bytes");
        if (!is(a.dtype, DTypeCode::UInt, 8))
            throw TypeError(name + " has dtype " + dtype_name(a.dtype) + "; expected uint8");
        const int64_t H = batch.sizes.data[2 * b], W = batch.sizes.data[2 * b + 1];
        if (H < 1 || W < 1 || H > 65535 || W > 65535)
            throw ValueError("sizes[" + std::to_string(b) + "] = (" + std::to_string(H) + ", " + std::to_string(W) +
                             ") is not a JPEG image size (1 to 65535 per side)");
        in.data[b] = static_cast<const uint8_t*>(a.data);
        in.size[b] = a.nbytes;
        in.declared[b] = CropSource{nullptr, H, W};
        const auto p = reinterpret_cast<uintptr_t>(a.data), lo = reinterpret_cast<uintptr_t>(out.data);
        if (a.nbytes && out.nbytes && lo < p + a.nbytes && p < lo + out.nbytes)
            throw ValueError("out overlaps " + name + " in memory");
    }
    return in;
}

// The lowest failing sample's error, if any (every sample was attempted, so the
// choice does not depend on the thread count).
void raise_first(const std::vector<JpegStatus>& status) {
    for (size_t b = 0; b < status.size(); ++b) {
        if (status[b].ok()) continue;
        throw JpegError("buffers[" + std::to_string(b) + "]: " + status[b].message, static_cast<int64_t>(b),
                        jpeg_failure_name(status[b].failure));
    }
}

void run_decode_crop_resize(const JpegBatch& batch, const Boxes& boxes) {
    const JpegInputs in = check_jpeg_inputs(batch);
    const int64_t C = 3;
    const CropOutput o = check_crop_output(batch.out, in.chw, C, boxes, in.B);
    const int elem = check_image_dtype(batch.table, batch.out, C);
    const uint8_t* fl = check_flip(batch.flip, in.B);
    check_boxes(boxes, in.declared);
    const OutputLuts luts(active_kernels(), batch.table, elem, C, batch.affine_hint);
    const int64_t n = sample_elems(batch.out), OH = o.OH, OW = o.OW;
    const int32_t* bx = boxes.data;
    auto* dst = static_cast<uint8_t*>(batch.out.data);
    std::vector<JpegStatus> status(in.B);
    parallel_for(in.B, 1, [&](int64_t b0, int64_t b1) {
        thread_local ResampleBuffers buf;
        thread_local AxisWeightsCache weights;
        thread_local JpegScratch scratch;
        for (int64_t b = b0; b < b1; ++b) {
            const int64_t H = in.declared[b].H, W = in.declared[b].W;
            const int k = jpeg_scale_for(bx[4 * b + 2], bx[4 * b + 3], OH, OW);
            const int64_t Hd = div_up(H, k), Wd = div_up(W, k);
            const auto [t, h] = scale_span(bx[4 * b], bx[4 * b + 2], H, Hd);
            const auto [l, w] = scale_span(bx[4 * b + 1], bx[4 * b + 3], W, Wd);
            JpegRegionRequest req;
            req.height = H, req.width = W, req.scale = k, req.fast_idct = batch.fast_idct;
            req.r0 = t, req.r1 = t + h, req.c0 = l, req.c1 = l + w;
            req.pad = kTransposePad;
            JpegRegion region;
            status[b] = decode_jpeg_region(in.data[b], in.size[b], req, scratch, region);
            if (!status[b].ok()) continue;
            const uint8_t* box = region.data + (l - region.x0) * C;
            crop_resize_box(luts, box, region.stride, h, w, C, OH, OW, o.chw, fl && fl[b], buf, weights,
                            dst + b * n * elem);
        }
    });
    raise_first(status);
}

void run_decode_resize_crop(const JpegBatch& batch, const Windows& windows) {
    const JpegInputs in = check_jpeg_inputs(batch);
    const int64_t C = 3;
    if (windows.rows != in.B || windows.cols != 4) {
        const int64_t shape[2] = {windows.rows, windows.cols};
        throw ValueError("windows has shape " + shape_str(shape, 2) + "; expected (" + std::to_string(in.B) +
                         ", 4) as (top, left, height, width)");
    }
    const Boxes no_boxes{nullptr, in.B, 4};  // the output checks only; windows are checked below
    const CropOutput o = check_crop_output(batch.out, in.chw, C, no_boxes, in.B);
    const int elem = check_image_dtype(batch.table, batch.out, C);
    const uint8_t* fl = check_flip(batch.flip, in.B);
    check_windows(windows, in.declared);
    const OutputLuts luts(active_kernels(), batch.table, elem, C, batch.affine_hint);
    const int64_t n = sample_elems(batch.out), OH = o.OH, OW = o.OW;
    const double* wd = windows.data;
    auto* dst = static_cast<uint8_t*>(batch.out.data);
    std::vector<JpegStatus> status(in.B);
    parallel_for(in.B, 1, [&](int64_t b0, int64_t b1) {
        thread_local ResampleBuffers buf;
        thread_local WindowWeightsCache weights;
        thread_local AxisWeights wv_local, wh_local;
        thread_local JpegScratch scratch;
        for (int64_t b = b0; b < b1; ++b) {
            const int64_t H = in.declared[b].H, W = in.declared[b].W;
            const int k = jpeg_scale_for(wd[4 * b + 2], wd[4 * b + 3], OH, OW);
            const int64_t Hd = div_up(H, k), Wd = div_up(W, k);
            const auto [wt, wh_] = scale_window(wd[4 * b], wd[4 * b + 2], H, Hd);
            const auto [wl, ww] = scale_window(wd[4 * b + 1], wd[4 * b + 3], W, Wd);
            const auto [pv, ph] = weights.get(Hd, wt, wh_, OH, Wd, wl, ww, OW);
            const AxisWeights &wv = *pv, &wh = *ph;
            const auto [r0, r1] = weights_span(wv);
            const auto [c0, c1] = weights_span(wh);
            JpegRegionRequest req;
            req.height = H, req.width = W, req.scale = k, req.fast_idct = batch.fast_idct;
            req.r0 = r0, req.r1 = r1, req.c0 = c0, req.c1 = c1;
            req.pad = kTransposePad;
            JpegRegion region;
            status[b] = decode_jpeg_region(in.data[b], in.size[b], req, scratch, region);
            if (!status[b].ok()) continue;
            shift_weights(wv, r0, wv_local);
            shift_weights(wh, region.x0, wh_local);
            resize_crop_region(luts, region.data, r1 - r0, region.stride / C, C, wv_local, wh_local, OH, OW, o.chw,
                               fl && fl[b], buf, dst + b * n * elem);
        }
    });
    raise_first(status);
}

}  // namespace

void gather_images(const ImageBatch& batch) {
    const bool chw = parse_layout(batch.layout);
    const Sources S = image_sources(batch.sources);
    const int64_t H = S.sample_shape[0], W = S.sample_shape[1], C = S.sample_shape[2];
    const OutArray& out = batch.out;
    check_batch(batch.indices, out);
    const auto [oh, ow] = check_image_out(out, chw, C);
    if (oh != H || ow != W)
        throw ValueError("out has shape " + shape_of(out) + " but the source images are " + std::to_string(H) + "x" +
                         std::to_string(W) + "x" + std::to_string(C));
    const int elem = check_image_dtype(batch.table, out, C);
    const uint8_t* fl = check_flip(batch.flip, batch.indices.size);
    check_no_overlap(S, out);
    const std::vector<const uint8_t*> ptrs = resolve(S, batch.indices);

    const IsaKernels& K = active_kernels();
    const int64_t n = sample_elems(out);
    auto* dst = static_cast<uint8_t*>(out.data);
    const OutputLuts luts(K, batch.table, elem, C, batch.affine_hint);
    parallel_for(static_cast<int64_t>(ptrs.size()), 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; ++b) {
            WriteSpec s;
            s.H = H, s.W = W, s.C = C, s.chw = chw, s.flip = fl && fl[b];
            luts.write(ptrs[b], s, dst + b * n * elem);
        }
    });
}

void gather_crop_resize(const ImageBatch& batch, const Boxes& boxes) {
    const bool chw = parse_layout(batch.layout);
    const Sources S = image_sources(batch.sources);
    const int64_t H = S.sample_shape[0], W = S.sample_shape[1], C = S.sample_shape[2];
    check_batch(batch.indices, batch.out);
    const CropOutput o = check_crop_output(batch.out, chw, C, boxes, batch.indices.size);
    const int elem = check_image_dtype(batch.table, batch.out, C);
    const uint8_t* fl = check_flip(batch.flip, batch.indices.size);
    std::vector<CropSource> src(batch.indices.size, CropSource{nullptr, H, W});
    check_boxes(boxes, src);
    check_no_overlap(S, batch.out);
    const std::vector<const uint8_t*> ptrs = resolve(S, batch.indices);
    for (size_t b = 0; b < src.size(); ++b) src[b].data = ptrs[b];
    const OutputLuts luts(active_kernels(), batch.table, elem, C, batch.affine_hint);
    run_crop_resize(src, C, boxes, batch.out, o, fl, luts);
}

void crop_resize_images(const SampleImagesBatch& batch, const Boxes& boxes) {
    const SampleImages in = check_sample_images(batch);
    const CropOutput o = check_crop_output(batch.out, in.chw, in.C, boxes, in.B);
    const int elem = check_image_dtype(batch.table, batch.out, in.C);
    const uint8_t* fl = check_flip(batch.flip, in.B);
    check_boxes(boxes, in.src);
    check_images_no_overlap(batch, in.src);
    const OutputLuts luts(active_kernels(), batch.table, elem, in.C, batch.affine_hint);
    run_crop_resize(in.src, in.C, boxes, batch.out, o, fl, luts);
}

void resize_crop_images(const SampleImagesBatch& batch, const Windows& windows) {
    const SampleImages in = check_sample_images(batch);
    if (windows.rows != in.B || windows.cols != 4) {
        const int64_t shape[2] = {windows.rows, windows.cols};
        throw ValueError("windows has shape " + shape_str(shape, 2) + "; expected (" + std::to_string(in.B) +
                         ", 4) as (top, left, height, width)");
    }
    const Boxes no_boxes{nullptr, in.B, 4};  // the output checks only; windows were checked above
    const CropOutput o = check_crop_output(batch.out, in.chw, in.C, no_boxes, in.B);
    const int elem = check_image_dtype(batch.table, batch.out, in.C);
    const uint8_t* fl = check_flip(batch.flip, in.B);
    check_windows(windows, in.src);
    check_images_no_overlap(batch, in.src);
    const OutputLuts luts(active_kernels(), batch.table, elem, in.C, batch.affine_hint);
    run_resize_crop(in.src, in.C, windows, batch.out, o, fl, luts);
}

void gather_columns(const std::vector<std::vector<InArray>>& columns, const Indices& indices,
                    const std::vector<OutArray>& outs) {
    if (columns.size() != outs.size())
        throw ValueError("columns has " + std::to_string(columns.size()) + " entries but outs has " +
                         std::to_string(outs.size()) + ": one output per column");
    run_gather_columns(columns.data(), outs.data(), columns.size(), indices, false);
}

void gather_rows(const std::vector<InArray>& sources, const Indices& indices, const OutArray& out) {
    run_gather_columns(&sources, &out, 1, indices, true);
}

void decode_crop_resize_jpegs(const JpegBatch& batch, const Boxes& boxes) { run_decode_crop_resize(batch, boxes); }

void decode_resize_crop_jpegs(const JpegBatch& batch, const Windows& windows) {
    run_decode_resize_crop(batch, windows);
}

void decode_jpeg_region_into(const InArray& buffer, int64_t height, int64_t width, int scale, bool fast_idct,
                             const int64_t region[4], const OutArray& out) {
    if (buffer.ndim != 1 || !is(buffer.dtype, DTypeCode::UInt, 8))
        throw TypeError("buffer must be 1-D uint8 JPEG bytes, got " + dtype_name(buffer.dtype) + " " + shape_of(buffer));
    if (scale != 1 && scale != 2 && scale != 4 && scale != 8)
        throw ValueError("scale must be 1, 2, 4 or 8, got " + std::to_string(scale));
    if (height < 1 || width < 1 || height > 65535 || width > 65535)
        throw ValueError("size (" + std::to_string(height) + ", " + std::to_string(width) +
                         ") is not a JPEG image size (1 to 65535 per side)");
    const int64_t Hd = div_up(height, scale), Wd = div_up(width, scale);
    const int64_t t = region[0], l = region[1], h = region[2], w = region[3];
    if (h < 1 || w < 1 || t < 0 || l < 0 || t + h > Hd || l + w > Wd)
        throw IndexError("region (" + std::to_string(t) + ", " + std::to_string(l) + ", " + std::to_string(h) + ", " +
                         std::to_string(w) + ") is not inside the " + std::to_string(Hd) + "x" + std::to_string(Wd) +
                         " image decoded at DCT scale 1/" + std::to_string(scale));
    check_u8_out(out);
    if (out.ndim != 3 || out.shape[0] != h || out.shape[1] != w || out.shape[2] != 3)
        throw ValueError("out has shape " + shape_of(out) + "; expected (" + std::to_string(h) + ", " +
                         std::to_string(w) + ", 3)");
    JpegRegionRequest req;
    req.height = height, req.width = width, req.scale = scale, req.fast_idct = fast_idct;
    req.r0 = t, req.r1 = t + h, req.c0 = l, req.c1 = l + w;
    JpegScratch scratch;
    JpegRegion reg;
    const JpegStatus st = decode_jpeg_region(static_cast<const uint8_t*>(buffer.data), buffer.nbytes, req, scratch, reg);
    if (!st.ok()) throw JpegError(st.message, 0, jpeg_failure_name(st.failure));
    auto* dst = static_cast<uint8_t*>(out.data);
    for (int64_t y = 0; y < h; ++y)
        std::memcpy(dst + y * w * 3, reg.data + y * reg.stride + (l - reg.x0) * 3, static_cast<size_t>(w * 3));
}

}  // namespace tbl
