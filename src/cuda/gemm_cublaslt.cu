// src/cuda/gemm_cublaslt.cu: the cuda GEMM through cuBLASLt FP8, for the scalings it takes with a
// plain epilogue: tensor x tensor, row x row (outer-vector scales) and block 1x128 x 128x128
// (VEC128 / BLK128x128 scales, DeepSeek-V3's recipe), dimensions multiples of 16 (K of 128 for
// blocks). Its scale pointers take the device scale_inv of each operand (A's 1x128 scales
// transposed on the device): no host round trip.
// Checked by tests/ops/test_gemm.cpp (cuda against float64 within the derived bound) when a GPU is
// present; timed by bench/bench_gemm_cuda.cpp.
#include <memory>
#include <tuple>

#include "cuda/cublaslt.cuh"
#include "cuda/gemm_kernels.cuh"

namespace fp8kit::cuda {

namespace {

cudaDataType_t lt_type(Format f) { return f == Format::e4m3fn ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
cudaDataType_t lt_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : t == DType::f16 ? CUDA_R_16F : CUDA_R_32F; }

// scale_t[kb][i] = scale[i][kb]: A's 1x128 scales as cuBLASLt's VEC128 reads them.
__global__ void transpose_scales_kernel(const float* scale, int64_t rows, int64_t cols, float* scale_t) {
    for (int64_t e = grid_first(); e < rows * cols; e += grid_step()) {
        scale_t[(e % cols) * rows + e / cols] = scale[e];
    }
}

}  // namespace

// The scalings cuBLASLt FP8 takes on Hopper and Ada, with a plain epilogue: tensor x tensor, row x
// row (its outer-vector scales), block 1x128 x 128x128 (its VEC128 and BLK128x128 scales; K a
// multiple of 128). n and k multiples of 16, rows contiguous and 16-byte aligned; m (cuBLASLt's
// n: the columns of D^T, which no alignment rule reaches) any for tensor and row scaling, as
// torch._scaled_mm takes it, a multiple of 16 for blocks (gemm() gives m <= 2 - m <= 16 with
// FP8KIT_CUDA_GEMV=mma - to gemm_gemv.cu first, which streams B faster there).
LtScales lt_scales(const GemmJob& j) {
    if (!tensor_core_format(j.a.format) || !tensor_core_format(j.b.format) || j.a.e8m0 || j.b.e8m0 ||
        j.c.data != nullptr || j.bias != nullptr || j.activation != Activation::none || j.n % 16 != 0 ||
        j.k % 16 != 0 || j.a.ld != j.k || j.b.ld != j.k || !aligned16(j.a.data) || !aligned16(j.b.data) ||
        !aligned16(j.out) || !mma_fits(j)) {
        return LtScales::none;
    }
    const GroupShape ga = j.a.group, gb = j.b.group;
    if (ga.rows >= j.m && ga.cols >= j.k && gb.rows >= j.n && gb.cols >= j.k) return LtScales::tensor;
    if (ga.rows == 1 && ga.cols >= j.k && gb.rows == 1 && gb.cols >= j.k) return LtScales::row;
    if (ga == GroupShape{1, 128} && gb == GroupShape{128, 128} && j.k % 128 == 0 && j.m % 16 == 0) return LtScales::block;
    return LtScales::none;
}

// D^T [n, m] (column-major: D row-major) = op(B)^T-layout x A: cuBLASLt's "TN" with B as its A.
void launch_lt(const GemmJob& j, LtScales scales, cudaStream_t s) {
    static LtAlgos<std::tuple<int64_t, int64_t, int64_t, int, int, int, int>> algos;
    LtCall call;
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulDescCreate(&call.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)));
    const void* scale_b = j.b.scale_inv;  // cuBLASLt's A is fp8kit's B
    const void* scale_a = j.a.scale_inv;
    std::shared_ptr<std::byte> a_scales_t, b_scales_padded;  // stream-ordered: freed after the GEMM
    int32_t mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    if (scales == LtScales::row) {
        mode_a = mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    } else if (scales == LtScales::block) {
        mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        const int64_t kb = j.k / 128;
        a_scales_t = allocate(size_t(j.m * kb) * sizeof(float));
        transpose_scales_kernel<<<blocks_for(j.m * kb, 256, 4096), 256, 0, s>>>(
            static_cast<const float*>(j.a.scale_inv), j.m, kb, reinterpret_cast<float*>(a_scales_t.get()));
        check_launch("transpose_scales_kernel");
        scale_a = a_scales_t.get();
        const int64_t kb4 = (kb + 3) / 4 * 4, nb = (j.n + 127) / 128;
        if (kb4 != kb) {  // B's scale rows padded to kb4 (seen on an H200: unpadded, D was wrong past N = 128)
            b_scales_padded = allocate(size_t(nb * kb4) * sizeof(float));
            FP8KIT_CUDA_CHECK(cudaMemcpy2DAsync(b_scales_padded.get(), size_t(kb4) * sizeof(float), j.b.scale_inv,
                                                size_t(kb) * sizeof(float), size_t(kb) * sizeof(float), size_t(nb),
                                                cudaMemcpyDeviceToDevice, s));
            scale_b = b_scales_padded.get();
        }
    }
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_b, sizeof(mode_b)));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_a, sizeof(mode_a)));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_b, sizeof(scale_b)));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_a, sizeof(scale_a)));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatrixLayoutCreate(&call.a, lt_type(j.b.format), uint64_t(j.k), uint64_t(j.n), j.b.ld));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatrixLayoutCreate(&call.b, lt_type(j.a.format), uint64_t(j.k), uint64_t(j.m), j.a.ld));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatrixLayoutCreate(&call.d, lt_type(j.out_dtype), uint64_t(j.n), uint64_t(j.m), j.n));
    const auto key = std::make_tuple(j.m, j.n, j.k, int(j.a.format), int(j.b.format), int(j.out_dtype), int(scales));
    const float alpha = j.alpha, beta = 0.0f;
    lt_matmul(algos, key, call, &alpha, j.b.data, j.a.data, &beta, j.out, "this FP8 GEMM", j.m, j.n, j.k, s);
}

}  // namespace fp8kit::cuda
