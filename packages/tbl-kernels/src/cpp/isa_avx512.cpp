#if TBL_HAVE_AVX512
// Kernel bodies compiled for the "avx512" level (AVX-512 F/BW/VL/VBMI on top of the avx2 level's AVX2 + F16C;
// flags set in CMakeLists.txt). The same bodies as avx2, plus float32 outputs looked up in registers.
#include <immintrin.h>

#include "kernels.hpp"

#define TBL_ISA_NAME "avx512"

namespace tbl {
namespace isa_avx512_ns {
#include "isa_impl.inl"
}  // namespace isa_avx512_ns

const IsaKernels& isa_avx512() { return isa_avx512_ns::kKernels; }
}  // namespace tbl
#endif
