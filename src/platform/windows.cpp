// src/platform/windows.cpp: platform.hpp on Windows: CreateFileMapping/MapViewOfFile, and a
// temporary file created with CREATE_NEW, flushed with FlushFileBuffers and moved over the
// destination with MoveFileExW(MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH), file identity
// by volume serial number and file index, and a console control handler (Ctrl+C, Ctrl+Break, the
// console closing) that removes registered temporaries before the default handler ends the process.
// Narrow paths
// are read in the ANSI code page, as fopen and std::ifstream read them (UTF-8 where the program's
// manifest sets it). No request_amx_tile_data(): the AMX kernels are not built for Windows
// (CMakeLists.txt). Checked by tests/unit/test_platform.cpp, cross-built by the windows-cross
// preset (MinGW-w64) and run under Wine.
#define WIN32_LEAN_AND_MEAN
#define NOMINMAX
#include <windows.h>

#include <atomic>
#include <string>
#include <utility>

#include "fp8kit/error.hpp"
#include "platform/platform.hpp"

namespace fp8kit::platform {

namespace {

std::string reason(DWORD err) {
    char* buf = nullptr;
    const DWORD n = FormatMessageA(FORMAT_MESSAGE_ALLOCATE_BUFFER | FORMAT_MESSAGE_FROM_SYSTEM | FORMAT_MESSAGE_IGNORE_INSERTS,
                                   nullptr, err, 0, reinterpret_cast<char*>(&buf), 0, nullptr);
    std::string s = n > 0 ? std::string(buf, n) : "Windows error " + std::to_string(err);
    LocalFree(buf);
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '.')) s.pop_back();
    return s;
}

[[noreturn]] void fail(const std::string& what, const std::string& path, DWORD err) {
    throw Error(what + " '" + printable(path) + "': " + reason(err));
}

std::wstring wide(const std::string& path) {
    if (path.empty()) return {};
    const int n = MultiByteToWideChar(CP_ACP, 0, path.data(), int(path.size()), nullptr, 0);
    if (n <= 0) fail("cannot convert the path", path, GetLastError());
    std::wstring w(size_t(n), L'\0');
    MultiByteToWideChar(CP_ACP, 0, path.data(), int(path.size()), w.data(), n);
    return w;
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
    const std::wstring name = wide(path);
    const DWORD attributes = GetFileAttributesW(name.c_str());
    if (attributes != INVALID_FILE_ATTRIBUTES && (attributes & FILE_ATTRIBUTE_DIRECTORY) != 0) {
        throw Error(printable(path) + ": not a regular file (only regular files are read)");
    }
    HANDLE file = CreateFileW(name.c_str(), GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_DELETE, nullptr, OPEN_EXISTING,
                              FILE_ATTRIBUTE_NORMAL, nullptr);
    if (file == INVALID_HANDLE_VALUE) fail("cannot open", path, GetLastError());
    if (GetFileType(file) != FILE_TYPE_DISK) {  // a console, pipe or device
        CloseHandle(file);
        throw Error(printable(path) + ": not a regular file (only regular files are read)");
    }
    LARGE_INTEGER size{};
    if (!GetFileSizeEx(file, &size)) {
        const DWORD err = GetLastError();
        CloseHandle(file);
        fail("cannot stat", path, err);
    }
    size_ = size_t(size.QuadPart);
    if (size_ > 0) {  // CreateFileMapping refuses an empty file
        HANDLE mapping = CreateFileMappingW(file, nullptr, PAGE_READONLY, 0, 0, nullptr);
        void* p = mapping != nullptr ? MapViewOfFile(mapping, FILE_MAP_READ, 0, 0, 0) : nullptr;
        const DWORD err = GetLastError();
        if (mapping != nullptr) CloseHandle(mapping);  // the view keeps the mapping and the file
        if (p == nullptr) {
            CloseHandle(file);
            size_ = 0;
            fail("cannot map", path, err);
        }
        data_ = static_cast<const std::byte*>(p);
    }
    CloseHandle(file);
}

void MappedFile::release() noexcept {
    if (data_ != nullptr) UnmapViewOfFile(data_);
    data_ = nullptr;
    size_ = 0;
}

ReplacingFile::ReplacingFile(const std::string& path) : path_(path) {
    // CREATE_NEW with a name unique to this process and call: never another writer's temporary.
    static std::atomic<unsigned> counter{0};
    HANDLE h = INVALID_HANDLE_VALUE;
    for (int attempt = 0; h == INVALID_HANDLE_VALUE; ++attempt) {
        temp_ = temporary_name(path, counter++);
        cleanup_slot_ = remove_on_interrupt(temp_, false);  // before it exists: no window for Ctrl+C
        h = CreateFileW(wide(temp_).c_str(), GENERIC_WRITE, 0, nullptr, CREATE_NEW, FILE_ATTRIBUTE_NORMAL, nullptr);
        if (h == INVALID_HANDLE_VALUE) {
            const DWORD err = GetLastError();
            keep_on_interrupt(cleanup_slot_);
            cleanup_slot_ = -1;
            if (err != ERROR_FILE_EXISTS || attempt > 100) fail("cannot create a temporary file beside", path, err);
        }
    }
    handle_ = h;
}

