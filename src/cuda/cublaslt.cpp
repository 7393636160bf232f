// src/cuda/cublaslt.cpp: cublaslt_api.hpp's LtApi - libcublasLt loaded on the first cuBLASLt call and
// its functions looked up by name. The OS loader's search comes first (LD_LIBRARY_PATH, the cache,
// a copy torch has already loaded), then the CUDA toolkit this build was compiled against.
// Checked by tests/unit/test_shared_library.cpp (without a GPU) and by every Cuda GEMM and matmul
// test (tests/ops/test_gemm.cpp, tests/ops/test_matmul.cpp) on one.
#include <string>

#include "cuda/cublaslt_api.hpp"
#include "platform/shared_library.hpp"

namespace fp8kit::cuda {

std::vector<std::string> lt_library_names() {
    // The soname of the cuBLASLt major version the headers are from: its ABI.
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    return {soname, std::string(FP8KIT_CUDA_LIBRARY_DIR) + "/" + soname};
}

const LtApi& lt_api() {
    static const LtApi api = [] {
        static const platform::SharedLibrary lib(lt_library_names());
        LtApi r;
#define FP8KIT_LT_RESOLVE(f) r.f = reinterpret_cast<decltype(&::f)>(lib.symbol(#f));
        FP8KIT_LT_FUNCTIONS(FP8KIT_LT_RESOLVE)
#undef FP8KIT_LT_RESOLVE
        return r;
    }();
    return api;
}

}  // namespace fp8kit::cuda
