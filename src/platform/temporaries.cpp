// src/platform/temporaries.cpp: the portable half of platform.hpp's temporaries - their names
// ("<path>.tmp-<pid>-<n>"), finding those a killed process left, and the table of paths to
// remove on an interrupt, which the OS's handler (posix.cpp, windows.cpp) walks. The table is
// written so a signal handler may read it at any moment: a slot's path is complete before its
// state says so (release / acquire), and the handler only reads.
// Checked by tests/unit/test_platform.cpp (names, stale temporaries) and
// tests/e2e/test_checkpoint_safety.sh (SIGINT / SIGTERM / SIGKILL of fp8kit quantize).
#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "platform/platform.hpp"

namespace fp8kit::platform {

namespace fs = std::filesystem;

namespace {

constexpr size_t max_slots = 1024, max_path = 1024;

struct Slot {
    std::atomic<int> state{0};  // 0 free, 1 being written or cleared, 2 registered
    bool directory = false;
    char path[max_path] = {};
};
std::array<Slot, max_slots> slots;
static_assert(std::atomic<int>::is_always_lock_free, "the interrupt handler reads slot states");

}  // namespace

std::string temporary_name(const std::string& path, unsigned n) {
    return path + ".tmp-" + std::to_string(detail::process_id()) + "-" + std::to_string(n);
}

std::vector<std::string> stale_temporaries(const std::string& path) {
    const fs::path p = fs::absolute(fs::path(path));
    const std::string prefix = p.filename().string() + ".tmp-";
    std::vector<std::string> out;
    std::error_code ec;
    for (fs::directory_iterator it(p.parent_path(), ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (name.rfind(prefix, 0) != 0) continue;
        // "<pid>-<n>", both decimal, and nothing else.
        const std::string rest = name.substr(prefix.size());
        const size_t dash = rest.find('-');
        const auto digits = [](const std::string& s) {
            return !s.empty() && s.size() <= 18 && s.find_first_not_of("0123456789") == std::string::npos;
        };
        if (dash == std::string::npos || !digits(rest.substr(0, dash)) || !digits(rest.substr(dash + 1))) continue;
        const unsigned long long pid = std::stoull(rest.substr(0, dash));
        if (pid != detail::process_id() && !detail::process_running(pid)) out.push_back(it->path().string());
    }
    return out;
}

int remove_on_interrupt(const std::string& path, bool directory) noexcept {
    static std::once_flag installed;
    std::call_once(installed, detail::install_interrupt_handlers);
    if (path.size() >= max_path) return -1;
    for (size_t i = 0; i < max_slots; ++i) {
        int expected = 0;
        if (!slots[i].state.compare_exchange_strong(expected, 1, std::memory_order_acquire)) continue;
        slots[i].directory = directory;
        std::memcpy(slots[i].path, path.c_str(), path.size() + 1);
        slots[i].state.store(2, std::memory_order_release);
        return int(i);
    }
    return -1;
}

void keep_on_interrupt(int slot) noexcept {
    if (slot < 0 || size_t(slot) >= max_slots) return;
    slots[size_t(slot)].state.store(1, std::memory_order_release);
    slots[size_t(slot)].path[0] = '\0';
    slots[size_t(slot)].state.store(0, std::memory_order_release);
}

void detail::remove_registered_now() noexcept {
    // Files first, then directories (each empty once its files are gone).
    for (const bool dirs : {false, true}) {
        for (size_t i = max_slots; i-- > 0;) {
            if (slots[i].state.load(std::memory_order_acquire) == 2 && slots[i].directory == dirs) {
                remove_now(slots[i].path, dirs);
            }
        }
    }
}

}  // namespace fp8kit::platform
