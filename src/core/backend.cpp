// src/core/backend.cpp: the backend registry - which backends this build has, which one runs the
// tensors of a device on this thread (FP8KIT_BACKEND, BackendOverride), each one's table of
// operations and a device's memory table, the per-thread execution context, and the dispatch of an
// operation by the device of its inputs.
// Checked by tests/unit/test_backend.cpp.
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/ops.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit {

namespace {

constexpr Backend host_backends[] = {Backend::ref, Backend::cpu};

#define FP8KIT_BACKEND_OPS(ns)                                                                      \
    detail::BackendOps {                                                                            \
        &ns::amax, &ns::group_amax, &ns::quantize, &ns::dequantize, &ns::pack_weight,              \
            &ns::unpack_weight, &ns::gemm,                                                          \
            &detail::host_delayed_init, &detail::host_delayed_record, &detail::host_delayed_update, \
            &ns::matmul, &ns::bias_grad, &ns::layernorm_forward, &ns::layernorm_backward,           \
            &ns::rmsnorm_forward, &ns::rmsnorm_backward, &ns::gelu_forward, &ns::gelu_backward,     \
            &ns::attention_forward, &ns::attention_backward, &ns::attention_decode,                 \
            &ns::crossentropy_forward,                                                              \
            &ns::crossentropy_backward, &ns::embedding_forward, &ns::embedding_backward,            \
            &ns::adamw_update, &ns::residual_forward                                                \
    }
constexpr detail::BackendOps ref_ops = FP8KIT_BACKEND_OPS(ref);
constexpr detail::BackendOps cpu_ops = FP8KIT_BACKEND_OPS(cpu);
#undef FP8KIT_BACKEND_OPS

// FP8KIT_BACKEND, read once: the host backend when no override is active.
Backend environment_host_backend() {
    static Backend chosen = Backend::cpu;
    static std::once_flag read;
    std::call_once(read, [] {
        const char* env = std::getenv("FP8KIT_BACKEND");
        if (env == nullptr || *env == '\0') return;
        const auto b = try_parse_backend(env);
        if (!b || *b == Backend::cuda || !backend_available(*b)) {
            throw Error("FP8KIT_BACKEND=" + std::string(env) + " is not a host backend of this build, expected ref or cpu");
        }
        chosen = *b;
    });
    return chosen;
}

thread_local std::optional<Backend> host_override;
thread_local ExecContext context;

}  // namespace

std::string_view to_string(Backend b) noexcept {
    constexpr std::string_view names[] = {"ref", "cpu", "cuda"};
    return names[uint8_t(b)];
}

std::optional<Backend> try_parse_backend(std::string_view name) noexcept {
    for (Backend b : {Backend::ref, Backend::cpu, Backend::cuda}) {
        if (to_string(b) == name) return b;
    }
    return std::nullopt;
}

bool backend_available(Backend b) noexcept {
#ifdef FP8KIT_HAS_CUDA
    return b != Backend::cuda || cuda::available();
#else
    return b != Backend::cuda;
#endif
}

std::span<const Backend> available_backends() noexcept { return host_backends; }

Backend backend_for(Device device) {
    if (device == Device::cuda) {
#ifdef FP8KIT_HAS_CUDA
        if (!cuda::available()) throw Error("fp8kit: a tensor is on device cuda, but " + cuda::unavailable_reason());
#else
        throw Error("fp8kit: a tensor is on device cuda, but this build has no CUDA backend (-DFP8KIT_CUDA=ON)");
#endif
        return Backend::cuda;
    }
    const Backend env = environment_host_backend();  // a bad FP8KIT_BACKEND fails even under an override
    return host_override.value_or(env);
}

BackendOverride::BackendOverride(Backend b) : saved_(host_override) {
    if (b == Backend::cuda || !backend_available(b)) {
        throw Error("fp8kit::BackendOverride: backend " + std::string(to_string(b)) +
                    " does not run host tensors in this build, expected ref or cpu");
    }
    host_override = b;
}

BackendOverride::~BackendOverride() { host_override = saved_; }

ExecContext current_context() noexcept { return context; }

ContextGuard::ContextGuard(ExecContext ctx) noexcept : saved_(context) { context = ctx; }

ContextGuard::~ContextGuard() { context = saved_; }

const detail::BackendOps& detail::backend_ops(Backend b) {
    switch (b) {
        case Backend::ref: return ref_ops;
        case Backend::cpu: return cpu_ops;
        case Backend::cuda:
#ifdef FP8KIT_HAS_CUDA
            if (cuda::available()) return cuda::ops();
            throw Error("fp8kit: backend cuda is not available: " + cuda::unavailable_reason());
#else
            break;
#endif
    }
    throw Error("fp8kit: backend cuda is not available in this build");
}

const detail::DeviceMemory& detail::device_memory([[maybe_unused]] Device device, [[maybe_unused]] const char* fn) {
#ifdef FP8KIT_HAS_CUDA
    return cuda::memory();  // the one device besides the host
#else
    throw Error(std::string("fp8kit::Tensor::") + fn + ": device cuda needs the CUDA backend, which this build does not have");
#endif
}

detail::Dispatch detail::dispatch(const char* fn, std::initializer_list<Input> inputs) {
    const Input* first = nullptr;
    for (const Input& in : inputs) {
        if (in.tensor == nullptr || !in.tensor->defined()) continue;
        if (first == nullptr) {
            first = &in;
        } else if (in.tensor->device() != first->tensor->device()) {
            throw Error(std::string("fp8kit::") + fn + ": " + first->name + " is on " +
                        std::string(to_string(first->tensor->device())) + " but " + in.name + " is on " +
                        std::string(to_string(in.tensor->device())) + "; move them to one device first");
        }
    }
    const Device device = first != nullptr ? first->tensor->device() : Device::cpu;
    const Backend b = backend_for(device);
    return {backend_ops(b), b, device, current_context()};
}

}  // namespace fp8kit
