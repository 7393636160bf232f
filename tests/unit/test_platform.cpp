// tests/unit/test_platform.cpp: the platform layer (src/platform/platform.hpp) - mapped files read
// back what was written, replace-on-write leaves the destination whole or untouched, file
// identity sees through other spellings and links, and temporaries are named so that those of a
// process that is gone are found (and no others). Interrupts are tested on the built command by
// tests/e2e/test_checkpoint_safety.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fp8kit/error.hpp"
#include "fp8kit/files.hpp"
#include "fp8kit/runtime.hpp"
#include "platform/platform.hpp"

namespace fp8kit::test {
namespace {

namespace fs = std::filesystem;

// A fresh folder per test under the system temporary folder, removed afterwards.
struct TempDir {
    fs::path dir;
    TempDir() {
        dir = fs::temp_directory_path() /
              ("fp8kit_platform_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    ~TempDir() { fs::remove_all(dir); }
    std::string file(const char* name) const { return (dir / name).string(); }
};

std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

size_t entries(const fs::path& dir) { return size_t(std::distance(fs::directory_iterator(dir), fs::directory_iterator())); }

TEST(Platform, MappedFileSeesTheBytes) {
    TempDir t;
    std::string bytes(100000, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 131 % 251);
    write_all(t.file("a.bin"), bytes);
    platform::MappedFile m(t.file("a.bin"));
    ASSERT_EQ(m.size(), bytes.size());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(m.data()), m.size()), bytes);
    platform::MappedFile moved = std::move(m);
    EXPECT_EQ(moved.size(), bytes.size());
    EXPECT_EQ(m.data(), nullptr);  // NOLINT: moved-from is empty by contract
}

TEST(Platform, EmptyAndMissingFiles) {
    TempDir t;
    write_all(t.file("empty"), "");
    platform::MappedFile m(t.file("empty"));
    EXPECT_EQ(m.size(), 0u);
    EXPECT_EQ(m.data(), nullptr);
    try {
        platform::MappedFile missing(t.file("nope"));
        FAIL() << "no error for a missing file";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
    }
    EXPECT_THROW(platform::MappedFile dir(t.dir.string()), Error);
    // A path is shown escaped (a Python traceback prints the message as it is), whole.
    const std::string long_name = std::string(300, 'n') + "\x1b[2J";
    try {
        platform::MappedFile missing(t.file(long_name.c_str()));
        FAIL() << "no error for a missing file";
    } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
        EXPECT_NE(message.find(std::string(300, 'n') + "\\x1b[2J'"), std::string::npos) << message;
    }
}

TEST(Platform, ReplacingFileCommitsWhole) {
    TempDir t;
    const std::string out = t.file("out.bin");
    write_all(out, "old content");
    {
        platform::ReplacingFile f(out);
        f.write("new ", 4);
        EXPECT_EQ(read_all(out), "old content");  // untouched until commit
        f.write("content!", 8);
        f.commit();
        EXPECT_THROW(f.write("x", 1), Error);
    }
    EXPECT_EQ(read_all(out), "new content!");
    EXPECT_EQ(entries(t.dir), 1u);  // no temporary left
}

TEST(Platform, ReplacingFileWithoutCommitLeavesNothing) {
    TempDir t;
    const std::string out = t.file("out.bin");
    write_all(out, "keep me");
    try {
        platform::ReplacingFile f(out);
        f.write("partial", 7);
        throw std::runtime_error("writer failed half way");
    } catch (const std::runtime_error&) {
    }
    EXPECT_EQ(read_all(out), "keep me");
    EXPECT_EQ(entries(t.dir), 1u);
    {
        platform::ReplacingFile f(t.file("fresh.bin"));
        f.write("abc", 3);
    }
    EXPECT_FALSE(fs::exists(t.file("fresh.bin")));
    EXPECT_EQ(entries(t.dir), 1u);
}

TEST(Platform, ReplacingFileInAMissingFolderNamesIt) {
    TempDir t;
    try {
        platform::ReplacingFile f(t.file("no_such_dir/out.bin"));
        FAIL() << "no error";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("no_such_dir"), std::string::npos) << e.what();
    }
}

TEST(Platform, SameFileComparesFilesNotPathStrings) {
    TempDir t;
    write_all(t.file("a.bin"), "a");
    write_all(t.file("b.bin"), "a");  // the same bytes, another file
    const std::string spelled = (t.dir / "." / "a.bin").string();
    EXPECT_TRUE(platform::same_file(t.file("a.bin"), spelled));
    EXPECT_TRUE(platform::same_file(t.dir.string(), (t.dir / ".").string()));
    EXPECT_FALSE(platform::same_file(t.file("a.bin"), t.file("b.bin")));
    EXPECT_FALSE(platform::same_file(t.file("a.bin"), t.file("missing.bin")));
    EXPECT_FALSE(platform::same_file(t.file("missing.bin"), t.file("missing.bin")));  // nothing to be the same
    std::error_code ec;
    fs::create_hard_link(t.file("a.bin"), t.file("hard.bin"), ec);
    if (!ec) EXPECT_TRUE(platform::same_file(t.file("a.bin"), t.file("hard.bin")));
    else std::printf("note: no hard links here (%s): that case is left to the e2e test\n", ec.message().c_str());
}

