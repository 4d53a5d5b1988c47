// Run-time choice of the instruction-set level used by every kernel.
#pragma once

#include <string>
#include <vector>

#include "kernels.hpp"

namespace tbl {

const IsaKernels& active_kernels();
// Levels this build and this CPU can run, slowest first ("scalar" is always there).
std::vector<std::string> available_simd_levels();
// Selects a level by name; "auto" picks the fastest available. ValueError for an
// unknown or unavailable name (nothing changes then).
void set_simd_level(const std::string& name);
std::string simd_level();

}  // namespace tbl
