#include "dispatch.hpp"

#include <atomic>
#if TBL_HAVE_AVX2
#include <cpuid.h>
#endif

#include "errors.hpp"

namespace tbl {
namespace {

bool cpu_has_avx2() {
#if TBL_HAVE_AVX2
    __builtin_cpu_init();
    // The avx2 level also uses F16C (float16 conversion), present on every AVX2 CPU
    // in practice but checked anyway.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    return __builtin_cpu_supports("avx2") && f16c;
#else
    return false;
#endif
}

// The avx512 level: the avx2 level's features and AVX-512 F, BW, VL and VBMI (byte permutes). The CPU
// feature bits read here are set only where the OS saves the AVX-512 registers.
bool cpu_has_avx512() {
#if TBL_HAVE_AVX512
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
#else
    return false;
#endif
}

const IsaKernels* lookup(const std::string& name) {
    if (name == "scalar") return &isa_scalar();
    if (name == "baseline") return &isa_baseline();
#if TBL_HAVE_AVX2
    if (name == "avx2" && cpu_has_avx2()) return &isa_avx2();
#endif
#if TBL_HAVE_AVX512
    if (name == "avx512" && cpu_has_avx512()) return &isa_avx512();
#endif
    if (name == "auto") return lookup(available_simd_levels().back());
    return nullptr;
}

std::atomic<const IsaKernels*> active{nullptr};

}  // namespace

std::vector<std::string> available_simd_levels() {
    std::vector<std::string> levels = {"scalar", "baseline"};
    if (cpu_has_avx2()) levels.emplace_back("avx2");
    if (cpu_has_avx512()) levels.emplace_back("avx512");
    return levels;
}

const IsaKernels& active_kernels() {
    const IsaKernels* k = active.load(std::memory_order_acquire);
    if (k == nullptr) {
        k = lookup("auto");
        active.store(k, std::memory_order_release);
    }
    return *k;
}

void set_simd_level(const std::string& name) {
    const IsaKernels* k = lookup(name);
    if (k == nullptr) {
        std::string avail;
        for (const auto& s : available_simd_levels()) avail += (avail.empty() ? "" : ", ") + s;
        throw ValueError("unknown or unsupported SIMD level '" + name + "'; available here: auto, " + avail);
    }
    active.store(k, std::memory_order_release);
}

std::string simd_level() { return active_kernels().name; }

}  // namespace tbl
