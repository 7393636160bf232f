// fp8kit/backend.hpp: which implementation runs the operations.
//
//  - ref:  scalar loops, no threads, no SIMD - the ground truth the others are tested against
//  - cpu:  SIMD kernels chosen at run time (see <fp8kit/runtime.hpp>) and OpenMP threads
//  - cuda: NVIDIA GPUs (when built with CUDA; tensors on Device::cuda)
//
// Host tensors go to the active backend: `cpu` unless FP8KIT_BACKEND=ref|cpu says otherwise or
// set_backend() changes it. All backends give the same casts and scales bit for bit.
#pragma once

#include <optional>
#include <span>
#include <string_view>

namespace fp8kit {

enum class Backend : uint8_t { ref, cpu, cuda };

std::string_view to_string(Backend b) noexcept;
std::optional<Backend> try_parse_backend(std::string_view name) noexcept;
bool backend_available(Backend b) noexcept;
std::span<const Backend> available_backends() noexcept;
Backend active_backend();        // resolves FP8KIT_BACKEND on first call (bad value: fp8kit::Error)
void set_backend(Backend b);     // fp8kit::Error if it is not available for host tensors

}  // namespace fp8kit
