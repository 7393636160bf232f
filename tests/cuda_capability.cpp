// tests/cuda_capability.cpp: the compute capability of the GPU the cuda tests run on, for the tests
// that mirror which kernel the cuda backend picks (tests/ops/test_gemm.cpp: wgmma on sm_90, whose
// FP8 sums keep fewer bits than float32). Built against the CUDA runtime's API where the build has
// the cuda backend (FP8KIT_TEST_CUDA_RUNTIME); 0 otherwise, and when no device answers.
#include "support.hpp"

#ifdef FP8KIT_TEST_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

namespace fp8kit::test {

int cuda_compute_capability() {
#ifdef FP8KIT_TEST_CUDA_RUNTIME
    static const int cc = [] {
        int dev = 0, major = 0, minor = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
            return 0;
        }
        return major * 10 + minor;
    }();
    return cc;
#else
    return 0;
#endif
}

}  // namespace fp8kit::test
