// src/core/host_memory.cpp: tensors' CPU memory, with freed large blocks cached for reuse
// (host_memory.hpp says why). Checked by tests/unit/test_tensor.cpp (HostMemory tests).
#include "core/host_memory.hpp"

#include <algorithm>
#include <mutex>
#include <new>
#include <vector>

#include "platform/platform.hpp"

// Under AddressSanitizer a cached block is poisoned while it waits, so a use after the tensor's
// free is still reported (as use-after-poison) though the memory was not returned.
#if defined(__has_include)
#if __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>
#endif
#endif
#ifndef ASAN_POISON_MEMORY_REGION
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif

namespace fp8kit::detail {

namespace {

struct Block {
    std::byte* ptr;
    size_t bytes;
};

std::byte* aligned_new(size_t bytes) {
    return static_cast<std::byte*>(::operator new(bytes, std::align_val_t{tensor_alignment}));
}

void release(std::byte* p) { ::operator delete(p, std::align_val_t{tensor_alignment}); }

// A large block starts on a 2 MiB boundary, so that all of it can be huge pages, and asks the OS
// for them (platform.hpp says why).
std::byte* large_new(size_t bytes) {
    auto* p = static_cast<std::byte*>(::operator new(bytes, std::align_val_t{host_cache_min}));
    platform::advise_huge_pages(p, bytes);
    return p;
}

void large_release(std::byte* p) { ::operator delete(p, std::align_val_t{host_cache_min}); }

// Freed large blocks, oldest first. Never destroyed: a tensor freed during static destruction
// (a user's global) still finds it. give() runs in a shared_ptr's deleter, where nothing may
// throw: the list's room is reserved up front (every block is >= host_cache_min and they total
// <= host_cache_cap, so one more than cap / min entries), so keeping a block never allocates.
struct Cache {
    std::mutex mutex;
    std::vector<Block> blocks;
    size_t bytes = 0;

    Cache() { blocks.reserve(host_cache_cap / host_cache_min + 1); }

    std::byte* take(size_t bytes_wanted) {
        std::lock_guard lock(mutex);
        for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
            if (it->bytes != bytes_wanted) continue;
            std::byte* p = it->ptr;
            bytes -= it->bytes;
            blocks.erase(std::next(it).base());
            ASAN_UNPOISON_MEMORY_REGION(p, bytes_wanted);
            return p;
        }
        return nullptr;
    }

    void give(Block b) noexcept {
        if (b.bytes > host_cache_cap) return large_release(b.ptr);
        std::lock_guard lock(mutex);
        ASAN_POISON_MEMORY_REGION(b.ptr, b.bytes);
        blocks.push_back(b);
        bytes += b.bytes;
        size_t drop = 0;
        for (; bytes > host_cache_cap; ++drop) {
            bytes -= blocks[drop].bytes;
            ASAN_UNPOISON_MEMORY_REGION(blocks[drop].ptr, blocks[drop].bytes);
            large_release(blocks[drop].ptr);
        }
        blocks.erase(blocks.begin(), blocks.begin() + std::ptrdiff_t(drop));
    }
};

Cache& cache() {
    static Cache* c = new Cache;
    return *c;
}

// A large block of `rounded` bytes (a multiple of host_cache_min): a cached one, else a new one.
std::byte* large_take(size_t rounded) {
    std::byte* p = cache().take(rounded);
    return p != nullptr ? p : large_new(rounded);
}

}  // namespace

std::shared_ptr<std::byte> host_allocate(size_t bytes) {
    if (bytes < host_cache_min) return {aligned_new(round_up(bytes, tensor_alignment)), release};
    const size_t rounded = round_up(bytes, host_cache_min);
    return {large_take(rounded), [rounded](std::byte* q) { cache().give({q, rounded}); }};
}

std::shared_ptr<std::byte> host_allocate_lasting(size_t bytes) {
    const size_t rounded = round_up(bytes, size_t(4) << 10);
    if (rounded < host_cache_min) return {aligned_new(rounded), release};
    return {large_new(rounded), large_release};
}

namespace {

// A thread's released scratch blocks (sizes rounded to 64 bytes).
struct ScratchList {
    std::vector<Block> blocks;
    ~ScratchList() {
        for (const Block& b : blocks) {
            ASAN_UNPOISON_MEMORY_REGION(b.ptr, b.bytes);
            release(b.ptr);
        }
    }
};
thread_local ScratchList scratch_list;

}  // namespace

void* scratch_acquire(size_t bytes) {
    if (bytes >= host_cache_min) return large_take(round_up(bytes, host_cache_min));
    bytes = round_up(bytes, tensor_alignment);
    // From the back, the most recently released first: a call releases its blocks in the reverse
    // order of taking them, so the next call's first request finds its block last in the list,
    // the second next to it, and so on.
    auto& blocks = scratch_list.blocks;
    for (size_t i = blocks.size(); i-- > 0;) {
        if (blocks[i].bytes != bytes) continue;
        std::byte* p = blocks[i].ptr;
        blocks.erase(blocks.begin() + std::ptrdiff_t(i));  // the rest keep their order (at most 15 moved)
        ASAN_UNPOISON_MEMORY_REGION(p, bytes);
        return p;
    }
    return aligned_new(bytes);
}

void scratch_release(void* p, size_t bytes) noexcept {
    if (bytes >= host_cache_min) return cache().give({static_cast<std::byte*>(p), round_up(bytes, host_cache_min)});
    bytes = round_up(bytes, tensor_alignment);
    if (bytes > scratch_keep) return release(static_cast<std::byte*>(p));
    auto& blocks = scratch_list.blocks;
    try {  // the list's one allocation (release runs in destructors: nothing may escape)
        blocks.reserve(scratch_kept);
    } catch (const std::bad_alloc&) {
        return release(static_cast<std::byte*>(p));
    }
    // Full: the least recently released block goes. Why not keep the list as it is: after GEMMs of
    // other shapes it holds their sizes, and a decode step's small GEMM would then allocate and
    // free every buffer on every call (from Python, a 16 x 16 layer's call 4.8 -> 5.3 us).
    if (blocks.size() == scratch_kept) {
        ASAN_UNPOISON_MEMORY_REGION(blocks.front().ptr, blocks.front().bytes);
        release(blocks.front().ptr);
        blocks.erase(blocks.begin());
    }
    ASAN_POISON_MEMORY_REGION(p, bytes);
    blocks.push_back({static_cast<std::byte*>(p), bytes});
}

size_t host_cached_bytes() {
    std::lock_guard lock(cache().mutex);
    return cache().bytes;
}

}  // namespace fp8kit::detail
