// Region-of-interest JPEG decoding through libjpeg-turbo's libjpeg API.
//
// One JPEG at a time, on the calling thread: read the frame header, refuse a size
// that is not the declared one before the decoder allocates anything, decode at
// DCT scale 1/scale (scale in 1, 2, 4, 8), decode only the MCU columns
// (jpeg_crop_scanline) and rows (jpeg_skip_scanlines, then stop reading) that a
// region of the scaled image needs, into a caller-owned scratch buffer, as RGB.
//
// libjpeg reports errors through longjmp; everything that can jump lives in
// jpeg_decode.cpp, in frames without C++ objects, and comes back as a
// JpegStatus. Every libjpeg warning (corrupt data it would fill in) is an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tbl {

// Why a JPEG was refused (JpegError::kind, by name in Python).
enum class JpegFailure : int {
    None = 0,
    Size = 1,         // the frame header's size is not the declared one
    Unsupported = 2,  // not 8-bit greyscale or 3-component colour (CMYK, YCCK, 12-bit, ...)
    Corrupt = 3,      // libjpeg's error or warning, or a limit of this decoder (too many scans)
};

const char* jpeg_failure_name(JpegFailure f);

struct JpegStatus {
    JpegFailure failure = JpegFailure::None;
    std::string message;
    bool ok() const { return failure == JpegFailure::None; }
};

// Malloc-backed scratch that keeps its capacity (one per thread).
struct JpegScratch {
    uint8_t* data = nullptr;
    size_t capacity = 0;
    JpegScratch() = default;
    JpegScratch(const JpegScratch&) = delete;
    JpegScratch& operator=(const JpegScratch&) = delete;
    ~JpegScratch();
    bool reserve(size_t bytes);  // false when the allocation fails
};

struct JpegRegionRequest {
    int64_t height = 0, width = 0;  // declared size of the stored image
    int scale = 1;                  // DCT scale denominator: 1, 2, 4 or 8
    bool fast_idct = false;         // JDCT_IFAST instead of JDCT_ISLOW
    // Region of the scaled image ((ceil(height / scale), ceil(width / scale))): rows [r0, r1), columns [c0, c1).
    int64_t r0 = 0, r1 = 0, c0 = 0, c1 = 0;
    size_t pad = 0;  // readable bytes the caller needs past the region's last row
};

// Where the decoded region landed: rows r0 .. r1 - 1 of the scaled image at
// data + (r - r0) * stride, column x (c0 <= x < c1) at byte (x - x0) * 3 of its row.
// The decoded columns [x0, x0 + stride / 3) cover [c0, c1), widened to whole iMCU
// columns (and by one pixel on each side for the chroma upsampling, see the .cpp).
struct JpegRegion {
    const uint8_t* data = nullptr;
    int64_t stride = 0;
    int64_t x0 = 0;
};

// Decode req's region of `size` bytes at `bytes` into `scratch`.
JpegStatus decode_jpeg_region(const uint8_t* bytes, size_t size, const JpegRegionRequest& req, JpegScratch& scratch,
                              JpegRegion& region);

struct JpegHeaderInfo {
    int64_t height = 0, width = 0;
    int components = 0;
    int precision = 0;
    bool progressive = false;
    int colorspace = 0;  // libjpeg's J_COLOR_SPACE of the stored data
};

// The frame header of `bytes` (libjpeg's jpeg_read_header; nothing decoded).
JpegStatus read_jpeg_header(const uint8_t* bytes, size_t size, JpegHeaderInfo& info);

// The libjpeg-turbo release the kernels were built against ("2.1.5").
const char* jpeg_library_version();

// Scans a progressive JPEG may have before it is refused (each one is a pass over the whole image).
constexpr int kMaxJpegScans = 500;

}  // namespace tbl
