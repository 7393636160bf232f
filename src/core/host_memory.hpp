// src/core/host_memory.hpp: the CPU memory behind tensors (Tensor::empty, src/core/tensor.cpp) -
// aligned blocks, the large ones kept for reuse when freed - and the per-call scratch (Scratch)
// kept per thread, which the cpu GEMM and casts (src/cpu/gemm.cpp, src/cpu/quantize.cpp) and the
// GEMM's fused cast on the host (src/core/gemm.cpp) take their buffers from.
// Checked by tests/unit/test_tensor.cpp (HostMemory tests).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "fp8kit/tensor.hpp"

namespace fp8kit::detail {

// Blocks of at least host_cache_min bytes are rounded up to a multiple of it and, when freed,
// kept (the most recently freed, host_cache_cap bytes at most) for the next request of the same
// rounded size. Why: a layer's output allocated anew on every call - 32 MiB at M = 2048,
// N = 4096 in float32 - is mapped afresh by glibc each time (it maps any block over 32 MiB), and
// the page faults on first touch cost 8-10% of that 2048 x 4096 x 4096 GEMM (Zen 5, 2 threads).
// These blocks start on a 2 MiB boundary and ask the OS for huge pages (platform.hpp says why):
// packed weights (src/cpu/gemm.cpp) live in them too.
inline constexpr size_t host_cache_min = size_t(2) << 20;
inline constexpr size_t host_cache_cap = size_t(256) << 20;

// bytes (0 counts as 1) rounded up to a multiple of unit.
inline size_t round_up(size_t bytes, size_t unit) { return ((bytes > 0 ? bytes : 1) + unit - 1) / unit * unit; }

// At least `bytes` (>= 1), aligned to tensor_alignment, contents unspecified.
std::shared_ptr<std::byte> host_allocate(size_t bytes);
// A block that lives as long as what holds it (a packed weight), `bytes` (>= 1) rounded up to the
// 4 KiB page only: from host_cache_min bytes on it starts on a 2 MiB boundary with huge pages
// asked for its whole 2 MiB blocks, as host_allocate's, but its size is not rounded up to 2 MiB
// and it goes straight back to the system when freed. Why: a large block's rounded tail is a
// huge page of its own once touched - a 2.75 MiB packed weight held 4 MiB resident, 30 MB of a
// 169M-parameter Llama's 103 MB of FP8 weights.
std::shared_ptr<std::byte> host_allocate_lasting(size_t bytes);
// Bytes held in freed blocks now.
size_t host_cached_bytes();

// Scratch memory for one call of a kernel, aligned to tensor_alignment, contents unspecified:
// blocks of up to scratch_keep bytes go back to a list of the thread's own when released (at most
// scratch_kept of them, the least recently released leaving first) and are taken from it again.
// Why: a decode step's small GEMM would allocate and free a handful of buffers every call, and one
// of 1 KiB or more makes glibc consolidate its fast bins each time (from Python, 6% of the call on
// a 16 x 16 layer). 16 blocks: a block-scaled fused-cast GEMM takes 9-10 on its calling thread
// (packed A and its scales, the cast's codes, amaxes and group scales, A's scales, each task's
// sums), and with 8 one of them was a fresh allocation every call. Up to 1 MiB a block: the AMX
// tiles' widened window of B is 512 KiB to 1 MiB, and glibc handed one back to the OS after every
// call, each call faulting its pages in again. At most 16 MiB a thread. A block
// of host_cache_min bytes or more is a large block of the cache above instead: packed A of a 2048 x
// 11008 GEMM is 45 MiB, which glibc maps afresh on every call in 4 KiB pages, and whose page faults
// and TLB misses cost that 2048 x 4096 x 11008 GEMM 3-8% (Zen 5, 2 threads).
inline constexpr size_t scratch_keep = size_t(1) << 20;
inline constexpr size_t scratch_kept = 16;
void* scratch_acquire(size_t bytes);
void scratch_release(void* p, size_t bytes) noexcept;

// scratch_acquire / scratch_release as an owner: `n` elements of T for one call, aligned and not
// zeroed (every element used is written first).
template <class T>
class Scratch {
public:
    explicit Scratch(int64_t n)
        : bytes_(size_t(std::max<int64_t>(n, 1)) * sizeof(T)), ptr_(static_cast<T*>(scratch_acquire(bytes_))) {}
    Scratch(Scratch&& o) noexcept : bytes_(o.bytes_), ptr_(std::exchange(o.ptr_, nullptr)) {}
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    Scratch& operator=(Scratch&&) = delete;
    ~Scratch() {
        if (ptr_ != nullptr) scratch_release(ptr_, bytes_);
    }
    T* get() const { return ptr_; }

private:
    size_t bytes_;
    T* ptr_;
};

}  // namespace fp8kit::detail
