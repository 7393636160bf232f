// src/cpu/parallel.hpp: how the cpu backend splits work over OpenMP threads. Every split gives
// each thread whole, independent pieces, so results never depend on the thread count; a thread
// may ask for its next piece's memory ahead (FP8KIT_PREFETCH_L2).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "cpu/convert_kernels.hpp"
#include "fp8kit/runtime.hpp"

// A read hint into L2 (GCC and clang; elsewhere nothing). Never faults, so it may point past
// the end of a buffer.
#if defined(__GNUC__)
#define FP8KIT_PREFETCH_L2(p) __builtin_prefetch((p), 0, 2)
#else
#define FP8KIT_PREFETCH_L2(p) ((void)(p))
#endif

namespace fp8kit::cpu {

// Threads for `work` elements: one below parallel_threshold, where waking the team costs more.
inline int threads_for(size_t work) { return work < parallel_threshold ? 1 : num_threads(); }

// Runs kernel(begin, count) over [0, n) in one contiguous range per thread (64-element aligned).
template <class Fn>
void parallel_ranges(size_t n, Fn&& kernel) {
    const int threads = threads_for(n);
    if (n == 0) return;
    if (threads <= 1) {
        kernel(size_t(0), n);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        const size_t team = size_t(omp_get_num_threads());
        const size_t per = ((n + team - 1) / team + 63) / 64 * 64;
        const size_t begin = std::min(n, per * size_t(omp_get_thread_num()));
        const size_t end = std::min(n, begin + per);
        if (begin < end) kernel(begin, end - begin);
    }
}

// Runs task(t, slot) for t in [0, tasks), statically scheduled; slot is the thread's index in
// [0, threads_for(work)), for per-thread accumulators. `work` (elements) decides the threads.
template <class Fn>
void parallel_tasks(int64_t tasks, size_t work, Fn&& task) {
    const int threads = int(std::min<int64_t>(threads_for(work), std::max<int64_t>(tasks, 1)));
    if (threads <= 1) {
        for (int64_t t = 0; t < tasks; ++t) task(t, 0);
        return;
    }
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t t = 0; t < tasks; ++t) task(t, omp_get_thread_num());
}

}  // namespace fp8kit::cpu
