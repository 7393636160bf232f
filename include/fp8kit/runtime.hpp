// fp8kit/runtime.hpp: which CPU code path runs, on how many threads, and the machine's memory.
//
// The SIMD path is chosen once, on first use, from cpuid (and the OS's saved register state):
// the best the CPU supports, or the one named by the environment variable
// FP8KIT_ISA=avx512|avx2|portable. Naming a path this CPU lacks is an error (fp8kit::Error on
// first use) rather than a silent fallback, so a test that asks for a path really runs it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace fp8kit {

enum class Isa { portable, avx2, avx512 };

std::string_view to_string(Isa isa) noexcept;
std::optional<Isa> try_parse_isa(std::string_view name) noexcept;

bool cpu_supports(Isa isa) noexcept;       // portable: always
std::span<const Isa> supported_isas() noexcept;  // every path this CPU can run, best last
Isa active_isa();                          // resolves FP8KIT_ISA on first call
// Switch paths at run time (benchmarks and tests compare them in one process). Not meant to
// race with conversions running on other threads. Throws fp8kit::Error if unsupported.
void set_isa(Isa isa);
// The cpu backend's GEMM kernels on the active path: "amx" (AMX tiles), "avx512-bf16" (VDPBF16PS,
// on avx512 CPUs without AMX: Zen 4, Zen 5), "avx2" (float32 FMA tiles, also on avx512 CPUs
// without AVX512-BF16 and VBMI) or "portable" - for logs and benchmark reports.
std::string_view gemm_kernels_name();

// Threads used by bulk operations (default: OpenMP's default, normally one per core).
void set_num_threads(int n);  // 1 <= n <= 4096, else fp8kit::Error
int num_threads() noexcept;

// The machine's physical memory in bytes (0 where the OS does not say): what a caller checks a
// size against before allocating it, so that an impossible size is refused up front.
uint64_t physical_memory_bytes() noexcept;

}  // namespace fp8kit
