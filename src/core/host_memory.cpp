// src/core/host_memory.cpp: tensors' CPU memory, with freed large blocks cached for reuse
// (host_memory.hpp says why). Checked by tests/unit/test_tensor.cpp (HostMemory tests).
#include "core/host_memory.hpp"

#include <algorithm>
#include <mutex>
#include <new>
#include <vector>

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

void release(std::byte* p) { ::operator delete(p, std::align_val_t{tensor_alignment}); }

// Freed large blocks, oldest first. Never destroyed: a tensor freed during static destruction
// (a user's global) still finds it.
struct Cache {
    std::mutex mutex;
    std::vector<Block> blocks;
    size_t bytes = 0;

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

    void give(Block b) {
        std::vector<Block> evicted;
        {
            std::lock_guard lock(mutex);
            if (b.bytes > host_cache_cap) {
                evicted.push_back(b);
            } else {
                ASAN_POISON_MEMORY_REGION(b.ptr, b.bytes);
                blocks.push_back(b);
                bytes += b.bytes;
                size_t drop = 0;
                while (bytes > host_cache_cap) bytes -= blocks[drop++].bytes;
                evicted.assign(blocks.begin(), blocks.begin() + std::ptrdiff_t(drop));
                blocks.erase(blocks.begin(), blocks.begin() + std::ptrdiff_t(drop));
            }
        }
        for (const Block& e : evicted) {  // outside the lock: unmapping takes time
            ASAN_UNPOISON_MEMORY_REGION(e.ptr, e.bytes);
            release(e.ptr);
        }
    }
};

Cache& cache() {
    static Cache* c = new Cache;
    return *c;
}

}  // namespace

std::shared_ptr<std::byte> host_allocate(size_t bytes) {
    bytes = std::max<size_t>(bytes, 1);
    if (bytes < host_cache_min) {
        const size_t rounded = (bytes + tensor_alignment - 1) / tensor_alignment * tensor_alignment;
        return {static_cast<std::byte*>(::operator new(rounded, std::align_val_t{tensor_alignment})), release};
    }
    const size_t rounded = (bytes + host_cache_min - 1) / host_cache_min * host_cache_min;
    std::byte* p = cache().take(rounded);
    if (p == nullptr) p = static_cast<std::byte*>(::operator new(rounded, std::align_val_t{tensor_alignment}));
    return {p, [rounded](std::byte* q) { cache().give({q, rounded}); }};
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

size_t scratch_rounded(size_t bytes) {
    return (std::max<size_t>(bytes, 1) + tensor_alignment - 1) / tensor_alignment * tensor_alignment;
}

}  // namespace

void* scratch_acquire(size_t bytes) {
    bytes = scratch_rounded(bytes);
    auto& blocks = scratch_list.blocks;
    for (size_t i = 0; i < blocks.size(); ++i) {
        if (blocks[i].bytes != bytes) continue;
        std::byte* p = blocks[i].ptr;
        blocks[i] = blocks.back();
        blocks.pop_back();
        ASAN_UNPOISON_MEMORY_REGION(p, bytes);
        return p;
    }
    return ::operator new(bytes, std::align_val_t{tensor_alignment});
}

void scratch_release(void* p, size_t bytes) noexcept {
    bytes = scratch_rounded(bytes);
    auto& blocks = scratch_list.blocks;
    if (bytes <= scratch_keep && blocks.size() < scratch_kept) {
        if (blocks.capacity() == 0) blocks.reserve(scratch_kept);  // the one allocation of the list
        ASAN_POISON_MEMORY_REGION(p, bytes);
        blocks.push_back({static_cast<std::byte*>(p), bytes});
        return;
    }
    release(static_cast<std::byte*>(p));
}

size_t host_cached_bytes() {
    std::lock_guard lock(cache().mutex);
    return cache().bytes;
}

}  // namespace fp8kit::detail
