// src/platform/shared_library.hpp: a shared library loaded at run time - the cuda backend's way to
// cuBLASLt, which it loads on first use instead of linking it (src/cuda/cublaslt.cpp says why).
// Built with the cuda backend only, its one user; one implementation, for the ELF platforms that
// backend builds for (src/platform/shared_library_posix.cpp).
// Checked by tests/unit/test_shared_library.cpp (cuda builds).
#pragma once

#include <string>
#include <vector>

namespace fp8kit::platform {

// The first of `names` that loads - each a bare file name (the OS loader's own search) or a path -
// kept loaded until the process ends (what it serves may be called from static destructors).
// fp8kit::Error naming every name tried and the loader's reason for each when none loads; symbol()
// throws naming the symbol and the library.
class SharedLibrary {
public:
    explicit SharedLibrary(const std::vector<std::string>& names);
    SharedLibrary(const SharedLibrary&) = delete;
    SharedLibrary& operator=(const SharedLibrary&) = delete;

    void* symbol(const char* name) const;
    const std::string& name() const noexcept { return name_; }

private:
    void* handle_ = nullptr;
    std::string name_;
};

}  // namespace fp8kit::platform
