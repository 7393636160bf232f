// src/cpu/layer_parallel.hpp: when the cpu backend's layer ops (src/cpu/{matmul, layernorm, gelu,
// attention, crossentropy, adamw}.cpp) go parallel. Each parallel loop gives every output element
// to one thread, computed in a fixed order, so results do not depend on the thread count.
#pragma once

#include <cstdint>

namespace fp8kit::cpu {

// Loops with less work than this (elements; the matmul: 32x this many multiply-adds) run on one
// thread: on a busy 2-core machine a parallel region's barrier costs more than it saves below
// it (measured: a 512x192x64 matmul ran at 1.6 GFLOP/s on two contended threads, 26 on one).
inline constexpr int64_t parallel_min_work = int64_t(1) << 18;

}  // namespace fp8kit::cpu
