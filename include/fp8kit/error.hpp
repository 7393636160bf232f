// fp8kit/error.hpp: the one exception type fp8kit throws for invalid arguments.
//
// Messages name the argument, the value received and what was expected, e.g.
//   "fp8kit::encode: out.size() is 7, expected in.size() = 8".
#pragma once

#include <stdexcept>
#include <string>

namespace fp8kit {

class Error : public std::invalid_argument {
public:
    explicit Error(const std::string& what) : std::invalid_argument(what) {}
};

}  // namespace fp8kit
