// src/cuda/device.cu: the CUDA backend's device, memory and tables - whether a GPU can be used,
// stream-ordered allocation for Tensor storage, copies, the delayed-scaling state updates as
// one-thread kernels (no host round trip, so they can be captured in a CUDA graph), the op table
// src/core/backend.cpp dispatches Device::cuda tensors to and the device memory table beside it
// (fp8kit::cuda::ops and memory, declared in core/ops.hpp).
// Checked by tests/unit/test_backend.cpp and the cuda tests of tests/ops (skipped, saying why,
// without a GPU).
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/common.cuh"
#include "fp8kit/error.hpp"
#include "fp8kit/scaling.hpp"

namespace fp8kit::cuda {

void check(cudaError_t e, const char* call) {
    if (e == cudaSuccess) return;
    throw Error(std::string("fp8kit cuda: ") + call + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

namespace {

struct Probe {
    bool ok = false;
    std::string reason;
};

const Probe& probe() noexcept {
    static const Probe p = [] {
        Probe r;
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) {
            r.reason = "no CUDA device";
        } else if (e == cudaErrorInsufficientDriver) {
            r.reason = "no NVIDIA driver (or one older than this CUDA runtime)";
        } else if (e != cudaSuccess) {
            r.reason = std::string("the CUDA runtime failed: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
        } else {
            r.ok = true;
        }
        (void)cudaGetLastError();  // a failed probe is not an error of the next call
        return r;
    }();
    return p;
}

cudaStream_t current_stream() noexcept { return stream_of(current_context()); }

// ---- delayed scaling state (DelayedScaling in <fp8kit/recipe.hpp>), as host_delayed_* ----

__global__ void delayed_init_kernel(float* history, int64_t length, float* scale) {
    for (int64_t i = grid_first(); i < length; i += grid_step()) {
        history[i] = 0.0f;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale = 1.0f;
}

__global__ void delayed_record_kernel(float* history, const float* amax) {
    const float a = *amax;
    if (isnan(a) || a > history[0]) history[0] = a;  // NaN sticks
}

__global__ void delayed_update_kernel(detail::DelayedUpdate u) {
    float a = u.history[0];
    if (u.use_max) {
        for (int64_t i = 0; i < u.length; ++i) {
            const float h = u.history[i];
            if (isnan(h) || h > a) a = h;
            if (isnan(a)) break;
        }
    }
    *u.scale = compute_scale(a, u.fp8_max, u.amax_epsilon, u.power_of_two, *u.scale);
    for (int64_t i = u.length - 1; i > 0; --i) u.history[i] = u.history[i - 1];  // [k] -> [k+1]
    u.history[0] = 0.0f;
}

void delayed_init(const ExecContext& ctx, float* history, int64_t length, float* scale) {
    delayed_init_kernel<<<blocks_for(length, 256, 64), 256, 0, stream_of(ctx)>>>(history, length, scale);
    check_launch("delayed_init_kernel");
}

void delayed_record(const ExecContext& ctx, float* history, const float* amax) {
    delayed_record_kernel<<<1, 1, 0, stream_of(ctx)>>>(history, amax);
    check_launch("delayed_record_kernel");
}

void delayed_update(const ExecContext& ctx, const detail::DelayedUpdate& u) {
    delayed_update_kernel<<<1, 1, 0, stream_of(ctx)>>>(u);
    check_launch("delayed_update_kernel");
}

const detail::BackendOps table{
    &amax,
    &group_amax,
    &quantize,
    &dequantize,
    &pack_weight,
    &unpack_weight,
    &gemm,
    &delayed_init,
    &delayed_record,
    &delayed_update,
    &matmul,
    &bias_grad,
    &layernorm_forward,
    &layernorm_backward,
    &rmsnorm_forward,
    &rmsnorm_backward,
    &gelu_forward,
    &gelu_backward,
    &attention_forward,
    &attention_backward,
    &attention_decode,
    &crossentropy_forward,
    &crossentropy_backward,
    &embedding_forward,
    &embedding_backward,
    &adamw_update,
    &residual_forward,
};

}  // namespace

bool available() noexcept { return probe().ok; }

const std::string& unavailable_reason() noexcept { return probe().reason; }

namespace {

// The device's stream-ordered pool keeps what is freed into it, as torch's caching allocator
// keeps its blocks: with the pool's default release threshold (0) every synchronisation hands its
// memory back to the driver, and the next scratch allocation maps fresh pages. Set once per device.
void keep_freed_memory() {
    static std::mutex mutex;
    static std::vector<bool> done;
    int device = 0;
    FP8KIT_CUDA_CHECK(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex);
    if (size_t(device) < done.size() && done[size_t(device)]) return;
    cudaMemPool_t pool = nullptr;
    FP8KIT_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t all = UINT64_MAX;
    FP8KIT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &all));
    done.resize(std::max(done.size(), size_t(device) + 1));
    done[size_t(device)] = true;
}

}  // namespace

std::shared_ptr<std::byte> allocate(size_t bytes) {
    if (!available()) throw Error("fp8kit: cannot allocate on device cuda: " + unavailable_reason());
    keep_freed_memory();
    const cudaStream_t s = current_stream();
    void* p = nullptr;
    const cudaError_t e = cudaMallocAsync(&p, bytes, s);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        throw Error("fp8kit cuda: cudaMallocAsync of " + std::to_string(bytes) + " bytes failed: " + cudaGetErrorName(e) +
                    " (" + cudaGetErrorString(e) + ")");
    }
    // Freed on the stream it was made on, after the work enqueued there (a deleter cannot throw:
    // a failed free at exit is ignored).
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [s](std::byte* q) { (void)cudaFreeAsync(q, s); });
}

void zero(void* dst, size_t bytes) {
    if (bytes > 0) FP8KIT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, current_stream()));
}

namespace {

void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height, bool wait) {
    if (width == 0 || height == 0) return;
    const cudaStream_t s = current_stream();
    FP8KIT_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDefault, s));
    if (wait) FP8KIT_CUDA_CHECK(cudaStreamSynchronize(s));
}

const detail::DeviceMemory memory_table{
    &allocate,
    &zero,
    &copy_2d,
};

}  // namespace

const detail::BackendOps& ops() noexcept { return table; }

const detail::DeviceMemory& memory() noexcept { return memory_table; }

}  // namespace fp8kit::cuda
