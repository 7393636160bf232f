// src/cuda/layernorm.cu: the cuda backend's LayerNorm and RMSNorm forward/backward (as
// torch.nn.LayerNorm / torch.nn.RMSNorm), in the cpu backend's arithmetic: row statistics and the
// input gradient summed in double (one block a row, a fixed reduction tree), each output formed
// in the tensor's precision, fl(fl(norm) * w) + b; the parameter gradients a float32 sum per
// column over the rows in order (one thread a column), as the cpu backend's. So the cpu bounds of
// docs/NUMERICS.md hold. Checked against the reference backend by tests/ops/test_layernorm.cpp
// (CudaMatchesRefWithinTheBound).
#include "cuda/common.cuh"

namespace fp8kit::cuda {

namespace {

constexpr int row_threads = 256;

// One block per row r of inp [rows, c]: mean and rstd (layernorm; rmsnorm: rstd from the mean
// square), out = fl(norm) * w (+ b).
template <class T, bool centered>
__global__ void norm_forward_kernel(detail::NormJob j) {
    __shared__ double scratch[32];
    const int64_t r = blockIdx.x, c = j.c;
    const T* x = static_cast<const T*>(j.inp) + r * c;
    const T* w = static_cast<const T*>(j.weight);
    const T* b = static_cast<const T*>(j.bias);
    double m = 0.0;
    if (centered) {
        double s = 0.0;
        for (int64_t i = threadIdx.x; i < c; i += blockDim.x) s += double(x[i]);
        m = block_reduce(s, Sum{}, 0.0, scratch) / double(c);
    }
    double v = 0.0;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) v += (double(x[i]) - m) * (double(x[i]) - m);
    const double rs = 1.0 / sqrt(block_reduce(v, Sum{}, 0.0, scratch) / double(c) + j.eps);
    T* out = static_cast<T*>(j.out) + r * c;
    for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
        const T nw = T((double(x[i]) - m) * rs) * w[i];
        out[i] = centered ? nw + b[i] : nw;
    }
    if (threadIdx.x == 0) {
        if (centered) static_cast<T*>(j.mean)[r] = T(m);
        static_cast<T*>(j.rstd)[r] = T(rs);
    }
}

// One block per row: dinp from the saved mean and rstd, in double, rounded once.
//   layernorm: dx = rstd (dn - mean(dn) - norm mean(dn norm)),  dn = dout w, norm = (x - mean) rstd
//   rmsnorm:   dx = rstd w g - rstd^3 x / C sum_j w_j g_j x_j   (the cpu backend's form)
template <class T, bool centered>
__global__ void norm_backward_input_kernel(detail::NormBackwardJob j) {
    __shared__ double scratch[32];
    const int64_t r = blockIdx.x, c = j.c;
    const T* x = static_cast<const T*>(j.inp) + r * c;
    const T* g = static_cast<const T*>(j.dout) + r * c;
    const T* w = static_cast<const T*>(j.weight);
    const double m = centered ? double(static_cast<const T*>(j.mean)[r]) : 0.0;
    const double rs = double(static_cast<const T*>(j.rstd)[r]);
    T* dx = static_cast<T*>(j.dinp) + r * c;
    if (centered) {
        double dm = 0.0, dnm = 0.0;
        for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
            const double norm = (double(x[i]) - m) * rs, dn = double(g[i]) * double(w[i]);
            dm += dn;
            dnm += dn * norm;
        }
        dm = block_reduce(dm, Sum{}, 0.0, scratch) / double(c);
        dnm = block_reduce(dnm, Sum{}, 0.0, scratch) / double(c);
        for (int64_t i = threadIdx.x; i < c; i += blockDim.x) {
            const double norm = (double(x[i]) - m) * rs;
            dx[i] = T((double(g[i]) * double(w[i]) - dm - norm * dnm) * rs);
        }
    } else {
        double dot = 0.0;
        for (int64_t i = threadIdx.x; i < c; i += blockDim.x) dot += double(w[i]) * double(g[i]) * double(x[i]);
        dot = block_reduce(dot, Sum{}, 0.0, scratch);
        for (int64_t i = threadIdx.x; i < c; i += blockDim.x)
            dx[i] = T(rs * double(w[i]) * double(g[i]) - rs * rs * rs * double(x[i]) * dot / double(c));
    }
}

// dweight[i] += sum_r dout[r, i] norm[r, i], dbias[i] += sum_r dout[r, i]: one thread per column,
// the rows in order, in T (norm = (x - mean) rstd in T, as the cpu backend's).
template <class T, bool centered>
__global__ void norm_backward_params_kernel(detail::NormBackwardJob j) {
    const int64_t i = grid_first();
    if (i >= j.c) return;
    const T* x = static_cast<const T*>(j.inp);
    const T* g = static_cast<const T*>(j.dout);
    const T* mean = static_cast<const T*>(j.mean);
    const T* rstd = static_cast<const T*>(j.rstd);
    T dw = static_cast<T*>(j.dweight)[i], db = centered ? static_cast<T*>(j.dbias)[i] : T(0);
    for (int64_t r = 0; r < j.rows; ++r) {
        const T xi = x[r * j.c + i], gi = g[r * j.c + i];
        if (centered) {
            dw += gi * ((xi - mean[r]) * rstd[r]);
            db += gi;
        } else {
            dw += gi * xi * rstd[r];
        }
    }
    static_cast<T*>(j.dweight)[i] = dw;
    if (centered) static_cast<T*>(j.dbias)[i] = db;
}

template <bool centered>
void norm_forward(const detail::NormJob& j) {
    if (j.rows == 0 || j.c == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        norm_forward_kernel<T, centered><<<unsigned(j.rows), row_threads, 0, stream_of(j.ctx)>>>(j);
    });
    check_launch("norm_forward_kernel");
}

template <bool centered>
void norm_backward(const detail::NormBackwardJob& j) {
    if (j.rows == 0 || j.c == 0) return;
    const cudaStream_t s = stream_of(j.ctx);
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        norm_backward_input_kernel<T, centered><<<unsigned(j.rows), row_threads, 0, s>>>(j);
        check_launch("norm_backward_input_kernel");
        norm_backward_params_kernel<T, centered><<<blocks_for(j.c, 128), 128, 0, s>>>(j);
        check_launch("norm_backward_params_kernel");
    });
}

}  // namespace

void layernorm_forward(const detail::NormJob& j) { norm_forward<true>(j); }
void layernorm_backward(const detail::NormBackwardJob& j) { norm_backward<true>(j); }
void rmsnorm_forward(const detail::NormJob& j) { norm_forward<false>(j); }
void rmsnorm_backward(const detail::NormBackwardJob& j) { norm_backward<false>(j); }

}  // namespace fp8kit::cuda
