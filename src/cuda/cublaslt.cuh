// src/cuda/cublaslt.cuh: what the cuda backend's two cuBLASLt users share (the scaled FP8 GEMM of
// src/cuda/gemm_cublaslt.cu and the float32 / float64 matmul of src/cuda/matmul.cu) - the one handle and
// workspace, the status check that names the call, the descriptors of one call released on every
// path, and the cached choice of algorithm per shape and operand alignment.
// Checked by the Cuda* tests of tests/ops/test_gemm.cpp and tests/ops/test_matmul.cpp.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
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

// The process's handle and workspace, made on first use; they live until exit (cuBLASLt must not
// be torn down after the driver). `mutex` guards the users' algorithm caches.
struct Lt {
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    size_t workspace_bytes = 32u << 20;
    std::mutex mutex;
};
inline Lt& lt() {
    static Lt* l = [] {
        auto* r = new Lt;
        FP8KIT_LT_CHECK(lt_api().cublasLtCreate(&r->handle));
        FP8KIT_CUDA_CHECK(cudaMalloc(&r->workspace, r->workspace_bytes));
        return r;
    }();
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

// Per shape key and the operands' alignments (packed), the algorithm chosen.
template <class Key>
using LtAlgos = std::map<std::pair<Key, uint32_t>, cublasLtMatmulAlgo_t>;

// The algorithm cuBLASLt's heuristic gives `call` with its operands at a, b and d (C is D), asked
// once per key and alignments (the error, when it has none, names `what` and its m x n x k).
template <class Key>
cublasLtMatmulAlgo_t lt_algo(LtAlgos<Key>& cache, const Key& key, const LtCall& call, const void* a, const void* b,
                             const void* d, const char* what, int64_t m, int64_t n, int64_t k) {
    const uint32_t align_a = lt_alignment(a), align_b = lt_alignment(b), align_d = lt_alignment(d);
    const auto full_key = std::make_pair(key, align_a | align_b << 9 | align_d << 18);
    Lt& l = lt();
    std::lock_guard<std::mutex> lock(l.mutex);
    if (auto it = cache.find(full_key); it != cache.end()) return it->second;
    cublasLtMatmulPreference_t pref = nullptr;
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulPreferenceCreate(&pref));
    struct Release {
        cublasLtMatmulPreference_t p;
        ~Release() { lt_api().cublasLtMatmulPreferenceDestroy(p); }
    } release{pref};
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &l.workspace_bytes,
                                                         sizeof(l.workspace_bytes)));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_d},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
    for (const auto& [attribute, bytes] : alignments)
        FP8KIT_LT_CHECK(lt_api().cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof(bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulAlgoGetHeuristic(l.handle, call.desc, call.a, call.b, call.d, call.d, pref, 1, &result, &found));
    if (found == 0) {
        throw Error(std::string("fp8kit cuda: cuBLASLt has no algorithm for ") + what + " (" + std::to_string(m) + " x " +
                    std::to_string(n) + " x " + std::to_string(k) + ")");
    }
    return cache.emplace(full_key, result.algo).first->second;
}

}  // namespace fp8kit::cuda
