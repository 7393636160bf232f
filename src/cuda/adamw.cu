// src/cuda/adamw.cu: the cuda backend's AdamW update (torch.optim.AdamW), elementwise in the
// tensor's precision in the cpu backend's order of operations (float32: CUDA's correctly rounded
// sqrtf and division; nvcc's FMA contraction only removes roundings), so the cpu bound of
// docs/NUMERICS.md holds. Checked against the reference backend by tests/ops/test_adamw.cpp
// (CudaMatchesRefWithinTheBound).
#include "cuda/common.cuh"

namespace fp8kit::cuda {

namespace {

template <class T>
__global__ void adamw_kernel(detail::AdamWJob j) {
    T* w = static_cast<T*>(j.param);
    T* m = static_cast<T*>(j.m);
    T* v = static_cast<T*>(j.v);
    const T* g = static_cast<const T*>(j.grad);
    const T lr = T(j.lr), b1 = T(j.beta1), b2 = T(j.beta2), eps = T(j.eps), wd = T(j.weight_decay);
    const T c1 = T(j.c1), c2 = T(j.c2);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < j.n; i += int64_t(gridDim.x) * blockDim.x) {
        const T mi = b1 * m[i] + (T(1) - b1) * g[i];
        const T vi = b2 * v[i] + (T(1) - b2) * g[i] * g[i];
        T wi = w[i];
        wi -= lr * wd * wi;
        wi -= lr * (mi / c1) / (sqrt(vi / c2) + eps);
        m[i] = mi;
        v[i] = vi;
        w[i] = wi;
    }
}

}  // namespace

void adamw_update(const detail::AdamWJob& j) {
    if (j.n == 0) return;
    detail::with_float_type(j.dtype, [&]<class T>(T) {
        adamw_kernel<T><<<blocks_for(j.n, 256), 256, 0, stream_of(j.ctx)>>>(j);
    });
    check_launch("adamw_kernel");
}

}  // namespace fp8kit::cuda
