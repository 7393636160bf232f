// src/cuda/gemm.cu: the CUDA backend's scaled FP8 GEMM, D[m, n] = epilogue(alpha * sum over K
// groups of (A_g . B_g^T) * sa * sb), with B [n, k] as a Linear weight (TN): the dispatch to its
// engines (declared in gemm_kernels.cuh), the first that takes the job:
//  - at a decode step's m <= 2 rows, the CUDA cores reading each code of B once (gemm_gemv.cu;
//    m <= 16 on the tensor cores with FP8KIT_CUDA_GEMV=mma): such a GEMM is bound by B's bytes,
//    which tiles of 128 rows of A do not stream at speed;
//  - cuBLASLt FP8 with a plain epilogue (gemm_cublaslt.cu), for the scalings it takes: tensor x
//    tensor, row x row (outer-vector scales) and block 1x128 x 128x128 (DeepSeek-V3's recipe);
//  - own tensor-core kernels for every other K group of 32 to 128 or all of K (block 1x128 x
//    128x128 with DeepGEMM's numerics, mx32, rowwise, any shape and epilogue): products summed by
//    the tensor cores over at most 128 of K, then promoted into a float32 accumulator with their
//    group's scales, every K group - wgmma m64n128k32 on sm_90 (Hopper) for K groups of 128 or one
//    group (gemm_wgmma.cu), mma.sync m16n8k32 (sm_89 and sm_90a) for the rest (gemm_mma.cu);
//  - a plain CUDA-core kernel for the rest (gemm_simt.cu: e4m3fnuz / e5m2fnuz, which the tensor
//    cores do not take; K groups narrower than 32 or not a multiple of it; unaligned rows).
// The epilogue (beta C, bias, GELU, rounding to f32/bf16/f16) is that of NUMERICS.md in float32.
// High-precision A (the fused cast): A is quantized first by the cuda quantize (the same codes,
// scales and amax as quantize()) into a stream-ordered temporary, then multiplied.
// Checked by tests/ops/test_gemm.cpp (cuda against float64 within the derived bound) when a GPU is
// present; timed by bench/bench_gemm_cuda.cpp against cuBLASLt and torch._scaled_mm.
#include <memory>

#include "cuda/gemm_kernels.cuh"

namespace fp8kit::cuda {

std::shared_ptr<const void> pack_weight(const ExecContext&, const GemmOperand&, int64_t, bool, size_t* bytes) {
    *bytes = 0;  // the kernels read B as it is ([n, k], K contiguous)
    return nullptr;
}

bool unpack_weight(const void*, uint8_t*, int64_t) { return false; }  // nothing packed: B is read as it is

void gemm(GemmJob& job) {
    const cudaStream_t s = stream_of(job.ctx);
    const bool tma = wgmma_tma();  // checked on every GPU, used on sm_90
    std::shared_ptr<std::byte> a_codes;  // the fused cast's A, quantized here
    if (job.fuse != nullptr && job.k == 0) {
        zero(job.fuse->amax, sizeof(float));  // A is [m, 0]: nothing to cast
    } else if (job.fuse != nullptr) {
        a_codes = allocate(size_t(job.m * job.k));
        detail::QuantizeJob q = *job.fuse;
        q.data = reinterpret_cast<uint8_t*>(a_codes.get());
        quantize(q);
        job.a.data = q.data;
        job.a.ld = job.k;
    }
    const bool gemv = gemv_fits(job);
    const LtScales lt = job.k > 0 && !gemv ? lt_scales(job) : LtScales::none;
    if (gemv) {
        launch_gemv(job, s);
    } else if (lt != LtScales::none) {
        launch_lt(job, lt, s);
    } else if (job.k > 0 && wgmma_fits(job)) {  // what mma_fits takes, on sm_90
        launch_wgmma(job, s, tma);
    } else if (job.k > 0 && mma_fits(job)) {
        launch_mma(job, s);
    } else {
        launch_simt(job, s);
    }
}

}  // namespace fp8kit::cuda
