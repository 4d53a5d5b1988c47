// The error kinds the kernels throw, one per Python exception they become.
//
// The C++ code knows nothing of Python: it throws these with the full message,
// and the binding (bindings.cpp) turns each into the Python exception of the
// same name. Every check runs before any output byte is written, so an error
// never leaves a partly written batch.
#pragma once

#include <stdexcept>

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

}  // namespace tbl
