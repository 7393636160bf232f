// tools/skip.cpp: SkipRule (tools/checkpoint_commands.hpp) - which weights stay in high precision, by
// regular expressions over their names: the default (embeddings, norms, output head) plus the
// user's --skip ones. The one file of the command that uses <regex> (tools/CMakeLists.txt says
// why that matters to GCC 12). Checked by tests/e2e/test_checkpoint.sh (--skip, a bad --skip
// regex, the default rule in quantize and advise).
#include <regex>

#include "checkpoint_commands.hpp"
#include "fp8kit/error.hpp"

namespace fp8kit::tools {

struct SkipRule::Impl {
    std::vector<std::regex> patterns;
};

SkipRule::SkipRule(const std::vector<std::string>& extra) {
    auto impl = std::make_shared<Impl>();
    std::vector<std::string> patterns{default_skip_regex};
    patterns.insert(patterns.end(), extra.begin(), extra.end());
    for (const std::string& r : patterns) {
        try {
            impl->patterns.emplace_back(r);
        } catch (const std::regex_error& e) {
            throw Error("--skip " + quote_printable(r) + " is not a regular expression (" + e.what() + ")");
        }
    }
    impl_ = std::move(impl);
}

bool SkipRule::skips(const std::string& name) const {
    for (const std::regex& r : impl_->patterns) {
        if (std::regex_search(name, r)) return true;
    }
    return false;
}

}  // namespace fp8kit::tools
