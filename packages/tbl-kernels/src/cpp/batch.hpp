// Batch orchestration of the kernels over plain array descriptions: argument
// checks, lookup of samples across the source segments, the two-pass
// crop-resize driver and the per-column row gather.
//
// Nothing here depends on Python. The binding describes its arrays with the
// structs below (pointers into memory it keeps alive for the call) and turns the
// tbl::Error kinds thrown here (errors.hpp) into Python exceptions. Every check
// runs before the first byte of any output is written; the batch itself runs on
// the shared thread pool (thread_pool.hpp) with the active SIMD level.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tbl {

// Element type of an array, as far as the kernels tell types apart.
enum class DTypeCode : uint8_t { Int, UInt, Float, Bfloat, Complex, Bool, Other };

struct DType {
    DTypeCode code = DTypeCode::Other;
    int bits = 0;
    int lanes = 1;
};

// A C-contiguous CPU array of any element type: `ndim` extents at `shape`,
// `nbytes` bytes at `data`. Not owned.
template <typename T>
struct ArrayRef {
    T* data = nullptr;
    size_t ndim = 0;
    const int64_t* shape = nullptr;
    DType dtype;
    size_t nbytes = 0;
};
using InArray = ArrayRef<const void>;
using OutArray = ArrayRef<void>;

// Global sample (or row) indices into the concatenated sources, int64 (size,).
struct Indices {
    const int64_t* data = nullptr;
    int64_t size = 0;
};

// int32 (rows, cols) boxes; each row is (top, left, height, width) when cols == 4.
struct Boxes {
    const int32_t* data = nullptr;
    int64_t rows = 0;
    int64_t cols = 0;
};

// float64 (rows, cols) windows; each row is (top, left, height, width) in source
// pixels, fractional allowed, when cols == 4.
struct Windows {
    const double* data = nullptr;
    int64_t rows = 0;
    int64_t cols = 0;
};

// One image call: out[b] = sources-concatenation[indices[b]], optionally flipped,
// in `layout` ("CHW" or "HWC"), mapped through `table` or copied as uint8.
struct ImageBatch {
    std::vector<InArray> sources;  // (N_k, H, W, C) uint8, C in {1, 3}
    Indices indices;
    OutArray out;                  // (B, C, OH, OW) or (B, OH, OW, C)
    const InArray* table = nullptr;  // (C, 256) float32 / float16 / uint16 (bfloat16 bits); null: uint8 out
    const InArray* flip = nullptr;   // uint8 or bool (B,); null: no flips
    std::string layout;
    // [a_0..a_C-1, b_0..b_C-1] with table ~= v * a + b, or null. Used only if the
    // active level reproduces every entry of the table with it.
    const std::vector<double>* affine_hint = nullptr;
};

// One crop-resize call over images of their own sizes: images[b] ((H_b, W_b, C)
// uint8, C in {1, 3}, the same for all) is sample b. Output, table, flip, layout
// and hint as in ImageBatch.
struct SampleImagesBatch {
    std::vector<InArray> images;
    OutArray out;
    const InArray* table = nullptr;
    const InArray* flip = nullptr;
    std::string layout;
    const std::vector<double>* affine_hint = nullptr;
};

// Same-size gather (out's height and width are the sources').
void gather_images(const ImageBatch& batch);

// Crop boxes[b] out of sample indices[b] and resize it to out's height and width
// (the rule is in README.md, "Crop-resize rule").
void gather_crop_resize(const ImageBatch& batch, const Boxes& boxes);

// Crop boxes[b] out of images[b] (inside its own height and width) and resize it
// to out's height and width, by the same rule as gather_crop_resize.
void crop_resize_images(const SampleImagesBatch& batch, const Boxes& boxes);

// Resize images[b] so that windows[b] maps onto out's height and width, taps
// clamped to the whole image (the rule is in README.md, "Resize-crop rule"):
// resizing the whole image and then cropping, computed for the crop only.
void resize_crop_images(const SampleImagesBatch& batch, const Windows& windows);

// outs[l][b] = row indices[b] of the concatenated segments columns[l] (uint8
// (N_k, rowbytes_l)); every column is split into segments of the same row counts.
void gather_columns(const std::vector<std::vector<InArray>>& columns, const Indices& indices,
                    const std::vector<OutArray>& outs);

// gather_columns of one column; its errors name `out` instead of `outs[0]`.
void gather_rows(const std::vector<InArray>& sources, const Indices& indices, const OutArray& out);

// One JPEG batch call: buffers[b] (1-D uint8, the encoded bytes) is sample b,
// declared (height, width) = sizes[b]; decoded as RGB (greyscale expanded).
// Output, table, flip, layout and hint as in ImageBatch (3 channels).
struct JpegSizes {
    const int64_t* data = nullptr;
    int64_t rows = 0;
    int64_t cols = 0;
};
struct JpegBatch {
    std::vector<InArray> buffers;
    JpegSizes sizes;
    OutArray out;
    const InArray* table = nullptr;
    const InArray* flip = nullptr;
    std::string layout;
    const std::vector<double>* affine_hint = nullptr;
    bool fast_idct = false;
};

// Decode, at the DCT scale boxes[b] allows, only the part of buffers[b] that
// boxes[b] (in declared pixels) covers, then crop-resize it as crop_resize_images
// does (rules in README.md, "JPEG decode"). Every argument is checked before any
// decode; a JPEG that cannot be served raises JpegError naming the lowest such b
// after the pass (out's other samples are then written, that one's are not).
void decode_crop_resize_jpegs(const JpegBatch& batch, const Boxes& boxes);

// The same with float64 windows and the resize-crop rule (resize_crop_images).
void decode_resize_crop_jpegs(const JpegBatch& batch, const Windows& windows);

// region (top, left, height, width) of `buffer` decoded at DCT scale 1/scale into
// out ((height, width, 3) uint8), through the same decode as the batch calls.
void decode_jpeg_region_into(const InArray& buffer, int64_t height, int64_t width, int scale, bool fast_idct,
                             const int64_t region[4], const OutArray& out);

}  // namespace tbl
