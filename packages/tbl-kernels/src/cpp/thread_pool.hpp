// Persistent worker pool shared by every kernel.
//
// One process-wide pool whose size the caller sets (set_num_threads). A call to
// parallel_for hands out index ranges to the workers *and* the calling thread, so
// with one thread everything runs inline on the caller. Calls from several Python
// threads are serialized (each kernel call already uses every pool thread).
#pragma once

#include <cstdint>
#include <functional>

namespace tbl {

// fn(begin, end) is called on disjoint ranges covering [0, n); ranges hold at most
// `grain` items. fn must not throw: kernels validate every input before dispatch.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

void set_num_threads(int n);  // ValueError unless n >= 1
int get_num_threads();

}  // namespace tbl
