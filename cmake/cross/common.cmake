# cmake/cross/common.cmake: what the cross toolchain files (toolchain-windows-mingw64.cmake,
# toolchain-linux-aarch64.cmake) share. Libraries and headers come from the target's root only,
# never the build machine's /usr; pkg-config looks only at the target's .pc files (so the
# benchmarks' OpenBLAS, a host library, is not found); programs are linked statically, so that
# Wine and qemu-user run them without the target's shared runtime; the header-only CLI11 and
# nlohmann-json come from cmake/cross/host_headers.cmake. Checked by the windows-cross and
# arm64-cross presets' builds.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_LIBDIR} "${FP8KIT_CROSS_PKG_CONFIG_LIBDIR}")
set(ENV{PKG_CONFIG_PATH} "")
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")
set(CLI11_DIR "${CMAKE_CURRENT_LIST_DIR}")
set(nlohmann_json_DIR "${CMAKE_CURRENT_LIST_DIR}")
# FindOpenMP would take the runtime's shared library (libgomp.so, or libgomp.dll.a on MinGW) into a
# -static link; the static archive instead.
execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libgomp.a OUTPUT_VARIABLE _fp8kit_gomp
                OUTPUT_STRIP_TRAILING_WHITESPACE)
set(OpenMP_gomp_LIBRARY "${_fp8kit_gomp}" CACHE FILEPATH "libgomp, static, for the cross target")
