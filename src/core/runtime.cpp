// src/core/runtime.cpp: CPU feature detection, the FP8KIT_ISA override, and the thread count.
//
// Detection asks cpuid for the instruction sets and checks that the OS saves the wide registers
// (XCR0) - through the compiler's cpu model on GCC/Clang, cpuid/xgetbv intrinsics on MSVC - so
// "supported" means the kernels can actually run. Checked by tests/unit/test_runtime.cpp.
#include <cstdlib>
#include <atomic>
#include <string>
#include <vector>

#include <omp.h>

#include "fp8kit/error.hpp"
#include "fp8kit/runtime.hpp"
#include "platform/platform.hpp"

#if defined(__x86_64__) || defined(_M_X64)
#define FP8KIT_X86 1
#if defined(_MSC_VER)
#include <intrin.h>
#else
#include <cpuid.h>
#endif
#endif

namespace fp8kit {

namespace {

#if defined(FP8KIT_X86) && defined(_MSC_VER)
bool detect(Isa isa) {
    if (isa == Isa::portable) return true;
    int l1[4], l7[4], l0[4];
    __cpuidex(l0, 0, 0);
    __cpuidex(l1, 1, 0);
    if (l0[0] < 7 || !((l1[2] >> 27) & 1)) return false;  // no leaf 7, or no OSXSAVE
    __cpuidex(l7, 7, 0);
    const unsigned long long x = _xgetbv(0);
    const bool ymm_saved = (x & 0x6) == 0x6;     // SSE + AVX state
    const bool zmm_saved = (x & 0xe6) == 0xe6;   // + opmask, ZMM_Hi256, Hi16_ZMM
    const bool avx2 = ymm_saved && ((l7[1] >> 5) & 1) && ((l1[2] >> 12) & 1) && ((l1[2] >> 29) & 1);
    if (isa == Isa::avx2) return avx2;
    const unsigned b = unsigned(l7[1]);
    return avx2 && zmm_saved && ((b >> 16) & 1) && ((b >> 17) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1);
}
#elif defined(FP8KIT_X86)
// GCC's and Clang's cpu model checks both cpuid and the OS-saved state (XCR0). F16C (leaf 1,
// ECX bit 29) is not a feature name clang 14 knows, so it is read from cpuid directly; it needs
// no OS state beyond AVX's, which the avx2 check already covers.
bool detect(Isa isa) {
    __builtin_cpu_init();
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && ((ecx >> 29) & 1u);
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
    if (isa == Isa::avx2) return avx2;
    if (isa == Isa::avx512) {
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    }
    return true;
}
#else
bool detect(Isa isa) { return isa == Isa::portable; }
#endif

struct IsaState {
    std::vector<Isa> supported;
    std::atomic<Isa> active{Isa::portable};
    std::string error;  // set when FP8KIT_ISA names something unusable; cleared by set_isa

    IsaState() {
        for (Isa isa : {Isa::portable, Isa::avx2, Isa::avx512}) {
            if (detect(isa)) supported.push_back(isa);
        }
        active = supported.back();
        const char* env = std::getenv("FP8KIT_ISA");
        if (env == nullptr || *env == '\0') return;
        const auto want = try_parse_isa(env);
        if (!want) {
            error = std::string("FP8KIT_ISA='") + env + "' is not a code path, expected avx512, avx2 or portable";
        } else if (!detect(*want)) {
            error = std::string("FP8KIT_ISA='") + env + "' but this CPU (or OS) does not support it";
        } else {
            active = *want;
        }
    }
};

IsaState& isa_state() {
    static IsaState state;
    return state;
}

}  // namespace

std::string_view to_string(Isa isa) noexcept {
    switch (isa) {
        case Isa::avx2: return "avx2";
        case Isa::avx512: return "avx512";
        case Isa::portable: break;
    }
    return "portable";
}

std::optional<Isa> try_parse_isa(std::string_view name) noexcept {
    for (Isa isa : {Isa::portable, Isa::avx2, Isa::avx512}) {
        if (to_string(isa) == name) return isa;
    }
    return std::nullopt;
}

bool cpu_supports(Isa isa) noexcept {
    for (Isa s : isa_state().supported) {
        if (s == isa) return true;
    }
    return false;
}

std::span<const Isa> supported_isas() noexcept { return isa_state().supported; }

Isa active_isa() {
    const IsaState& s = isa_state();
    if (!s.error.empty()) throw Error(s.error);
    return s.active.load(std::memory_order_relaxed);
}

void set_isa(Isa isa) {
    IsaState& s = isa_state();
    if (!cpu_supports(isa)) {
        throw Error("set_isa: '" + std::string(to_string(isa)) + "' is not supported by this CPU (or OS)");
    }
    s.active.store(isa, std::memory_order_relaxed);
    s.error.clear();
}

void set_num_threads(int n) {
    // OpenMP allocates per-thread state up front: a count of millions fails inside libgomp, which
    // ends the process rather than throwing.
    constexpr int most = 4096;
    if (n < 1 || n > most) throw Error("set_num_threads: n is " + std::to_string(n) + ", expected 1 to " + std::to_string(most));
    omp_set_num_threads(n);
}

int num_threads() noexcept { return omp_get_max_threads(); }

uint64_t physical_memory_bytes() noexcept { return platform::physical_memory_bytes(); }

}  // namespace fp8kit