ReplacingFile::~ReplacingFile() {
    if (handle_ != nullptr) CloseHandle(handle_);
    if (!committed_) DeleteFileW(wide(temp_).c_str());
    keep_on_interrupt(cleanup_slot_);
}

void ReplacingFile::write(const void* data, size_t size) {
    if (committed_) throw Error("write to '" + printable(path_) + "' after commit");
    const char* p = static_cast<const char*>(data);
    while (size > 0) {  // WriteFile takes a 32-bit count
        const DWORD chunk = size < (DWORD(1) << 30) ? DWORD(size) : DWORD(1) << 30;
        DWORD written = 0;
        if (!WriteFile(handle_, p, chunk, &written, nullptr) || written != chunk) fail("cannot write", temp_, GetLastError());
        p += chunk;
        size -= chunk;
    }
}

void ReplacingFile::commit() {
    if (committed_) throw Error("'" + printable(path_) + "' committed twice");
    HANDLE h = std::exchange(handle_, nullptr);
    if (!FlushFileBuffers(h)) {
        const DWORD err = GetLastError();
        CloseHandle(h);
        fail("cannot flush", temp_, err);
    }
    if (!CloseHandle(h)) fail("cannot close", temp_, GetLastError());
    if (!MoveFileExW(wide(temp_).c_str(), wide(path_).c_str(), MOVEFILE_REPLACE_EXISTING | MOVEFILE_WRITE_THROUGH)) {
        const DWORD err = GetLastError();
        // Unlike POSIX rename, Windows will not replace a file that is open or mapped elsewhere;
        // the usual cause is the program's own reader of the old file, so the message says so.
        std::string why = reason(err);
        if (err == ERROR_ACCESS_DENIED || err == ERROR_SHARING_VIOLATION)
            why += " (Windows cannot replace a file that is open or memory-mapped: a SafetensorsFile, or tensors read from it, may still hold it)";
        throw Error("cannot rename '" + printable(temp_) + "' to '" + printable(path_) + "': " + why);
    }
    committed_ = true;
}

namespace {
// The volume and file index of an existing file or directory (backup semantics opens directories).
bool file_id(const std::string& path, BY_HANDLE_FILE_INFORMATION& info) {
    HANDLE h = CreateFileW(wide(path).c_str(), 0, FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE, nullptr,
                           OPEN_EXISTING, FILE_FLAG_BACKUP_SEMANTICS, nullptr);
    if (h == INVALID_HANDLE_VALUE) return false;
    const bool ok = GetFileInformationByHandle(h, &info) != 0;
    CloseHandle(h);
    return ok;
}
}  // namespace

bool same_file(const std::string& a, const std::string& b) {
    BY_HANDLE_FILE_INFORMATION ia{}, ib{};
    return file_id(a, ia) && file_id(b, ib) && ia.dwVolumeSerialNumber == ib.dwVolumeSerialNumber &&
           ia.nFileIndexHigh == ib.nFileIndexHigh && ia.nFileIndexLow == ib.nFileIndexLow;
}

bool stderr_is_terminal() noexcept {
    DWORD mode = 0;
    return GetConsoleMode(GetStdHandle(STD_ERROR_HANDLE), &mode) != 0;
}

unsigned long long physical_memory_bytes() noexcept {
    MEMORYSTATUSEX m{};
    m.dwLength = sizeof m;
    return GlobalMemoryStatusEx(&m) ? static_cast<unsigned long long>(m.ullTotalPhys) : 0;
}

namespace detail {

unsigned long long process_id() noexcept { return GetCurrentProcessId(); }

bool process_running(unsigned long long pid) noexcept {
    if (pid == 0 || pid > 0xffffffffull) return false;  // not a DWORD: no process has it
    HANDLE h = OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, FALSE, DWORD(pid));
    if (h == nullptr) return GetLastError() == ERROR_ACCESS_DENIED;  // exists, but not ours to query
    DWORD code = 0;
    const bool running = GetExitCodeProcess(h, &code) != 0 && code == STILL_ACTIVE;
    CloseHandle(h);
    return running;
}

void remove_now(const char* path, bool directory) noexcept {
    // The control handler runs on its own thread (not in a signal context): converting is fine.
    wchar_t w[4096];
    const int n = MultiByteToWideChar(CP_ACP, 0, path, -1, w, 4096);
    if (n <= 0) return;
    if (directory) RemoveDirectoryW(w);
    else DeleteFileW(w);
}

namespace {
BOOL WINAPI on_console_event(DWORD) {
    remove_registered_now();
    return FALSE;  // the next handler (the default one) ends the process
}
}  // namespace

void install_interrupt_handlers() noexcept { SetConsoleCtrlHandler(on_console_event, TRUE); }

}  // namespace detail

void advise_huge_pages(void*, size_t) noexcept {}  // large pages need a privilege accounts lack by default

}  // namespace fp8kit::platform
