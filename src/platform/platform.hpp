// src/platform/platform.hpp: the one place where fp8kit talks to the operating system - read-only
// memory mapping of files, replace-on-write of outputs, and the OS's part of using Intel AMX. One
// implementation per platform (src/platform/posix.cpp, src/platform/windows.cpp); no other file
// includes an OS header or tests which OS it is built for (tests/platform_confinement.cmake checks).
// Checked by tests/unit/test_platform.cpp, natively and in the windows-cross (Wine) and
// arm64-cross (qemu-user) builds.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

namespace fp8kit::platform {

// A whole file mapped read-only (zero copy). An empty file maps to data() == nullptr, size() 0.
// fp8kit::Error naming the path and the OS's reason when it cannot be opened or mapped.
class MappedFile {
public:
    MappedFile() = default;
    explicit MappedFile(const std::string& path);
    MappedFile(MappedFile&& other) noexcept
        : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)), path_(std::move(other.path_)) {}
    MappedFile& operator=(MappedFile&& other) noexcept {
        if (this != &other) {
            release();
            data_ = std::exchange(other.data_, nullptr);
            size_ = std::exchange(other.size_, 0);
            path_ = std::move(other.path_);
        }
        return *this;
    }
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile() { release(); }

    const std::byte* data() const noexcept { return data_; }
    size_t size() const noexcept { return size_; }
    const std::string& path() const noexcept { return path_; }

private:
    void release() noexcept;  // unmaps (the one OS-specific part of moving and destroying)
    const std::byte* data_ = nullptr;
    size_t size_ = 0;
    std::string path_;
};

// Replace-on-write: bytes go to a temporary file beside `path` (same directory, so the final rename
// is atomic); commit() flushes them to stable storage and renames the temporary over `path`. Until
// commit() returns, `path` is untouched (absent or its old content); a ReplacingFile destroyed
// without commit() - an exception, a failed write - removes its temporary. Every failure is an
// fp8kit::Error naming the path and the OS's reason.
class ReplacingFile {
public:
    explicit ReplacingFile(const std::string& path);
    ReplacingFile(const ReplacingFile&) = delete;
    ReplacingFile& operator=(const ReplacingFile&) = delete;
    ~ReplacingFile();

    void write(const void* data, size_t size);
    void commit();
    const std::string& path() const noexcept { return path_; }
    const std::string& temp_path() const noexcept { return temp_; }

private:
    std::string path_, temp_;
    void* handle_ = nullptr;  // the platform's open file (a FILE* on POSIX)
    bool committed_ = false;
};

// Asks the OS to let this process use the AMX tile data registers; true when it may. Call only
// when cpuid reports AMX and XCR0 has the tile state. Linux hands the state out per process
// (arch_prctl ARCH_REQ_XCOMP_PERM); where fp8kit does not know how the OS grants it, false, and
// the GEMM uses its other kernels. POSIX only: the AMX kernels, its one user, are not built for
// Windows (CMakeLists.txt says why).
bool request_amx_tile_data() noexcept;

}  // namespace fp8kit::platform
