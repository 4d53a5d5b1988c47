// Kernel bodies compiled for the "baseline" level (flags set in CMakeLists.txt).
#include "kernels.hpp"

#define TBL_ISA_NAME "baseline"

namespace tbl {
namespace isa_baseline_ns {
#include "isa_impl.inl"
}  // namespace isa_baseline_ns

const IsaKernels& isa_baseline() { return isa_baseline_ns::kKernels; }
}  // namespace tbl
