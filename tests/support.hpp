// tests/support.hpp: helpers shared by the tests - the golden data folder, unique temporary
// paths, running a body on every CPU code path (and saying at the end of the test program which
// paths ran and which this CPU lacks), and comparing FP8 codes with "any NaN equals any NaN".
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>
#include <string>

#include "fp8kit/backend.hpp"
#include "fp8kit/error.hpp"
#include "fp8kit/format.hpp"
#include "fp8kit/quantize.hpp"
#include "fp8kit/runtime.hpp"

namespace fp8kit::test {

// The golden vectors folder (CMake cache variable FP8KIT_TESTDATA_DIR); tests fail loudly if it is
// missing rather than skipping.
// Appended in place: GCC 12's -Warray-bounds misreads `std::string(...) + "/" + file` at -O1.
inline std::string testdata(const char* file) {
    std::string path = FP8KIT_TESTDATA_DIR;
    path += '/';
    path += file;
    return path;
}

// A path prefix in the temporary directory no other test process uses at the same time.
inline std::string unique_temp_stem(const std::string& tag) {
    return (std::filesystem::temp_directory_path() / ("fp8kit_" + tag + "_" + std::to_string(std::random_device{}()))).string();
}

inline uint32_t bits(float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
}
inline float from_bits(uint32_t b) {
    float x;
    std::memcpy(&x, &b, 4);
    return x;
}

// The code paths for_each_isa ran in this process; printed when the test program ends, with the
// GEMM kernels each path ran (gemm_kernels_name()), the paths and GEMM kernels it did not run and
// why (the CPU lacks them, or FP8KIT_ISA picked one), so a log shows which paths a run covered.
inline std::set<Isa>& isas_run() {
    static std::set<Isa> run;
    return run;
}
class IsaCoverageReport : public ::testing::Environment {
public:
    void TearDown() override {
        if (isas_run().empty()) return;  // this program has no per-path tests
        std::string ran, lacked, not_picked;
        std::set<std::string> kernels_not_run = {"amx", "avx512-bf16", "avx2", "portable"};
        const Isa saved = active_isa();
        for (Isa isa : {Isa::portable, Isa::avx2, Isa::avx512}) {
            const bool was_run = isas_run().count(isa) != 0;
            std::string& list = was_run ? ran : !cpu_supports(isa) ? lacked : not_picked;
            list += (list.empty() ? "" : ", ") + std::string(to_string(isa));
            if (!was_run) continue;
            set_isa(isa);
            const std::string kernels(gemm_kernels_name());
            kernels_not_run.erase(kernels);
            list += " (GEMM kernels " + kernels + ")";
        }
        set_isa(saved);
        std::string kernels;
        for (const std::string& k : kernels_not_run) kernels += (kernels.empty() ? "" : ", ") + k;
        std::printf("[ ISA paths ] ran: %s; skipped, this CPU lacks them: %s; not run, FP8KIT_ISA chose another: %s; "
                    "GEMM kernels not run (this CPU, build or FP8KIT_ISA): %s\n",
                    ran.c_str(), lacked.empty() ? "none" : lacked.c_str(), not_picked.empty() ? "none" : not_picked.c_str(),
                    kernels.empty() ? "none" : kernels.c_str());
    }
};
inline ::testing::Environment* const isa_coverage_report = ::testing::AddGlobalTestEnvironment(new IsaCoverageReport);

// Runs body() once per code path this CPU supports, with that path active; restores the path.
// With FP8KIT_ISA set (the ISA-override tests, tests/CMakeLists.txt) only the path it names runs,
// the one the library chose at process start (active_isa() throws if it cannot have it).
template <class Body>
void for_each_isa(Body&& body) {
    const Isa saved = active_isa();
    const char* env = std::getenv("FP8KIT_ISA");
    const bool only_saved = env != nullptr && *env != '\0';
    for (Isa isa : supported_isas()) {
        if (only_saved && isa != saved) continue;
        SCOPED_TRACE(std::string("isa=") + std::string(to_string(isa)));
        set_isa(isa);
        isas_run().insert(isa);
        body(isa);
    }
    set_isa(saved);
}

// fn() with host tensors running on backend b (a BackendOverride on this thread), returning what
// fn returns; the override ends with fn, also when fn throws. Backend::cuda has no override: fn
// runs as it is, and the cuda backend takes the tensors fn makes on Device::cuda.
template <class Fn>
auto on_backend(Backend b, Fn&& fn) {
    if (b == Backend::cuda) return fn();
    const BackendOverride use(b);
    return fn();
}

// body() on every available backend: ref first (the ground truth), then the others; cpu once per
// code path this CPU supports.
template <class Body>
void for_each_backend(Body&& body) {
    for (Backend b : available_backends()) {
        SCOPED_TRACE(std::string("backend=") + std::string(to_string(b)));
        on_backend(b, [&] {
            if (b == Backend::cpu) {
                for_each_isa([&](Isa) { body(); });
            } else {
                body();
            }
            return 0;
        });
    }
}

// Why the cuda backend cannot run here - this build has no CUDA backend, or the machine has no
// GPU or no NVIDIA driver - or "" when it can. Any other failure (a driver that is there but
// fails) is a test failure, not a reason to skip.
inline std::string cuda_absent_reason() {
    if (backend_available(Backend::cuda)) return "";
    try {
        (void)backend_for(Device::cuda);
    } catch (const Error& e) {
        const std::string m = e.what();
        for (const char* absent : {"has no CUDA backend", "no CUDA device", "no NVIDIA driver"}) {
            if (m.find(absent) != std::string::npos) return m;
        }
        ADD_FAILURE() << "the cuda backend failed: " << m;
        return m;
    }
    ADD_FAILURE() << "backend_available(cuda) is false, yet backend_for(cuda) succeeds";
    return "inconsistent";
}
// At the top of a cuda test: skips it, saying why, when the cuda backend is absent.
#define FP8KIT_SKIP_WITHOUT_CUDA()                                              \
    do {                                                                        \
        const std::string fp8kit_absent = ::fp8kit::test::cuda_absent_reason(); \
        if (!fp8kit_absent.empty()) GTEST_SKIP() << fp8kit_absent;              \
    } while (0)

// The compute capability (major * 10 + minor) of the cuda tests' GPU, 0 without one or without the
// cuda backend (tests/cuda_capability.cpp, linked into the binaries that ask).
int cuda_compute_capability();

// For a test with a cuda part beside its host checks: true when the cuda backend can run; else it
// prints which part did not run and why (a failing driver fails the test, as cuda_absent_reason).
inline bool cuda_part_runs(const char* part) {
    const std::string absent = cuda_absent_reason();
    if (!absent.empty()) std::printf("[ cuda ] %s: not run here: %s\n", part, absent.c_str());
    return absent.empty();
}

// Codes agree: identical, or both NaN in format f (any NaN code is a correct NaN).
inline bool same_code(uint8_t a, uint8_t b, Format f) { return a == b || (is_nan(a, f) && is_nan(b, f)); }

// Floats agree bit for bit, or are both NaN.
inline bool same_float(float a, float b) { return bits(a) == bits(b) || (a != a && b != b); }

// Runs fn and expects fp8kit::Error whose message contains `needle`.
template <class Fn>
void expect_error(Fn&& fn, const std::string& needle) {
    try {
        fn();
        ADD_FAILURE() << "no fp8kit::Error (expected one mentioning '" << needle << "')";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
            << "message '" << e.what() << "' does not mention '" << needle << "'";
    }
}

inline std::string hex(uint32_t v, int digits) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%0*x", digits, v);
    return buf;
}

}  // namespace fp8kit::test
