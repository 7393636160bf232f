// src/platform/shared_library_posix.cpp: shared_library.hpp with dlopen / dlsym.
// Checked by tests/unit/test_shared_library.cpp (cuda builds).
#include <dlfcn.h>

#include "fp8kit/error.hpp"
#include "platform/shared_library.hpp"

namespace fp8kit::platform {

SharedLibrary::SharedLibrary(const std::vector<std::string>& names) {
    std::string reasons;
    for (const std::string& n : names) {
        // RTLD_LOCAL: its symbols serve only the lookups below, never another library's.
        handle_ = ::dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle_) {
            name_ = n;
            return;
        }
        const char* why = ::dlerror();
        reasons += std::string(reasons.empty() ? "" : "; ") + n + ": " + (why ? why : "not loaded");
    }
    throw Error("cannot load a shared library (" + reasons + ")");
}

void* SharedLibrary::symbol(const char* name) const {
    ::dlerror();  // clear: a symbol's value may be null, so only dlerror tells a failure
    void* p = ::dlsym(handle_, name);
    if (const char* why = ::dlerror()) throw Error(std::string("no symbol ") + name + " in " + name_ + ": " + why);
    return p;
}

}  // namespace fp8kit::platform
