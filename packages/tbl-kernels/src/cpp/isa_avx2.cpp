#if TBL_HAVE_AVX2
// Kernel bodies compiled for the "avx2" level (flags set in CMakeLists.txt).
#include <immintrin.h>

#include "kernels.hpp"

#define TBL_ISA_NAME "avx2"

namespace tbl {
namespace isa_avx2_ns {
#include "isa_impl.inl"
}  // namespace isa_avx2_ns

const IsaKernels& isa_avx2() { return isa_avx2_ns::kKernels; }
}  // namespace tbl
#endif
