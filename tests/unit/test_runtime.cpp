// tests/unit/test_runtime.cpp: code path selection and threads. ctest runs this binary once per
// path with FP8KIT_ISA set (and once with a bad value) to check the override really selects it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "fp8kit/error.hpp"
#include "support.hpp"

namespace fp8kit::test {
namespace {

TEST(Runtime, SupportedPathsAreOrderedAndSwitchable) {
    const auto isas = supported_isas();
    ASSERT_FALSE(isas.empty());
    const Isa initial = active_isa();
    EXPECT_EQ(isas.front(), Isa::portable);
    EXPECT_TRUE(cpu_supports(Isa::portable));
    for (Isa isa : isas) {
        EXPECT_EQ(try_parse_isa(to_string(isa)), isa);
        set_isa(isa);
        EXPECT_EQ(active_isa(), isa);
    }
    EXPECT_FALSE(try_parse_isa("sse2").has_value());
    set_isa(initial);
}

// FP8KIT_ISA names the path in force from the start (ctest sets it; unset means "the best").
TEST(Runtime, EnvironmentOverrideSelectsThePath) {
    const char* env = std::getenv("FP8KIT_ISA");
    const auto want = env && *env ? try_parse_isa(env) : std::optional<Isa>(supported_isas().back());
    if (!want || !cpu_supports(*want)) {
        EXPECT_THROW(active_isa(), Error) << "FP8KIT_ISA=" << (env ? env : "") << " must be refused";
        return;
    }
    EXPECT_EQ(active_isa(), *want);
}

// The GEMM kernels each path runs (gemm_kernels_name): portable and avx2 their own; avx512 the
// AMX tiles where they run, else VDPBF16PS where the CPU has AVX512-BF16 and VBMI, else AVX2's -
// never the portable kernel, and never AVX2's on a CPU with AVX512-BF16 (the kernel set that is
// 3x faster there, docs/PERF.md).
TEST(Runtime, GemmKernelsFollowThePathAndTheCpu) {
    const Isa initial = active_isa();
    for (Isa isa : supported_isas()) {
        set_isa(isa);
        const std::string name(gemm_kernels_name());
        SCOPED_TRACE(std::string(to_string(isa)) + " runs " + name);
        if (isa == Isa::portable) {
            EXPECT_EQ(name, "portable");
        }
        if (isa == Isa::avx2) {
            EXPECT_EQ(name, "avx2");
        }
        if (isa != Isa::avx512) continue;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
        const bool bf16 = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
        EXPECT_TRUE(name == "amx" || name == (bf16 ? "avx512-bf16" : "avx2"));
#else
        EXPECT_TRUE(name == "amx" || name == "avx512-bf16" || name == "avx2");
#endif
    }
    set_isa(initial);
}

TEST(Runtime, UnsupportedPathIsRefused) {
    for (Isa isa : {Isa::avx2, Isa::avx512}) {
        if (!cpu_supports(isa)) {
            EXPECT_THROW(set_isa(isa), Error);
        }
    }
    EXPECT_THROW(set_num_threads(-1), Error);
    // a billion threads: refused here, where libgomp would end the process allocating their state
    EXPECT_THROW(set_num_threads(1000000000), Error);
    EXPECT_THROW(set_num_threads(4097), Error);
    set_num_threads(4096);
    EXPECT_EQ(num_threads(), 4096);
    set_num_threads(2);
    EXPECT_EQ(num_threads(), 2);
}

}  // namespace
}  // namespace fp8kit::test
