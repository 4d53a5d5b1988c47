// The error kinds the kernels throw, one per Python exception they become.
//
// The C++ code knows nothing of Python: it throws these with the full message,
// and the binding (bindings.cpp) turns each into the Python exception of the
// same name. Every check runs before any output byte is written, so an error
// never leaves a partly written batch.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace tbl {

class Error : public std::runtime_error {
   public:
    using std::runtime_error::runtime_error;
};

// An index or a box outside the data it addresses.
class IndexError : public Error {
   public:
    using Error::Error;
};

// A shape, size, layout, memory overlap or setting that does not fit.
class ValueError : public Error {
   public:
    using Error::Error;
};

// An element type that does not fit.
class TypeError : public Error {
   public:
    using Error::Error;
};

// A JPEG that cannot be served (decode_crop_resize_jpegs and friends): which
// buffer, and why by name ("size", "unsupported", "corrupt"; jpeg_decode.hpp).
// A ValueError in Python (tbl_kernels.JpegError) carrying both.
class JpegError : public ValueError {
   public:
    JpegError(const std::string& message, int64_t index, const char* kind)
        : ValueError(message), index_(index), kind_(kind) {}
    int64_t index() const { return index_; }
    const char* kind() const { return kind_; }

   private:
    int64_t index_;
    const char* kind_;  // a string literal
};

}  // namespace tbl
