// src/core/backend.cpp: the backend registry - which backends this build has, which one runs
// host tensors (FP8KIT_BACKEND, set_backend), and each one's table of operations.
// Checked by tests/unit/test_backend.cpp.
#include <atomic>
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
        &ns::amax, &ns::group_amax, &ns::quantize, &ns::dequantize, &ns::pack_weight, &ns::gemm,    \
            &ns::matmul, &ns::bias_grad, &ns::layernorm_forward, &ns::layernorm_backward,           \
            &ns::rmsnorm_forward, &ns::rmsnorm_backward, &ns::gelu_forward, &ns::gelu_backward,     \
            &ns::attention_forward, &ns::attention_backward, &ns::crossentropy_forward,             \
            &ns::crossentropy_backward, &ns::embedding_forward, &ns::embedding_backward,            \
            &ns::adamw_update                                                                       \
    }
constexpr detail::BackendOps ref_ops = FP8KIT_BACKEND_OPS(ref);
constexpr detail::BackendOps cpu_ops = FP8KIT_BACKEND_OPS(cpu);
#undef FP8KIT_BACKEND_OPS

std::atomic<Backend> active{Backend::cpu};
std::once_flag env_read;

void read_environment() {
    std::call_once(env_read, [] {
        const char* env = std::getenv("FP8KIT_BACKEND");
        if (env == nullptr || *env == '\0') return;
        const auto b = try_parse_backend(env);
        if (!b || !backend_available(*b)) {
            throw Error("FP8KIT_BACKEND=" + std::string(env) + " is not a backend of this build, expected ref or cpu");
        }
        active = *b;
    });
}

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

bool backend_available(Backend b) noexcept { return b != Backend::cuda; }

std::span<const Backend> available_backends() noexcept { return host_backends; }

Backend active_backend() {
    read_environment();
    return active.load();
}

void set_backend(Backend b) {
    read_environment();
    if (!backend_available(b)) {
        throw Error("fp8kit::set_backend: backend " + std::string(to_string(b)) + " is not available in this build");
    }
    active = b;
}

const detail::BackendOps& detail::backend_ops(Backend b) {
    switch (b) {
        case Backend::ref: return ref_ops;
        case Backend::cpu: return cpu_ops;
        case Backend::cuda: break;
    }
    throw Error("fp8kit: backend cuda is not available in this build");
}

}  // namespace fp8kit
