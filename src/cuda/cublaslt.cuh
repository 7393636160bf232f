// src/cuda/cublaslt.cuh: what the cuda backend's two cuBLASLt users share (the scaled FP8 GEMM of
// src/cuda/gemm_cublaslt.cu and the float32 / float64 matmul of src/cuda/matmul.cu) - a handle per
// device and a workspace per call, the status check that names the call, the
// descriptors of one call released on every path, and the call itself with the algorithm chosen
// once per device, shape and operand alignment.
// Checked by the Cuda* tests of tests/ops/test_gemm.cpp and tests/ops/test_matmul.cpp.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/cublaslt_api.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit::cuda {

inline void check_lt(cublasStatus_t st, const char* call) {
    if (st != CUBLAS_STATUS_SUCCESS) {
        throw Error(std::string("fp8kit cuda: ") + call + " failed: " + lt_api().cublasLtGetStatusName(st) + " (" +
                    lt_api().cublasLtGetStatusString(st) + ")");
    }
}
#define FP8KIT_LT_CHECK(call) ::fp8kit::cuda::check_lt((call), #call)

// The process's cuBLASLt handles, one per device (as PyTorch keeps them), made as first used and
// kept until exit (cuBLASLt must not be torn down after the driver). `mutex` guards them and the
// users' algorithm caches. The workspace is each call's own, from the stream-ordered allocator
// (allocate): one for the process, as before 2026-12-04, was written by two GEMMs at once where two
// streams ran them, and was the first device's memory on every other device; a stream-ordered
// allocation is also what a CUDA graph capture takes.
struct Lt {
    static constexpr size_t workspace_bytes = size_t(32) << 20;  // what NVIDIA advises for Hopper
    std::map<int, cublasLtHandle_t> handles;
    std::mutex mutex;
};
inline Lt& lt() {
    static Lt* l = new Lt;
    return *l;
}

// One call's descriptors: the operation and the layouts of its first operand, its second and D
// (C is D), destroyed however the call ends.
struct LtCall {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    LtCall() = default;
    LtCall(const LtCall&) = delete;
    LtCall& operator=(const LtCall&) = delete;
    ~LtCall() {
        if (d) lt_api().cublasLtMatrixLayoutDestroy(d);
        if (b) lt_api().cublasLtMatrixLayoutDestroy(b);
        if (a) lt_api().cublasLtMatrixLayoutDestroy(a);
        if (desc) lt_api().cublasLtMatmulDescDestroy(desc);
    }
};

// The largest power of two, at most 256, that divides p's address. cuBLASLt's heuristic assumes
// 256-byte aligned operands unless told otherwise, and may pick an algorithm that fails (or reads
// misaligned) on a view into a larger tensor; lt_algo tells it each operand's alignment.
inline uint32_t lt_alignment(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    uint32_t r = 256;
    while (r > 1 && a % r != 0) r /= 2;
    return r;
}

// Per shape key, the operands' alignments (packed) and the device, the algorithm chosen.
template <class Key>
using LtAlgos = std::map<std::tuple<Key, uint32_t, int>, cublasLtMatmulAlgo_t>;

// D = alpha op(A) op(B) + beta D on stream s, this thread's current stream (C is D; alpha and beta
// of the call's scale type), with the algorithm cuBLASLt's heuristic gives `call` with its operands
// at a, b and d, asked once per key, alignments and device (the error, when it has none, names
// `what` and its m x n x k), on the current device's handle.
template <class Key>
void lt_matmul(LtAlgos<Key>& cache, const Key& key, const LtCall& call, const void* alpha, const void* a, const void* b,
               const void* beta, void* d, const char* what, int64_t m, int64_t n, int64_t k, cudaStream_t s) {
    const uint32_t align_a = lt_alignment(a), align_b = lt_alignment(b), align_d = lt_alignment(d);
    int device = 0;
    FP8KIT_CUDA_CHECK(cudaGetDevice(&device));
    Lt& l = lt();
    cublasLtHandle_t handle = nullptr;
    cublasLtMatmulAlgo_t algo{};
    {
        std::lock_guard<std::mutex> lock(l.mutex);
        cublasLtHandle_t& h = l.handles[device];
        if (h == nullptr) FP8KIT_LT_CHECK(lt_api().cublasLtCreate(&h));
        handle = h;
        const auto full_key = std::make_tuple(key, align_a | align_b << 9 | align_d << 18, device);
        if (auto it = cache.find(full_key); it != cache.end()) {
            algo = it->second;
        } else {
            cublasLtMatmulPreference_t pref = nullptr;
            FP8KIT_LT_CHECK(lt_api().cublasLtMatmulPreferenceCreate(&pref));
            struct Release {
                cublasLtMatmulPreference_t p;
                ~Release() { lt_api().cublasLtMatmulPreferenceDestroy(p); }
            } release{pref};
            const size_t bytes = Lt::workspace_bytes;
            FP8KIT_LT_CHECK(lt_api().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                                                          sizeof(bytes)));
            const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
                {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
            for (const auto& [attribute, value] : alignments)
                FP8KIT_LT_CHECK(lt_api().cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)));
            cublasLtMatmulHeuristicResult_t result{};
            int found = 0;
            FP8KIT_LT_CHECK(lt_api().cublasLtMatmulAlgoGetHeuristic(handle, call.desc, call.a, call.b, call.d, call.d, pref, 1,
                                                                    &result, &found));
            if (found == 0) {
                throw Error(std::string("fp8kit cuda: cuBLASLt has no algorithm for ") + what + " (" + std::to_string(m) +
                            " x " + std::to_string(n) + " x " + std::to_string(k) + ")");
            }
            algo = cache.emplace(full_key, result.algo).first->second;
        }
    }
    const std::shared_ptr<std::byte> workspace = allocate(Lt::workspace_bytes);  // freed on s after the call
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmul(handle, call.desc, alpha, a, call.a, b, call.b, beta, d, call.d, d, call.d, &algo,
                                            workspace.get(), Lt::workspace_bytes, s));
}

}  // namespace fp8kit::cuda
