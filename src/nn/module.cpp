// src/nn/module.cpp: the module tree (qualified names, replacement, moves between devices) and
// Parameter storage. Checked by tests/nn/test_model_conversion.cpp (names, replacement, bytes) and
// tests/nn/test_float8_linear.cpp (to(Device::cuda)).
#include <string>
#include <vector>

#include "fp8kit/nn.hpp"
#include "fp8kit/quantize.hpp"

namespace fp8kit::nn {

Tensor Parameter::compute_value() const {
    if (value.defined()) return value;
    if (!stored) throw Error("fp8kit::nn::Parameter: neither a value nor an FP8 copy");
    return dequantize(*stored, DType::f32);
}

size_t Parameter::bytes() const {
    if (stored) return stored->data.nbytes() + stored->scale_inv.nbytes();
    return value.defined() ? value.nbytes() : 0;
}

std::shared_ptr<Parameter> Module::add_parameter(std::string name, Shape shape) {
    auto p = std::make_shared<Parameter>();
    p->value = Tensor::zeros(shape, DType::f32);
    p->grad = Tensor::zeros(shape, DType::f32);
    params_.emplace_back(std::move(name), p);
    return p;
}

void Module::to(Device device) {
    // Every copy is made before anything is replaced: a failed one (no GPU, out of memory) leaves
    // the module as it was.
    const auto params = named_parameters();
    std::vector<Parameter> moved(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
        const Parameter& p = *params[i].second;
        if (p.value.defined()) moved[i].value = p.value.to(device);
        if (p.grad.defined()) moved[i].grad = p.grad.to(device);
        if (p.stored) moved[i].stored = p.stored->to(device);
    }
    for (size_t i = 0; i < params.size(); ++i) *params[i].second = std::move(moved[i]);
    for (auto& [name, m] : named_modules()) m->state_to(device);
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
    std::vector<std::pair<std::string, Module*>> out{{"", this}};
    for (auto& [name, m] : children_)
        for (auto& [sub, mod] : m->named_modules()) out.emplace_back(sub.empty() ? name : name + "." + sub, mod);
    return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Parameter>>> Module::named_parameters() const {
    std::vector<std::pair<std::string, std::shared_ptr<Parameter>>> out(params_.begin(), params_.end());
    for (const auto& [name, m] : children_)
        for (auto& [sub, p] : m->named_parameters()) out.emplace_back(name + "." + sub, p);
    return out;
}

void Module::replace(const std::string& qualified_name, std::shared_ptr<Module> m) {
    const size_t dot = qualified_name.find('.');
    const std::string head = qualified_name.substr(0, dot);
    for (auto& [name, child] : children_) {
        if (name != head) continue;
        if (dot == std::string::npos) {
            child = std::move(m);
        } else {
            child->replace(qualified_name.substr(dot + 1), std::move(m));
        }
        return;
    }
    throw Error("fp8kit::nn::Module::replace: no module named " + quote_printable(qualified_name));
}

}  // namespace fp8kit::nn
