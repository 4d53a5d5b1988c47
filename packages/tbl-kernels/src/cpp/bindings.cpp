// nanobind module tbl_kernels._core: describes the argument arrays to the batch
// code (batch.hpp) and turns its error kinds (errors.hpp) into Python exceptions.
//
// Each kernel runs with the GIL released, checks included. Arrays are taken with
// noconvert(): a wrong dtype, a non-contiguous array or a non-CPU tensor raises
// TypeError instead of being copied behind the caller's back.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "batch.hpp"
#include "dispatch.hpp"
#include "errors.hpp"
#include "jpeg_decode.hpp"
#include "pillow_resize.hpp"
#include "thread_pool.hpp"

namespace nb = nanobind;

namespace tbl {
namespace {

constexpr int kAbi = 4;  // mirrors tbl_kernels.KERNELS_ABI; bump both on any binding change

using SrcNd = nb::ndarray<const uint8_t, nb::c_contig, nb::device::cpu>;
using IndexNd = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using BoxNd = nb::ndarray<const int32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using WindowNd = nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using FlipNd = nb::ndarray<nb::ro, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using TableNd = nb::ndarray<nb::ro, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using OutNd = nb::ndarray<nb::c_contig, nb::device::cpu>;
using Hint = std::optional<std::vector<double>>;
using SizesNd = nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using RegionOutNd = nb::ndarray<uint8_t, nb::c_contig, nb::device::cpu>;

PyObject* jpeg_error_type = nullptr;  // tbl_kernels._core.JpegError, a ValueError

DType dtype_of(const nb::dlpack::dtype& d) {
    using Code = nb::dlpack::dtype_code;
    DTypeCode code = DTypeCode::Other;
    switch (static_cast<Code>(d.code)) {
        case Code::Int: code = DTypeCode::Int; break;
        case Code::UInt: code = DTypeCode::UInt; break;
        case Code::Float: code = DTypeCode::Float; break;
        case Code::Bfloat: code = DTypeCode::Bfloat; break;
        case Code::Complex: code = DTypeCode::Complex; break;
        case Code::Bool: code = DTypeCode::Bool; break;
        default: break;
    }
    return {code, d.bits, d.lanes};
}

template <typename T, typename Nd>
ArrayRef<T> array_ref(const Nd& a) {
    return {a.data(), a.ndim(), a.shape_ptr(), dtype_of(a.dtype()), a.nbytes()};
}

// refs = descriptions of arrays (refs keeps its capacity).
void fill_in_arrays(const std::vector<SrcNd>& arrays, std::vector<InArray>& refs) {
    refs.clear();
    for (const SrcNd& a : arrays) refs.push_back(array_ref<const void>(a));
}

Indices indices_of(const IndexNd& a) { return {a.data(), static_cast<int64_t>(a.shape(0))}; }

ImageBatch image_batch(const std::vector<SrcNd>& sources, const IndexNd& indices, const OutNd& out,
                       const InArray* table, const InArray* flip, const std::string& layout, const Hint& hint) {
    ImageBatch batch;
    fill_in_arrays(sources, batch.sources);
    batch.indices = indices_of(indices);
    batch.out = array_ref<void>(out);
    batch.table = table;
    batch.flip = flip;
    batch.layout = layout;
    batch.affine_hint = hint ? &*hint : nullptr;
    return batch;
}

std::optional<InArray> optional_ref(const std::optional<FlipNd>& a) {
    if (!a) return std::nullopt;
    return array_ref<const void>(*a);
}
std::optional<InArray> optional_ref(const std::optional<TableNd>& a) {
    if (!a) return std::nullopt;
    return array_ref<const void>(*a);
}
const InArray* ptr(const std::optional<InArray>& a) { return a ? &*a : nullptr; }

void gather_normalize_nd(const std::vector<SrcNd>& sources, const IndexNd& indices, OutNd out,
                         const TableNd& table, const std::optional<FlipNd>& flip, const std::string& layout,
                         const Hint& hint) {
    const InArray tab = array_ref<const void>(table);
    const std::optional<InArray> fl = optional_ref(flip);
    gather_images(image_batch(sources, indices, out, &tab, ptr(fl), layout, hint));
}

void gather_u8_nd(const std::vector<SrcNd>& sources, const IndexNd& indices, OutNd out,
                  const std::optional<FlipNd>& flip, const std::string& layout) {
    const std::optional<InArray> fl = optional_ref(flip);
    gather_images(image_batch(sources, indices, out, nullptr, ptr(fl), layout, std::nullopt));
}

void gather_crop_resize_nd(const std::vector<SrcNd>& sources, const IndexNd& indices, const BoxNd& boxes,
                           OutNd out, const std::optional<TableNd>& table, const std::optional<FlipNd>& flip,
                           const std::string& layout, const Hint& hint) {
    const std::optional<InArray> tab = optional_ref(table), fl = optional_ref(flip);
    const Boxes bx{boxes.data(), static_cast<int64_t>(boxes.shape(0)), static_cast<int64_t>(boxes.shape(1))};
    gather_crop_resize(image_batch(sources, indices, out, ptr(tab), ptr(fl), layout, hint), bx);
}

void crop_resize_images_nd(const std::vector<SrcNd>& images, const BoxNd& boxes, OutNd out,
                           const std::optional<TableNd>& table, const std::optional<FlipNd>& flip,
                           const std::string& layout, const Hint& hint) {
    const std::optional<InArray> tab = optional_ref(table), fl = optional_ref(flip);
    SampleImagesBatch batch;
    fill_in_arrays(images, batch.images);
    batch.out = array_ref<void>(out);
    batch.table = ptr(tab);
    batch.flip = ptr(fl);
    batch.layout = layout;
    batch.affine_hint = hint ? &*hint : nullptr;
    const Boxes bx{boxes.data(), static_cast<int64_t>(boxes.shape(0)), static_cast<int64_t>(boxes.shape(1))};
    crop_resize_images(batch, bx);
}

void resize_crop_images_nd(const std::vector<SrcNd>& images, const WindowNd& windows, OutNd out,
                           const std::optional<TableNd>& table, const std::optional<FlipNd>& flip,
                           const std::string& layout, const Hint& hint) {
    const std::optional<InArray> tab = optional_ref(table), fl = optional_ref(flip);
    SampleImagesBatch batch;
    fill_in_arrays(images, batch.images);
    batch.out = array_ref<void>(out);
    batch.table = ptr(tab);
    batch.flip = ptr(fl);
    batch.layout = layout;
    batch.affine_hint = hint ? &*hint : nullptr;
    const Windows wd{windows.data(), static_cast<int64_t>(windows.shape(0)), static_cast<int64_t>(windows.shape(1))};
    resize_crop_images(batch, wd);
}

JpegBatch jpeg_batch(const std::vector<SrcNd>& buffers, const SizesNd& sizes, const OutNd& out,
                     const std::optional<InArray>& table, const std::optional<InArray>& flip,
                     const std::string& layout, const Hint& hint, bool fast_idct) {
    JpegBatch batch;
    fill_in_arrays(buffers, batch.buffers);
    batch.sizes = JpegSizes{sizes.data(), static_cast<int64_t>(sizes.shape(0)), static_cast<int64_t>(sizes.shape(1))};
    batch.out = array_ref<void>(out);
    batch.table = ptr(table);
    batch.flip = ptr(flip);
    batch.layout = layout;
    batch.affine_hint = hint ? &*hint : nullptr;
    batch.fast_idct = fast_idct;
    return batch;
}

void decode_crop_resize_jpegs_nd(const std::vector<SrcNd>& buffers, const SizesNd& sizes, const BoxNd& boxes,
                                 OutNd out, const std::optional<TableNd>& table, const std::optional<FlipNd>& flip,
                                 const std::string& layout, const Hint& hint, bool fast_idct) {
    const std::optional<InArray> tab = optional_ref(table), fl = optional_ref(flip);
    const Boxes bx{boxes.data(), static_cast<int64_t>(boxes.shape(0)), static_cast<int64_t>(boxes.shape(1))};
    decode_crop_resize_jpegs(jpeg_batch(buffers, sizes, out, tab, fl, layout, hint, fast_idct), bx);
}

void decode_resize_crop_jpegs_nd(const std::vector<SrcNd>& buffers, const SizesNd& sizes, const WindowNd& windows,
                                 OutNd out, const std::optional<TableNd>& table, const std::optional<FlipNd>& flip,
                                 const std::string& layout, const Hint& hint, bool fast_idct) {
    const std::optional<InArray> tab = optional_ref(table), fl = optional_ref(flip);
    const Windows wd{windows.data(), static_cast<int64_t>(windows.shape(0)), static_cast<int64_t>(windows.shape(1))};
    decode_resize_crop_jpegs(jpeg_batch(buffers, sizes, out, tab, fl, layout, hint, fast_idct), wd);
}

void decode_jpeg_region_nd(const SrcNd& buffer, int64_t height, int64_t width, int scale,
                           std::array<int64_t, 4> region, RegionOutNd out, bool fast_idct) {
    decode_jpeg_region_into(array_ref<const void>(buffer), height, width, scale, fast_idct, region.data(),
                            array_ref<void>(out));
}

// (height, width, components, precision, progressive) of the frame header.
std::tuple<int64_t, int64_t, int, int, bool> jpeg_header_nd(const SrcNd& buffer) {
    if (buffer.ndim() != 1) throw TypeError("buffer must be 1-D uint8 JPEG bytes");
    JpegHeaderInfo info;
    const JpegStatus st = read_jpeg_header(buffer.data(), buffer.nbytes(), info);
    if (!st.ok()) throw JpegError(st.message, 0, jpeg_failure_name(st.failure));
    return {info.height, info.width, info.components, info.precision, info.progressive};
}

// The row gathers are called per batch of small rows, where a few allocations per
// call are measurable: their array descriptions live in per-thread buffers that
// keep their capacity from call to call.
void gather_rows_nd(const std::vector<SrcNd>& sources, const IndexNd& indices, OutNd out) {
    thread_local std::vector<InArray> segments;
    fill_in_arrays(sources, segments);
    gather_rows(segments, indices_of(indices), array_ref<void>(out));
}

void gather_columns_nd(const std::vector<std::vector<SrcNd>>& columns, const IndexNd& indices,
                       std::vector<OutNd> outs) {
    thread_local std::vector<std::vector<InArray>> column_refs;
    thread_local std::vector<OutArray> out_refs;
    column_refs.resize(columns.size());
    for (size_t l = 0; l < columns.size(); ++l) fill_in_arrays(columns[l], column_refs[l]);
    out_refs.clear();
    for (const OutNd& o : outs) out_refs.push_back(array_ref<void>(o));
    gather_columns(column_refs, indices_of(indices), out_refs);
}

// The Arrow C data interface's structs (arrow.apache.org/docs/format/CDataInterface.html):
// a stable ABI, which is how Pillow lends an image's pixels without copying them.
struct ArrowSchema {
    const char* format;
    const char* name;
    const char* metadata;
    int64_t flags;
    int64_t n_children;
    ArrowSchema** children;
    ArrowSchema* dictionary;
    void (*release)(ArrowSchema*);
    void* private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void** buffers;
    ArrowArray** children;
    ArrowArray* dictionary;
    void (*release)(ArrowArray*);
    void* private_data;
};

template <typename T>
const T* capsule_struct(const nb::capsule& c, const char* name) {
    const char* got = c.name();
    if (got == nullptr || std::strcmp(got, name) != 0)
        throw ValueError(std::string("pillow_resize: expected a capsule named '") + name + "'");
    const T* p = static_cast<const T*>(c.data());
    if (p == nullptr || p->release == nullptr) throw ValueError(std::string("pillow_resize: ") + name + " was released");
    return p;
}

// The pixels of an image exported as Pillow exports 3- and 4-band 8-bit images: a fixed-size
// list of 4 uint8 per pixel ("+w:4" of "C"), width * height pixels, one contiguous buffer.
const uint8_t* rgbx_pixels(const nb::capsule& schema_capsule, const nb::capsule& array_capsule, int width, int height) {
    const auto* schema = capsule_struct<ArrowSchema>(schema_capsule, "arrow_schema");
    const auto* array = capsule_struct<ArrowArray>(array_capsule, "arrow_array");
    if (width < 1 || height < 1) throw ValueError("pillow_resize: the image is empty");
    const int64_t pixels = static_cast<int64_t>(width) * height;
    if (schema->format == nullptr || std::strcmp(schema->format, "+w:4") != 0 || schema->n_children != 1 ||
        schema->children[0]->format == nullptr || std::strcmp(schema->children[0]->format, "C") != 0)
        throw ValueError("pillow_resize: the image is not 4 bytes per pixel (Arrow '+w:4' of 'C'); "
                         "give an RGB image");
    if (array->length != pixels || array->offset != 0 || array->null_count != 0 || array->n_children != 1)
        throw ValueError("pillow_resize: the Arrow array does not hold width * height pixels from offset 0");
    const ArrowArray* values = array->children[0];
    if (values->length != 4 * pixels || values->offset != 0 || values->null_count != 0 || values->n_buffers != 2 ||
        values->buffers[1] == nullptr)
        throw ValueError("pillow_resize: the Arrow array's values are not 4 * width * height contiguous bytes");
    return static_cast<const uint8_t*>(values->buffers[1]);
}

using RgbOutNd = nb::ndarray<uint8_t, nb::ndim<3>, nb::c_contig, nb::device::cpu>;

void pillow_resize_nd(const nb::capsule& schema, const nb::capsule& array, int width, int height,
                      std::array<float, 4> box, int filter, bool horizontal_first, RgbOutNd out) {
    const uint8_t* src = rgbx_pixels(schema, array, width, height);
    if (out.shape(2) != 3 || out.shape(0) > INT32_MAX || out.shape(1) > INT32_MAX)
        throw ValueError("pillow_resize: out must be (height, width, 3) uint8");
    const int out_h = static_cast<int>(out.shape(0)), out_w = static_cast<int>(out.shape(1));
    uint8_t* dst = out.data();
    nb::gil_scoped_release release;  // the capsules (arguments) keep the pixels alive
    pillow_resize_rgb(src, static_cast<int64_t>(width) * 4, width, height, box.data(), out_w, out_h, filter,
                      horizontal_first, dst);
}

// Runs after the call returns, with the GIL held again.
void translate_error(const std::exception_ptr& p, void*) {
    try {
        std::rethrow_exception(p);
    } catch (const JpegError& e) {
        // JpegError(message) with .index (the buffer) and .kind ("size", "unsupported", "corrupt")
        PyObject* exc = PyObject_CallFunction(jpeg_error_type, "s", e.what());
        if (exc == nullptr) return;  // the call's own error stands
        PyObject* index = PyLong_FromLongLong(e.index());
        PyObject* kind = PyUnicode_FromString(e.kind());
        if (index && kind && PyObject_SetAttrString(exc, "index", index) == 0 &&
            PyObject_SetAttrString(exc, "kind", kind) == 0)
            PyErr_SetObject(jpeg_error_type, exc);
        Py_XDECREF(index);
        Py_XDECREF(kind);
        Py_DECREF(exc);
    } catch (const IndexError& e) {
        PyErr_SetString(PyExc_IndexError, e.what());
    } catch (const ValueError& e) {
        PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const TypeError& e) {
        PyErr_SetString(PyExc_TypeError, e.what());
    }
}

}  // namespace
}  // namespace tbl

