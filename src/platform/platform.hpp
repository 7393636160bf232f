// src/platform/platform.hpp: the one place where fp8kit talks to the operating system - read-only
// memory mapping of files, replace-on-write of outputs, file identity, temporaries removed on an
// interrupt (and found again after a kill), whether stderr is a terminal, huge pages for large
// blocks, and the OS's part of using Intel AMX. One
// implementation per platform (src/platform/posix.cpp, src/platform/windows.cpp); no other file
// includes an OS header or tests which OS it is built for (tests/platform_confinement.cmake checks).
// Checked by tests/unit/test_platform.cpp, natively and in the windows-cross (Wine) and
// arm64-cross (qemu-user) builds.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fp8kit::platform {

// A whole file mapped read-only (zero copy). An empty file maps to data() == nullptr, size() 0.
// fp8kit::Error naming the path and the OS's reason when it cannot be opened or mapped, and for
// anything but a regular file (a directory, FIFO, socket or device: refused without waiting on it).
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
// is atomic; named by temporary_name()); commit() flushes them to stable storage and renames the
// temporary over `path`. Until commit() returns, `path` is untouched (absent or its old content);
// a ReplacingFile destroyed without commit() - an exception, a failed write - removes its
// temporary, and so does an interrupt (remove_on_interrupt). Every failure is an fp8kit::Error
// naming the path and the OS's reason.
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
    int cleanup_slot_ = -1;   // remove_on_interrupt's slot for temp_
    bool committed_ = false;
};

// Whether two paths name the same file or directory - the same device and inode on POSIX, the
// same volume serial number and file index on Windows - after following links. false when either
// does not exist.
bool same_file(const std::string& a, const std::string& b);

// Temporaries: the name of the n-th temporary this process makes for `path` -
// "<path>.tmp-<process id>-<n>" - and, for a kill (which no process can catch), the ones a
// process that no longer runs left beside `path`: their full paths.
std::string temporary_name(const std::string& path, unsigned n);
std::vector<std::string> stale_temporaries(const std::string& path);

// Removal on an interrupt: a path registered here is removed (a file unlinked, a directory - empty
// by then, its files registered after it - removed) when the process gets SIGINT, SIGTERM or
// SIGHUP (Ctrl+C, Ctrl+Break or the console closing on Windows), before it ends as the signal
// would have ended it. The handler uses only async-signal-safe calls; up to 1024 paths (of < 1024 bytes) at once.
// Returns the slot to pass to keep_on_interrupt() once the path is no longer temporary (renamed
// into place or removed), -1 when every slot is taken (the path is then not protected).
int remove_on_interrupt(const std::string& path, bool directory) noexcept;
void keep_on_interrupt(int slot) noexcept;

// Whether the process's standard error is a terminal (progress bars go only there).
bool stderr_is_terminal() noexcept;

// The machine's physical memory in bytes; 0 where the OS does not say.
unsigned long long physical_memory_bytes() noexcept;

// Between src/platform/temporaries.cpp (portable: names, the table of paths) and the OS files.
namespace detail {
unsigned long long process_id() noexcept;
bool process_running(unsigned long long pid) noexcept;  // true when unsure
void install_interrupt_handlers() noexcept;        // once, on the first remove_on_interrupt
void remove_now(const char* path, bool directory) noexcept;  // async-signal-safe
void remove_registered_now() noexcept;  // what the OS's handler calls: every registered path
}  // namespace detail

// Asks the OS to let this process use the AMX tile data registers; true when it may. Call only
// when cpuid reports AMX and XCR0 has the tile state. Linux hands the state out per process
// (arch_prctl ARCH_REQ_XCOMP_PERM); where fp8kit does not know how the OS grants it, false, and
// the GEMM uses its other kernels. POSIX only: the AMX kernels, its one user, are not built for
// Windows (CMakeLists.txt says why).
bool request_amx_tile_data() noexcept;

// Asks the OS to back the 2 MiB-aligned blocks inside [p, p + bytes) with huge pages when they
// are first touched (Linux's transparent huge pages: 2 MiB with 4 KiB base pages, as on x86-64);
// a hint, nothing on failure or where fp8kit does not know how (Windows grants large pages only
// to privileged accounts). Why: a
// decode step streams each FP8 weight once, and on 4 KiB pages a core's stream crosses a page -
// where the hardware prefetcher stops and a TLB walk begins - every 4 KiB (M = 1 from a 16 MiB
// weight, Zen 5: 65 -> 77 GB/s); Linux gives huge pages only where asked (THP "madvise").
void advise_huge_pages(void* p, size_t bytes) noexcept;

}  // namespace fp8kit::platform
