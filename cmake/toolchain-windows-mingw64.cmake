# cmake/toolchain-windows-mingw64.cmake: cross-compiles fp8kit for 64-bit Windows with MinGW-w64's
# g++ in its POSIX-threads build (Debian: g++-mingw-w64-x86-64-posix; it has OpenMP), and runs the
# programs under Wine (cmake/cross/wine-run.sh) with a Wine prefix in the build folder. Used by the
# windows-cross preset; checked by its build and its tests under Wine (scripts/test.sh).
set(CMAKE_SYSTEM_NAME Windows)
set(CMAKE_SYSTEM_PROCESSOR AMD64)
set(CMAKE_C_COMPILER x86_64-w64-mingw32-gcc-posix)  # GoogleTest's project enables C
set(CMAKE_CXX_COMPILER x86_64-w64-mingw32-g++-posix)
set(CMAKE_FIND_ROOT_PATH /usr/x86_64-w64-mingw32)
set(FP8KIT_CROSS_PKG_CONFIG_LIBDIR /usr/x86_64-w64-mingw32/lib/pkgconfig)
include(${CMAKE_CURRENT_LIST_DIR}/cross/common.cmake)
set(CMAKE_CROSSCOMPILING_EMULATOR ${CMAKE_CURRENT_LIST_DIR}/cross/wine-run.sh ${CMAKE_BINARY_DIR}/wine)
# GCC cannot align the stack beyond 16 bytes on 64-bit Windows (GCC bug 54412): an AVX register
# spilled with an aligned move would fault. The assembler turns aligned vector moves into unaligned
# ones, which cost the same on aligned data.
set(CMAKE_CXX_FLAGS_INIT "-Wa,-muse-unaligned-vector-move")
set(CMAKE_C_FLAGS_INIT "-Wa,-muse-unaligned-vector-move")
