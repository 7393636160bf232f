# cmake/toolchain-linux-aarch64.cmake: cross-compiles fp8kit for 64-bit ARM Linux with Debian's
# g++-aarch64-linux-gnu, statically linked, and runs the programs under qemu-user (qemu-aarch64).
# Used by the arm64-cross preset; checked by its build and its tests under qemu (scripts/test.sh).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)  # GoogleTest's project enables C
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(FP8KIT_CROSS_PKG_CONFIG_LIBDIR /usr/lib/aarch64-linux-gnu/pkgconfig)
include(${CMAKE_CURRENT_LIST_DIR}/cross/common.cmake)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
