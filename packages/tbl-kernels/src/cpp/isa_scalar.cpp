// Kernel bodies compiled for the "scalar" level (flags set in CMakeLists.txt).
#include "kernels.hpp"

#define TBL_ISA_NAME "scalar"

namespace tbl {
namespace isa_scalar_ns {
#include "isa_impl.inl"
}  // namespace isa_scalar_ns

const IsaKernels& isa_scalar() { return isa_scalar_ns::kKernels; }
}  // namespace tbl
