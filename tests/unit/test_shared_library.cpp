// tests/unit/test_shared_library.cpp: platform::SharedLibrary, and the cuda backend's cuBLASLt
// table loaded through it (src/cuda/cublaslt.cpp) - which needs the library, not a GPU.
// Built with the cuda backend only (its one user).
#include <gtest/gtest.h>

#include <string>

#include "cuda/cublaslt_api.hpp"
#include "fp8kit/error.hpp"
#include "platform/shared_library.hpp"

namespace {

using fp8kit::Error;
using fp8kit::platform::SharedLibrary;

std::string error_of(const auto& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

TEST(SharedLibrary, RefusalNamesEveryNameTried) {
    const std::string e = error_of([] { SharedLibrary({"libfp8kit-absent.so.1", "/nonexistent/libfp8kit-absent.so.1"}); });
    EXPECT_NE(e.find("cannot load a shared library"), std::string::npos) << e;
    EXPECT_NE(e.find("libfp8kit-absent.so.1: "), std::string::npos) << e;
    EXPECT_NE(e.find("/nonexistent/libfp8kit-absent.so.1: "), std::string::npos) << e;
}

TEST(CublasLtTable, EveryFunctionResolvesFromTheHeadersMajorVersion) {
    const fp8kit::cuda::LtApi& api = fp8kit::cuda::lt_api();
#define FP8KIT_LT_EXPECT(f) EXPECT_NE(api.f, nullptr) << #f;
    FP8KIT_LT_FUNCTIONS(FP8KIT_LT_EXPECT)
#undef FP8KIT_LT_EXPECT
    // The loaded library's own version (major * 10000 + minor * 100 + patch): the ABI the headers
    // describe, not merely some libcublasLt.
    EXPECT_EQ(api.cublasLtGetVersion() / 10000, size_t(CUBLAS_VER_MAJOR));
    EXPECT_STREQ(api.cublasLtGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
    EXPECT_EQ(&fp8kit::cuda::lt_api(), &api);  // loaded once
}

TEST(CublasLtTable, AMissingSymbolIsNamed) {
    const SharedLibrary lib(fp8kit::cuda::lt_library_names());
    EXPECT_NE(lib.symbol("cublasLtGetVersion"), nullptr);
    const std::string e = error_of([&] { lib.symbol("fp8kit_no_such_symbol"); });
    EXPECT_NE(e.find("no symbol fp8kit_no_such_symbol in libcublasLt.so."), std::string::npos) << e;
}

}  // namespace
