# tests/platform_confinement.cmake: fails when C++ code outside src/platform/ includes an operating
# system header (unistd.h, fcntl.h, sys/..., windows.h, io.h, ...) or tests which OS it is built
# for (#if defined(_WIN32), #ifdef __linux__, ...) - the slip that builds on Linux and breaks the
# Windows build (or the reverse). Compiler and ISA checks (_MSC_VER, __x86_64__) are allowed.
# Run by ctest (label unit) two ways:
#   cmake -DROOT=<source tree> -P platform_confinement.cmake
#       checks include/ src/ tools/ bench/ examples/ tests/ of that tree;
#   cmake -DSELF_TEST=<scratch folder> -P platform_confinement.cmake
#       plants each kind of violation in a scratch tree and fails unless the check catches every
#       one, and passes a clean tree and the same lines inside src/platform/.
cmake_minimum_required(VERSION 3.25)

# tests/oracle.hpp runs the Python oracles (std::system, <sys/wait.h>): the tests using it are built
# for the build machine only, never for a cross target (tests/CMakeLists.txt). bench/compare_libs.cpp
# (dlopen of two builds) is a developer's tool for ELF platforms that CMake never builds: its
# script, bench/compare_libs.py, compiles it on the machine it measures.
set(allowed "src/platform/.*|tests/oracle\\.hpp|bench/compare_libs\\.cpp")
set(os_header "^[ \t]*#[ \t]*include[ \t]*[<\"](unistd|fcntl|dirent|dlfcn|pthread|io|direct|process|malloc|[Ww]indows|[Ww]inbase|[Ww]innt|[Ww]insock2?|[Ss]hlobj|sys/[A-Za-z0-9_/]+|mach/[A-Za-z0-9_/]+)\\.h[>\"]")
set(os_macro "^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|elifdef|elifndef)([ \t(!].*)?[^A-Za-z0-9_](_WIN32|_WIN64|__WINDOWS__|__CYGWIN__|__MINGW32__|__MINGW64__|__linux__|__linux|__gnu_linux__|__unix__|__unix|__APPLE__|__MACH__|__FreeBSD__|__NetBSD__|__OpenBSD__|__ANDROID__)([^A-Za-z0-9_]|$)")

if(DEFINED SELF_TEST)
    set(tree "${SELF_TEST}")
    function(expect_check file text want_fail)
        file(REMOVE_RECURSE "${tree}")
        file(WRITE "${tree}/${file}" "// planted\n#include <vector>\n${text}\nint f() { return 1; }\n")
        execute_process(COMMAND ${CMAKE_COMMAND} -DROOT=${tree} -P ${CMAKE_CURRENT_LIST_FILE}
                        RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
        if(want_fail AND rc EQUAL 0)
            message(SEND_ERROR "not caught: '${text}' in ${file}")
        elseif(NOT want_fail AND NOT rc EQUAL 0)
            message(SEND_ERROR "false alarm: '${text}' in ${file}")
        endif()
    endfunction()
    foreach(line "#include <unistd.h>" "#include <sys/mman.h>" "#  include <sys/syscall.h>" "#include <Windows.h>"
                 "#include <windows.h>" "#include \"io.h\"" "#include <fcntl.h>" "#include <pthread.h>"
                 "#if defined(_WIN32)" "#ifdef __linux__" "#elif defined(__APPLE__)" "#if !defined(_WIN32) && 1"
                 "# if defined(__MINGW64__)")
        expect_check(src/core/planted.cpp "${line}" TRUE)
        expect_check(tools/planted.hpp "${line}" TRUE)
        expect_check(tests/unit/planted.cpp "${line}" TRUE)
        expect_check(src/platform/planted.cpp "${line}" FALSE)
    endforeach()
    foreach(line "#include <cstdio>" "#include \"fp8kit/io.hpp\"" "#include \"cpu/sys/x.hpp\"" "#if defined(_MSC_VER)"
                 "#if defined(__x86_64__) || defined(_M_X64)" "#ifdef FP8KIT_WIN32_STYLE" "// #include <unistd.h>")
        expect_check(src/core/planted.cpp "${line}" FALSE)
    endforeach()
    file(REMOVE_RECURSE "${tree}")
    return()
endif()

if(NOT DEFINED ROOT)
    message(FATAL_ERROR "usage: cmake -DROOT=<source tree> -P platform_confinement.cmake (or -DSELF_TEST=<scratch>)")
endif()
set(bad "")
foreach(dir include src tools bench examples tests)
    file(GLOB_RECURSE files RELATIVE "${ROOT}" "${ROOT}/${dir}/*.cpp" "${ROOT}/${dir}/*.hpp" "${ROOT}/${dir}/*.h"
         "${ROOT}/${dir}/*.cu" "${ROOT}/${dir}/*.cuh")
    foreach(file IN LISTS files)
        if(file MATCHES "^(${allowed})$")
            continue()
        endif()
        file(STRINGS "${ROOT}/${file}" lines REGEX "^[ \t]*#")
        foreach(line IN LISTS lines)
            if(line MATCHES "${os_header}" OR line MATCHES "${os_macro}")
                string(APPEND bad "\n  ${file}: ${line}")
            endif()
        endforeach()
    endforeach()
endforeach()
if(bad)
    message(FATAL_ERROR "OS-specific code outside src/platform/ (move it behind src/platform/platform.hpp):${bad}")
endif()
message(STATUS "platform confinement: no OS header or OS #if outside src/platform/")
