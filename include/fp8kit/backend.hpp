// fp8kit/backend.hpp: which implementation runs an operation, and the context it runs in.
//
//  - ref:  scalar loops, double accumulation, no threads, no SIMD - the ground truth the others
//          are tested against
//  - cpu:  SIMD kernels chosen at run time (see <fp8kit/runtime.hpp>) and OpenMP threads
//  - cuda: NVIDIA GPUs (when built with CUDA; tensors on Device::cuda)
//
// Every operation picks its backend from the device of its inputs (inputs on different devices:
// fp8kit::Error naming both): cuda for Device::cuda, cpu for host tensors - unless the
// environment (FP8KIT_BACKEND=ref) or a BackendOverride on the calling thread says to run host
// tensors on ref. There is no process-wide switch to flip at run time. All backends give the
// same casts and scales bit for bit.
//
// Every operation also carries an ExecContext to its backend: the stream a device backend
// enqueues its work on (host backends ignore it). It is per thread, set for a scope by a
// ContextGuard, as a current stream is in PyTorch.
// Checked by tests/unit/test_backend.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "fp8kit/tensor.hpp"

namespace fp8kit {

enum class Backend : uint8_t { ref, cpu, cuda };

std::string_view to_string(Backend b) noexcept;
std::optional<Backend> try_parse_backend(std::string_view name) noexcept;
// cuda: built with it, and a GPU with its driver is present.
bool backend_available(Backend b) noexcept;
// The backends that run host tensors (ref, cpu): what BackendOverride accepts.
std::span<const Backend> available_backends() noexcept;

// The backend that runs tensors on `device` on this thread. Reads FP8KIT_BACKEND (ref or cpu) on
// first use: a bad value is an fp8kit::Error. Device::cuda: fp8kit::Error in a build without CUDA
// or on a machine without a usable GPU (saying which).
Backend backend_for(Device device);

// Runs host tensors on `b` on this thread while it lives (tests, debugging); nests, and leaves
// other threads alone. fp8kit::Error if `b` cannot run host tensors.
class BackendOverride {
public:
    explicit BackendOverride(Backend b);
    ~BackendOverride();
    BackendOverride(const BackendOverride&) = delete;
    BackendOverride& operator=(const BackendOverride&) = delete;

private:
    std::optional<Backend> saved_;
};

// What a backend runs a job in: for cuda the cudaStream_t (null: the default stream).
struct ExecContext {
    void* stream = nullptr;
};
ExecContext current_context() noexcept;  // this thread's

// Sets this thread's context while it lives; nests.
class ContextGuard {
public:
    explicit ContextGuard(ExecContext ctx) noexcept;
    ~ContextGuard();
    ContextGuard(const ContextGuard&) = delete;
    ContextGuard& operator=(const ContextGuard&) = delete;

private:
    ExecContext saved_;
};

}  // namespace fp8kit
