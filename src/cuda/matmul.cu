// src/cuda/matmul.cu: the cuda backend's f32 / f64 matmul (the high-precision GEMMs of the layers:
// Linear, and Float8Linear's GEMMs not in FP8) and the Linear bias gradient.
//   out[m, n] (+)= op(a)[m, k] . op(b)[k, n] (+ bias[n])
// The product is cuBLASLt's float32 (float64) GEMM: CUBLAS_COMPUTE_32F, which runs on the CUDA
// cores in float32 FMA (no TF32, no tensor cores: their bf16 sums truncate, outside the cpu bound);
// bf16 operands are widened exactly to float32 first. So every output is a float32 sum of exact
// products in some order, plus beta C and the bias each rounded once - the cpu bound of
// docs/NUMERICS.md, (gamma_{K+2} + u) sum |terms|. The bias gradient is a float32 sum per column,
// over chunks of rows and then the chunks, in a fixed order (deterministic; within the cpu bound).
// Checked against the reference backend by the Cuda* tests of tests/ops/test_matmul.cpp.
#include <algorithm>
#include <tuple>

#include "cuda/common.cuh"
#include "cuda/cublaslt.cuh"

namespace fp8kit::cuda {

namespace {

// out[i] = float(in[i]): a bf16 operand widened (exact).
__global__ void widen_bf16_kernel(int64_t n, const __nv_bfloat16* in, float* out) {
    for (int64_t i = grid_first(); i < n; i += grid_step()) {
        out[i] = __bfloat162float(in[i]);
    }
}

// out[i, j] += bias[j] over [m, n]; out[i, j] = 0 first when `clear` (a matmul with K = 0).
template <class T>
__global__ void add_bias_kernel(int64_t m, int64_t n, const T* bias, bool clear, T* out) {
    for (int64_t e = grid_first(); e < m * n; e += grid_step()) {
        const T v = clear ? T(0) : out[e];
        out[e] = bias != nullptr ? v + bias[e % n] : v;
    }
}

// The bias gradient in two passes, so that tall dout fills the GPU: partial[c, o] = the sum of
// dout[r, o] over chunk c of `chunk` rows (at least bias_chunk; in row order; one thread per column
// and chunk), then dbias[o] += the chunks' sums in chunk order. A fixed order, the same every run;
// no element sees more roundings than a plain row-order sum (the cpu bound, gamma_rows).
constexpr int64_t bias_chunk = 256;

template <class T>
__global__ void bias_grad_partial_kernel(int64_t rows, int64_t cols, int64_t chunk, const T* dout, T* partial) {
    const int64_t o = grid_first(), c = blockIdx.y;
    if (o >= cols) return;
    const int64_t end = min(rows, (c + 1) * chunk);
    T sum = dout[c * chunk * cols + o];
    for (int64_t r = c * chunk + 1; r < end; ++r) sum += dout[r * cols + o];
    partial[c * cols + o] = sum;
}

template <class T>
__global__ void bias_grad_sum_kernel(int64_t chunks, int64_t cols, const T* partial, T* dbias) {
    const int64_t o = grid_first();
    if (o >= cols) return;
    T sum = dbias[o];
    for (int64_t c = 0; c < chunks; ++c) sum += partial[c * cols + o];
    dbias[o] = sum;
}

// An f32 operand of `numel` elements: p itself, or a bf16 one widened into `keep`.
const void* as_float(const void* p, DType dtype, int64_t numel, std::shared_ptr<std::byte>& keep, cudaStream_t s) {
    if (dtype != DType::bf16 || numel == 0) return p;
    keep = allocate(size_t(numel) * sizeof(float));
    widen_bf16_kernel<<<blocks_for(numel, 256), 256, 0, s>>>(numel, static_cast<const __nv_bfloat16*>(p),
                                                             reinterpret_cast<float*>(keep.get()));
    check_launch("widen_bf16_kernel");
    return keep.get();
}

// Row-major out[m, n] is column-major out^T [n, m] = op(b)^T . op(a)^T: cuBLASLt's A is b (stored
// [k, n] row-major: column-major [n, k], no transpose; stored [n, k]: transposed) and its B is a.
template <class T>
void launch_matmul(const detail::MatmulJob& j, const void* a, const void* b, cudaStream_t s) {
    static LtAlgos<std::tuple<int64_t, int64_t, int64_t, bool, bool>> algos;
    constexpr bool f64 = std::is_same_v<T, double>;
    constexpr cudaDataType_t type = f64 ? CUDA_R_64F : CUDA_R_32F;
    LtCall call;
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulDescCreate(&call.desc, f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F, type));
    const cublasOperation_t op_b = j.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_a = j.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatmulDescSetAttribute(call.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatrixLayoutCreate(&call.a, type, uint64_t(j.tb ? j.k : j.n), uint64_t(j.tb ? j.n : j.k),
                                               j.tb ? j.k : j.n));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatrixLayoutCreate(&call.b, type, uint64_t(j.ta ? j.m : j.k), uint64_t(j.ta ? j.k : j.m),
                                               j.ta ? j.m : j.k));
    FP8KIT_LT_CHECK(lt_api().cublasLtMatrixLayoutCreate(&call.d, type, uint64_t(j.n), uint64_t(j.m), j.n));
    const T alpha = 1, beta = j.accumulate ? 1 : 0;  // out (C) is read before it is written (D)
    lt_matmul(algos, std::make_tuple(j.m, j.n, j.k, j.ta, j.tb), call, &alpha, b, a, &beta, j.out,
              f64 ? "this float64 matmul" : "this float32 matmul", j.m, j.n, j.k, s);
}

}  // namespace