NB_MODULE(_core, m) {
    using namespace tbl;
    using nb::arg;
    using Release = nb::call_guard<nb::gil_scoped_release>;
    m.doc() = "Compiled kernels of tbl_kernels (use the tbl_kernels package, not this module).";
    m.attr("KERNELS_ABI") = kAbi;
    jpeg_error_type = PyErr_NewExceptionWithDoc(
        "tbl_kernels._core.JpegError",
        "A JPEG that cannot be served: .index is its position in the batch, .kind why "
        "('size': the header disagrees with the declared size; 'unsupported'; 'corrupt').",
        PyExc_ValueError, nullptr);
    m.attr("JpegError") = nb::handle(jpeg_error_type);
    m.attr("JPEG_LIBRARY_VERSION") = jpeg_library_version();
    m.attr("JPEG_MAX_SCANS") = kMaxJpegScans;
    nb::register_exception_translator(translate_error);

    m.def("set_num_threads", &set_num_threads, arg("n"), Release(),
          "Size of the persistent worker pool (1 = run on the calling thread).");
    m.def("get_num_threads", &get_num_threads, Release());
    m.def("simd_levels", &available_simd_levels, "Levels this build and CPU can run, slowest first.");
    m.def("simd_level", &simd_level, "The level the kernels use now.");
    m.def("set_simd", &set_simd_level, arg("level"), "Select a level by name ('auto' = fastest available).");

    m.def("gather_normalize", &gather_normalize_nd, arg("sources").noconvert(), arg("indices").noconvert(),
          arg("out").noconvert(), arg("table").noconvert(), arg("flip").noconvert().none(), arg("layout"),
          arg("affine_hint").none() = nb::none(), Release());
    m.def("gather_u8", &gather_u8_nd, arg("sources").noconvert(), arg("indices").noconvert(),
          arg("out").noconvert(), arg("flip").noconvert().none(), arg("layout"), Release());
    m.def("gather_crop_resize", &gather_crop_resize_nd, arg("sources").noconvert(), arg("indices").noconvert(),
          arg("boxes").noconvert(), arg("out").noconvert(), arg("table").noconvert().none(),
          arg("flip").noconvert().none(), arg("layout"), arg("affine_hint").none() = nb::none(), Release());
    m.def("crop_resize_images", &crop_resize_images_nd, arg("images").noconvert(), arg("boxes").noconvert(),
          arg("out").noconvert(), arg("table").noconvert().none(), arg("flip").noconvert().none(), arg("layout"),
          arg("affine_hint").none() = nb::none(), Release());
    m.def("resize_crop_images", &resize_crop_images_nd, arg("images").noconvert(), arg("windows").noconvert(),
          arg("out").noconvert(), arg("table").noconvert().none(), arg("flip").noconvert().none(), arg("layout"),
          arg("affine_hint").none() = nb::none(), Release());
    m.def("pillow_resize", &pillow_resize_nd, arg("schema"), arg("array"), arg("width"), arg("height"), arg("box"),
          arg("filter"), arg("horizontal_first"), arg("out").noconvert());
    m.def("decode_crop_resize_jpegs", &decode_crop_resize_jpegs_nd, arg("buffers").noconvert(),
          arg("sizes").noconvert(), arg("boxes").noconvert(), arg("out").noconvert(),
          arg("table").noconvert().none(), arg("flip").noconvert().none(), arg("layout"),
          arg("affine_hint").none() = nb::none(), arg("fast_idct") = false, Release());
    m.def("decode_resize_crop_jpegs", &decode_resize_crop_jpegs_nd, arg("buffers").noconvert(),
          arg("sizes").noconvert(), arg("windows").noconvert(), arg("out").noconvert(),
          arg("table").noconvert().none(), arg("flip").noconvert().none(), arg("layout"),
          arg("affine_hint").none() = nb::none(), arg("fast_idct") = false, Release());
    m.def("decode_jpeg_region", &decode_jpeg_region_nd, arg("buffer").noconvert(), arg("height"), arg("width"),
          arg("scale"), arg("region"), arg("out").noconvert(), arg("fast_idct") = false, Release());
    m.def("jpeg_header", &jpeg_header_nd, arg("buffer").noconvert(), Release());
    m.def("gather_rows", &gather_rows_nd, arg("sources").noconvert(), arg("indices").noconvert(),
          arg("out").noconvert(), Release());
    m.def("gather_columns", &gather_columns_nd, arg("columns").noconvert(), arg("indices").noconvert(),
          arg("outs").noconvert(), Release());
}
