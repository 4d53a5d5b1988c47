#include "jpeg_decode.hpp"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// jpeglib.h needs size_t and FILE declared first.
extern "C" {
#include <jpeglib.h>
#include <jerror.h>
}

namespace tbl {
namespace {

// Chroma upsampling ("fancy", triangular) computes an edge pixel of a cropped
// decode from the edge's own chroma sample instead of its neighbour outside the
// crop. One more decoded pixel on each side of the region keeps every pixel of
// the region equal to the same pixel of a whole-image decode (tested against it).
constexpr int64_t kColumnMargin = 1;
// And a crop at least this wide (libjpeg's fancy upsampling needs a component of
// 3 samples or more: 6 pixels at 2x horizontal subsampling).
constexpr int64_t kMinCropColumns = 6;

struct ErrorState {
    jpeg_error_mgr pub;  // first: libjpeg's callbacks receive a pointer to it
    std::jmp_buf jump;
    int failure;
    char message[JMSG_LENGTH_MAX + 96];
};

[[noreturn]] void fail(j_common_ptr cinfo, int failure) {
    auto* e = reinterpret_cast<ErrorState*>(cinfo->err);
    e->failure = failure;
    std::longjmp(e->jump, 1);
}

// libjpeg's fatal errors: the message, then back to the setjmp.
[[noreturn]] void on_error(j_common_ptr cinfo) {
    auto* e = reinterpret_cast<ErrorState*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, e->message);
    const int code = cinfo->err->msg_code;
    const bool unsupported = code == JERR_BAD_PRECISION || code == JERR_CONVERSION_NOTIMPL;
    fail(cinfo, static_cast<int>(unsupported ? JpegFailure::Unsupported : JpegFailure::Corrupt));
}

// Warnings (level -1) are corrupt data that libjpeg would fill in (grey blocks, a
// fake end of image): refused like errors. Trace messages (level >= 0) are dropped.
void on_message(j_common_ptr cinfo, int level) {
    if (level >= 0) return;
    auto* e = reinterpret_cast<ErrorState*>(cinfo->err);
    (*cinfo->err->format_message)(cinfo, e->message);
    fail(cinfo, static_cast<int>(JpegFailure::Corrupt));
}

void no_output(j_common_ptr) {}

// A progressive JPEG of very many scans costs one pass over the image each: refused past kMaxJpegScans.
void on_progress(j_common_ptr cinfo) {
    if (!cinfo->is_decompressor) return;
    const auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
    if (d->input_scan_number > kMaxJpegScans) {
        auto* e = reinterpret_cast<ErrorState*>(cinfo->err);
        std::snprintf(e->message, sizeof(e->message), "more than %d scans (the most this decoder reads)",
                      kMaxJpegScans);
        fail(cinfo, static_cast<int>(JpegFailure::Corrupt));
    }
}

void init_error(ErrorState& e) {
    jpeg_std_error(&e.pub);
    e.pub.error_exit = on_error;
    e.pub.emit_message = on_message;
    e.pub.output_message = no_output;
    e.failure = 0;
    e.message[0] = '\0';
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// An EOI marker (0xFF 0xD9) among n bytes at p, looked for from the end (where it usually is).
bool has_end_marker(const uint8_t* p, size_t n) {
    for (size_t i = n; i >= 2; --i)
        if (p[i - 1] == 0xD9 && p[i - 2] == 0xFF) return true;
    return false;
}

// The setjmp frame: only plain C data lives here, so a longjmp skips no destructor.
// Returns a JpegFailure; e.message says why.
int decode_region_c(const uint8_t* bytes, size_t size, const JpegRegionRequest* req, JpegScratch* scratch,
                    JpegRegion* region, ErrorState* e, JpegHeaderInfo* header_only) {
    jpeg_decompress_struct cinfo;
    jpeg_progress_mgr progress;
    cinfo.err = &e->pub;
    if (setjmp(e->jump)) {
        jpeg_destroy_decompress(&cinfo);
        return e->failure;
    }
    jpeg_create_decompress(&cinfo);
    progress.progress_monitor = on_progress;
    cinfo.progress = &progress;
    jpeg_mem_src(&cinfo, bytes, static_cast<unsigned long>(size));
    jpeg_read_header(&cinfo, TRUE);
    if (header_only) {
        header_only->height = cinfo.image_height;
        header_only->width = cinfo.image_width;
        header_only->components = cinfo.num_components;
        header_only->precision = cinfo.data_precision;
        header_only->progressive = cinfo.progressive_mode != 0;
        header_only->colorspace = static_cast<int>(cinfo.jpeg_color_space);
        jpeg_destroy_decompress(&cinfo);
        return 0;
    }
    // The declared size first: nothing image-sized has been allocated yet.
    if (static_cast<int64_t>(cinfo.image_height) != req->height ||
        static_cast<int64_t>(cinfo.image_width) != req->width) {
        std::snprintf(e->message, sizeof(e->message), "the JPEG header says %u x %u, the declared size is %lld x %lld",
                      cinfo.image_height, cinfo.image_width, static_cast<long long>(req->height),
                      static_cast<long long>(req->width));
        jpeg_destroy_decompress(&cinfo);
        return static_cast<int>(JpegFailure::Size);
    }
    // The rows below the region are never read, so a file cut short there would go unnoticed: its
    // end-of-image marker is looked for instead (it cannot occur inside entropy-coded data, where every
    // 0xFF byte is followed by 0x00 or a restart marker).
    {
        const size_t scan = static_cast<size_t>(cinfo.src->next_input_byte - bytes);
        if (!has_end_marker(bytes + scan, size - scan)) {
            std::snprintf(e->message, sizeof(e->message),
                          "no end-of-image marker after the scan data: the JPEG is truncated");
            jpeg_destroy_decompress(&cinfo);
            return static_cast<int>(JpegFailure::Corrupt);
        }
    }
    const bool grey = cinfo.num_components == 1 && cinfo.jpeg_color_space == JCS_GRAYSCALE;
    const bool colour = cinfo.num_components == 3 &&
                        (cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_RGB);
    if (!grey && !colour) {
        const char* what = cinfo.num_components == 4
                               ? (cinfo.jpeg_color_space == JCS_YCCK ? " (YCCK)" : " (CMYK)")
                               : "";
        std::snprintf(e->message, sizeof(e->message),
                      "%d colour components%s (greyscale or 3-component colour is served)", cinfo.num_components,
                      what);
        jpeg_destroy_decompress(&cinfo);
        return static_cast<int>(JpegFailure::Unsupported);
    }
    cinfo.out_color_space = JCS_RGB;
    cinfo.scale_num = 1;
    cinfo.scale_denom = static_cast<unsigned int>(req->scale);
    cinfo.dct_method = req->fast_idct ? JDCT_IFAST : JDCT_ISLOW;
    cinfo.do_fancy_upsampling = TRUE;
    cinfo.do_block_smoothing = TRUE;  // libjpeg's default: progressive images before their last scan
    jpeg_start_decompress(&cinfo);
    const int64_t Hd = ceil_div(req->height, req->scale), Wd = ceil_div(req->width, req->scale);
    if (static_cast<int64_t>(cinfo.output_height) != Hd || static_cast<int64_t>(cinfo.output_width) != Wd ||
        cinfo.output_components != 3) {
        std::snprintf(e->message, sizeof(e->message), "libjpeg decodes to %u x %u x %d at DCT scale 1/%d, not %lld x %lld x 3",
                      cinfo.output_height, cinfo.output_width, cinfo.output_components, req->scale,
                      static_cast<long long>(Hd), static_cast<long long>(Wd));
        jpeg_destroy_decompress(&cinfo);
        return static_cast<int>(JpegFailure::Corrupt);
    }
    JDIMENSION x0 = 0, cols = static_cast<JDIMENSION>(Wd);
    {
        int64_t a = req->c0 > kColumnMargin ? req->c0 - kColumnMargin : 0;
        int64_t b = req->c1 + kColumnMargin < Wd ? req->c1 + kColumnMargin : Wd;
        // libjpeg upsamples chroma "fancily" only where a component is more than 2 samples wide: a narrower
        // crop would switch to the plain upsampler and change its pixels.
        if (b - a < kMinCropColumns) {
            b = a + kMinCropColumns < Wd ? a + kMinCropColumns : Wd;
            a = b > kMinCropColumns ? b - kMinCropColumns : 0;
        }
        if (a > 0 || b < Wd) {
            x0 = static_cast<JDIMENSION>(a);
            cols = static_cast<JDIMENSION>(b - a);
            jpeg_crop_scanline(&cinfo, &x0, &cols);  // x0 down to an iMCU boundary, cols widened to match
        }
    }
    const int64_t stride = static_cast<int64_t>(cinfo.output_width) * 3;
    const int64_t rows = req->r1 - req->r0;
    if (!scratch->reserve(static_cast<size_t>(rows * stride) + req->pad)) {
        std::snprintf(e->message, sizeof(e->message), "cannot allocate %lld bytes for the decoded region",
                      static_cast<long long>(rows * stride));
        jpeg_destroy_decompress(&cinfo);
        return static_cast<int>(JpegFailure::Corrupt);
    }
    if (req->r0 > 0) {
        const JDIMENSION skipped = jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(req->r0));
        if (static_cast<int64_t>(skipped) != req->r0) {
            std::snprintf(e->message, sizeof(e->message), "skipped %u rows of %lld", skipped,
                          static_cast<long long>(req->r0));
            jpeg_destroy_decompress(&cinfo);
            return static_cast<int>(JpegFailure::Corrupt);
        }
    }
    uint8_t* base = scratch->data;
    while (static_cast<int64_t>(cinfo.output_scanline) < req->r1) {
        JSAMPROW ptrs[16];
        const int64_t at = static_cast<int64_t>(cinfo.output_scanline) - req->r0;
        int64_t n = req->r1 - static_cast<int64_t>(cinfo.output_scanline);
        if (n > 16) n = 16;
        for (int64_t i = 0; i < n; ++i) ptrs[i] = base + (at + i) * stride;
        if (jpeg_read_scanlines(&cinfo, ptrs, static_cast<JDIMENSION>(n)) == 0) {
            std::snprintf(e->message, sizeof(e->message), "the data ends at row %u", cinfo.output_scanline);
            jpeg_destroy_decompress(&cinfo);
            return static_cast<int>(JpegFailure::Corrupt);
        }
    }
    // Rows below the region are never read: the entropy-coded data after them is not looked at.
    jpeg_destroy_decompress(&cinfo);
    region->data = base;
    region->stride = stride;
    region->x0 = static_cast<int64_t>(x0);
    return 0;
}

JpegStatus status_of(int failure, const ErrorState& e) {
    JpegStatus s;
    s.failure = static_cast<JpegFailure>(failure);
    if (failure) s.message = e.message;
    return s;
}

}  // namespace