void matmul(const detail::MatmulJob& j) {
    if (j.m == 0 || j.n == 0) return;
    const cudaStream_t s = stream_of(j.ctx);
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        if (j.k > 0) {
            std::shared_ptr<std::byte> wide_a, wide_b;  // stream-ordered: freed after the GEMM
            const void* a = as_float(j.a, j.a_dtype, j.m * j.k, wide_a, s);
            const void* b = as_float(j.b, j.b_dtype, j.k * j.n, wide_b, s);
            launch_matmul<T>(j, a, b, s);
        }
        const bool clear = j.k == 0 && !j.accumulate;  // an empty sum: out = 0 (+ bias)
        if (j.bias != nullptr || clear) {
            add_bias_kernel<T><<<blocks_for(j.m * j.n, 256), 256, 0, s>>>(j.m, j.n, static_cast<const T*>(j.bias), clear,
                                                                           static_cast<T*>(j.out));
            check_launch("add_bias_kernel");
        }
    });
}

void bias_grad(const detail::BiasGradJob& j) {
    if (j.cols == 0 || j.rows == 0) return;
    const cudaStream_t s = stream_of(j.ctx);
    const int64_t chunk = std::max<int64_t>(bias_chunk, (j.rows + 65534) / 65535);  // at most 65535 chunks (grid y)
    const int64_t chunks = (j.rows + chunk - 1) / chunk;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        const std::shared_ptr<std::byte> keep = allocate(size_t(chunks * j.cols) * sizeof(T));
        T* partial = reinterpret_cast<T*>(keep.get());
        const unsigned across = blocks_for(j.cols, 128, 1u << 30);
        bias_grad_partial_kernel<T><<<dim3(across, unsigned(chunks)), 128, 0, s>>>(j.rows, j.cols, chunk,
                                                                                   static_cast<const T*>(j.dout), partial);
        check_launch("bias_grad_partial_kernel");
        bias_grad_sum_kernel<T><<<across, 128, 0, s>>>(chunks, j.cols, partial, static_cast<T*>(j.dbias));
        check_launch("bias_grad_sum_kernel");
    });
}

}  // namespace fp8kit::cuda
