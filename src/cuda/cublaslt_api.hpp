// src/cuda/cublaslt_api.hpp: the cuBLASLt functions the cuda backend calls, as a table loaded on
// first use (src/cuda/cublaslt.cpp); host code only, so that a C++ test can include it.
// Checked by tests/unit/test_shared_library.cpp (cuda builds, no GPU needed) and by every Cuda GEMM
// and matmul test on a GPU.
#pragma once

#include <cublasLt.h>

#include <string>
#include <vector>

namespace fp8kit::cuda {

// The cuBLASLt functions fp8kit calls, resolved from libcublasLt on first use (src/cuda/cublaslt.cpp)
// rather than linked: the library is 600 MB with ~180 MB of data that the loader relocates at every
// process start - 0.2 s and 200 MB of RSS for `fp8kit --help` - whether the process uses a GPU or not.
#define FP8KIT_LT_FUNCTIONS(X)                                                                              \
    X(cublasLtCreate) X(cublasLtGetStatusName) X(cublasLtGetStatusString) X(cublasLtGetVersion)             \
    X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic) X(cublasLtMatmulDescCreate)                         \
    X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) X(cublasLtMatmulPreferenceCreate)        \
    X(cublasLtMatmulPreferenceDestroy) X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatrixLayoutCreate) \
    X(cublasLtMatrixLayoutDestroy)
struct LtApi {
#define FP8KIT_LT_MEMBER(f) decltype(&::f) f = nullptr;
    FP8KIT_LT_FUNCTIONS(FP8KIT_LT_MEMBER)
#undef FP8KIT_LT_MEMBER
};
// Loads the library on the first call (fp8kit::Error naming it and why when it cannot be loaded).
const LtApi& lt_api();
// Where lt_api() looks for the library, in order: the soname of the headers' major version (the
// loader's search), then that file in the CUDA toolkit this build was compiled against.
std::vector<std::string> lt_library_names();

}  // namespace fp8kit::cuda