const char* jpeg_failure_name(JpegFailure f) {
    switch (f) {
        case JpegFailure::None: return "none";
        case JpegFailure::Size: return "size";
        case JpegFailure::Unsupported: return "unsupported";
        case JpegFailure::Corrupt: return "corrupt";
    }
    return "corrupt";
}

JpegScratch::~JpegScratch() { std::free(data); }

bool JpegScratch::reserve(size_t bytes) {
    if (bytes <= capacity) return true;
    void* p = std::realloc(data, bytes);
    if (p == nullptr) return false;
    data = static_cast<uint8_t*>(p);
    capacity = bytes;
    return true;
}

JpegStatus decode_jpeg_region(const uint8_t* bytes, size_t size, const JpegRegionRequest& req, JpegScratch& scratch,
                              JpegRegion& region) {
    ErrorState e;
    init_error(e);
    const int failure = decode_region_c(bytes, size, &req, &scratch, &region, &e, nullptr);
    return status_of(failure, e);
}

JpegStatus read_jpeg_header(const uint8_t* bytes, size_t size, JpegHeaderInfo& info) {
    ErrorState e;
    init_error(e);
    const int failure = decode_region_c(bytes, size, nullptr, nullptr, nullptr, &e, &info);
    return status_of(failure, e);
}

#define TBL_STR2(x) #x
#define TBL_STR(x) TBL_STR2(x)
const char* jpeg_library_version() {
#ifdef LIBJPEG_TURBO_VERSION
    return TBL_STR(LIBJPEG_TURBO_VERSION);
#else
    return "unknown";
#endif
}

}  // namespace tbl
