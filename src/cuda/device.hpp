// src/cuda/device.hpp: what the rest of core needs from the CUDA backend besides its op table -
// device memory for Tensor storage and copies between host and device - in plain C++ (no CUDA
// types), so src/core/*.cpp include it without nvcc. Built only with FP8KIT_HAS_CUDA.
// Checked by tests/unit/test_backend.cpp and the cuda tests of tests/ops.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "core/ops.hpp"

namespace fp8kit::cuda {

// True when a CUDA device can be used (a driver and at least one GPU); asked once per process.
bool available() noexcept;
// Why it cannot ("no CUDA device", "no NVIDIA driver", the runtime's error), "" when available().
const std::string& unavailable_reason() noexcept;

// `bytes` of device memory on this thread's stream (stream-ordered: usable by work enqueued after
// it, freed after the work enqueued before the last owner lets go). fp8kit::Error when the
// device cannot give it (naming the size and the CUDA error).
std::shared_ptr<std::byte> allocate(size_t bytes);
// Copies `height` rows of `width` bytes (pitches in bytes) between any two of host and device
// memory, ordered on this thread's stream; with `wait` (a copy that involves the host) it waits
// for it, so that on return dst holds the data. A device-to-device copy needs no wait: the work
// that reads dst is ordered after it on the stream.
void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height, bool wait);
// dst[0, bytes) = 0 on this thread's stream (device memory).
void zero(void* dst, size_t bytes);

// The backend's operations (src/core/backend.cpp puts them behind Backend::cuda).
const detail::BackendOps& ops() noexcept;

}  // namespace fp8kit::cuda