TEST(Platform, StaleTemporariesAreThoseOfAProcessThatIsGone) {
    TempDir t;
    const std::string out = t.file("out.safetensors");
    // Ours (this process runs), one of a process id no system hands out (4e9 > Linux's 2^22 and
    // Windows' ids in use), and names that only look alike.
    const std::string mine = platform::temporary_name(out, 7);
    EXPECT_EQ(mine.rfind(out + ".tmp-", 0), 0u) << mine;
    write_all(mine, "x");
    write_all(out + ".tmp-4000000000-3", "x");
    fs::create_directory(out + ".tmp-4000000000-4");
    write_all(out + ".tmp-abc-1", "x");
    write_all(out + ".tmp-4000000000-", "x");
    write_all(t.file("other.safetensors.tmp-4000000000-1"), "x");
    std::vector<std::string> stale = platform::stale_temporaries(out);
    std::sort(stale.begin(), stale.end());
    ASSERT_EQ(stale.size(), 2u);
    EXPECT_EQ(fs::path(stale[0]).filename().string(), "out.safetensors.tmp-4000000000-3");
    EXPECT_EQ(fs::path(stale[1]).filename().string(), "out.safetensors.tmp-4000000000-4");
}

// What a terminal acts on is escaped - C0 controls, DEL, the C1 controls (U+0080..U+009F, CSI
// among them), the bidirectional controls and bytes that are not UTF-8 (a lone 0x9b is CSI on an
// 8-bit terminal) - and nothing else: printable text, UTF-8 letters and the 4-byte range pass as
// they are.
TEST(Files, PrintableEscapesWhatATerminalActsOn) {
    EXPECT_EQ(printable("model.layers.0.weight"), "model.layers.0.weight");
    EXPECT_EQ(printable("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
    EXPECT_EQ(printable("a\x1b[2Jb"), "a\\x1b[2Jb");
    EXPECT_EQ(printable("\n\t\r\x7f"), "\\n\\t\\r\\x7f");
    EXPECT_EQ(printable(std::string_view("\0x", 2)), "\\x00x");
    EXPECT_EQ(printable("\xc2\x9b"), "\\xc2\\x9b");      // U+009B, CSI
    EXPECT_EQ(printable("\xc2\xa0"), "\xc2\xa0");          // U+00A0 is printable: kept
    // the bidirectional controls, which reorder what a terminal shows: U+202E (right-to-left
    // override), U+2066 and U+2069 (isolates), U+200F, U+061C; their neighbours U+202F, U+2065
    // and U+2010 are printable
    EXPECT_EQ(printable("a\xe2\x80\xae" "b"), "a\\xe2\\x80\\xaeb");
    EXPECT_EQ(printable("\xe2\x81\xa6\xe2\x81\xa9"), "\\xe2\\x81\\xa6\\xe2\\x81\\xa9");
    EXPECT_EQ(printable("\xe2\x80\x8f\xd8\x9c"), "\\xe2\\x80\\x8f\\xd8\\x9c");
    EXPECT_EQ(printable("\xe2\x80\xaf\xe2\x81\xa5\xe2\x80\x90"), "\xe2\x80\xaf\xe2\x81\xa5\xe2\x80\x90");
    EXPECT_EQ(printable("\x9b"), "\\x9b");                  // not UTF-8
    EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");        // overlong '/'
    EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
    EXPECT_EQ(printable("\xe2\x82"), "\\xe2\\x82");        // cut short
    EXPECT_EQ(quote_printable("a\x1b"), "'a\\x1b'");
    // A long name: its first 200 bytes of escaped text, cut where no character is (the 2-byte
    // letter at bytes 199-200 goes whole), and its length; 200 bytes pass whole.
    EXPECT_EQ(quote_printable(std::string(200, 'n')), "'" + std::string(200, 'n') + "'");
    EXPECT_EQ(quote_printable(std::string(10000, 'n')), "'" + std::string(200, 'n') + "'... (10000 bytes)");
    const std::string letters = std::string(199, 'n') + "\xc3\xa9" + std::string(100, 'n');
    EXPECT_EQ(quote_printable(letters), "'" + std::string(199, 'n') + "'... (301 bytes)");
}

TEST(Platform, PhysicalMemoryIsKnownHere) {
    // Every OS fp8kit builds for says (sysconf, GlobalMemoryStatusEx); more than a test machine's 256 MiB.
    EXPECT_GT(physical_memory_bytes(), uint64_t(256) << 20);
}

}  // namespace
}  // namespace fp8kit::test
