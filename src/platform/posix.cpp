// src/platform/posix.cpp: platform.hpp on POSIX systems (Linux, macOS): mmap, a temporary file
// made with O_EXCL, fsync'ed and renamed over the destination, file identity by stat's device and
// inode, SIGINT / SIGTERM / SIGHUP handlers that unlink registered temporaries and then end the
// process by the same signal, Linux's huge-page hint (madvise) and its AMX permission request.
// Checked by tests/unit/test_platform.cpp; the AMX request by tests/ops/test_gemm.cpp on an AMX
// machine.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "fp8kit/error.hpp"
#include "platform/platform.hpp"

namespace fp8kit::platform {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
    throw Error(what + " '" + printable(path) + "': " + std::strerror(err));
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
    // O_NONBLOCK: opening a FIFO (or a device) for reading would otherwise wait for a writer;
    // the fstat below then refuses it. A regular file ignores the flag.
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) fail("cannot open", path, errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        const int err = errno;
        ::close(fd);
        fail("cannot stat", path, err);
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        const char* kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket"
                           : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a special file";
        throw Error(printable(path) + ": " + kind + ", not a regular file (only regular files are read)");
    }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            const int err = errno;
            ::close(fd);
            fail("cannot map", path, err);
        }
        data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);  // the mapping keeps the file
}

void MappedFile::release() noexcept {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
}

ReplacingFile::ReplacingFile(const std::string& path) : path_(path) {
    // O_EXCL with a name unique to this process and call: never another writer's temporary, and
    // mode 0666 less the umask, as any new output file gets.
    static std::atomic<unsigned> counter{0};
    int fd = -1;
    for (int attempt = 0; fd < 0; ++attempt) {
        temp_ = temporary_name(path, counter++);
        cleanup_slot_ = remove_on_interrupt(temp_, false);  // before it exists: no window for a signal
        fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0) {
            const int err = errno;
            keep_on_interrupt(cleanup_slot_);
            cleanup_slot_ = -1;
            if (err != EEXIST || attempt > 100) fail("cannot create a temporary file beside", path, err);
        }
    }
    FILE* f = ::fdopen(fd, "wb");
    if (f == nullptr) {
        const int err = errno;
        ::close(fd);
        ::unlink(temp_.c_str());
        keep_on_interrupt(cleanup_slot_);
        fail("cannot open", temp_, err);
    }
    handle_ = f;
}

ReplacingFile::~ReplacingFile() {
    if (handle_ != nullptr) std::fclose(static_cast<FILE*>(handle_));
    if (!committed_) ::unlink(temp_.c_str());
    keep_on_interrupt(cleanup_slot_);
}

void ReplacingFile::write(const void* data, size_t size) {
    if (committed_) throw Error("write to '" + printable(path_) + "' after commit");
    if (size > 0 && std::fwrite(data, 1, size, static_cast<FILE*>(handle_)) != size) fail("cannot write", temp_, errno);
}

void ReplacingFile::commit() {
    if (committed_) throw Error("'" + printable(path_) + "' committed twice");
    FILE* f = static_cast<FILE*>(std::exchange(handle_, nullptr));
    if (std::fflush(f) != 0) {
        const int err = errno;
        std::fclose(f);
        fail("cannot write", temp_, err);
    }
    if (::fsync(::fileno(f)) != 0) {
        const int err = errno;
        std::fclose(f);
        fail("cannot flush", temp_, err);
    }
    if (std::fclose(f) != 0) fail("cannot close", temp_, errno);
    if (std::rename(temp_.c_str(), path_.c_str()) != 0) fail("cannot rename '" + printable(temp_) + "' to", path_, errno);
    committed_ = true;
}

bool same_file(const std::string& a, const std::string& b) {
    struct stat sa {}, sb {};
    return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

bool stderr_is_terminal() noexcept { return ::isatty(STDERR_FILENO) == 1; }

unsigned long long physical_memory_bytes() noexcept {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<unsigned long long>(pages) * static_cast<unsigned long long>(page) : 0;
}

namespace detail {

unsigned long long process_id() noexcept { return static_cast<unsigned long long>(::getpid()); }

bool process_running(unsigned long long pid) noexcept {
    // kill(pid, 0) checks without sending: ESRCH means no such process; EPERM, one of another
    // user. An id pid_t cannot hold names no process (and must not become a negative group id).
    if (pid == 0 || pid > static_cast<unsigned long long>(std::numeric_limits<pid_t>::max())) return false;
    return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
}

void remove_now(const char* path, bool directory) noexcept {
    if (directory) ::rmdir(path);
    else ::unlink(path);
}

namespace {
void on_interrupt(int sig) {
    remove_registered_now();
    // End as the signal would have (the shell then reports it, and exit status 128 + sig).
    ::signal(sig, SIG_DFL);
    ::raise(sig);
}
}  // namespace

void install_interrupt_handlers() noexcept {
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
        struct sigaction old {};
        if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;  // e.g. nohup
        struct sigaction sa {};
        sa.sa_handler = on_interrupt;
        sigemptyset(&sa.sa_mask);
        for (const int other : {SIGINT, SIGTERM, SIGHUP}) sigaddset(&sa.sa_mask, other);  // one cleanup at a time
        ::sigaction(sig, &sa, nullptr);
    }
}

}  // namespace detail

bool request_amx_tile_data() noexcept {
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return ::syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
    return false;  // macOS has no AMX; other systems: not known how they grant the state
#endif
}

void advise_huge_pages(void* p, size_t bytes) noexcept {
#if defined(MADV_HUGEPAGE)
    constexpr uintptr_t huge = uintptr_t(2) << 20;
    const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + huge - 1) & ~(huge - 1);
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + bytes) & ~(huge - 1);
    if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);  // a hint: failure changes nothing
#else
    (void)p, (void)bytes;  // macOS: no such hint
#endif
}

}  // namespace fp8kit::platform
