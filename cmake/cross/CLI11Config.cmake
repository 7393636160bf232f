# cmake/cross/CLI11Config.cmake: CLI11::CLI11 for cross builds. CLI11 is header-only, so the build
# machine's Debian package (/usr/include/CLI) serves any target; its headers are seen through a
# folder of their own in the build tree, so that the target's compiler never searches the build
# machine's /usr/include (its C library headers would shadow the target's). Checked by the
# windows-cross and arm64-cross builds of the fp8kit command.
if(NOT TARGET CLI11::CLI11)
    find_path(FP8KIT_CLI11_HOST_INCLUDE CLI/CLI.hpp PATHS /usr/include /usr/local/include
              NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)
    if(NOT FP8KIT_CLI11_HOST_INCLUDE)
        set(CLI11_FOUND FALSE)
        set(CLI11_NOT_FOUND_MESSAGE "CLI/CLI.hpp not found in /usr/include (Debian package libcli11-dev)")
        return()
    endif()
    set(_fp8kit_cli11_dir "${CMAKE_BINARY_DIR}/cross-include")
    file(MAKE_DIRECTORY "${_fp8kit_cli11_dir}")
    file(CREATE_LINK "${FP8KIT_CLI11_HOST_INCLUDE}/CLI" "${_fp8kit_cli11_dir}/CLI" SYMBOLIC)
    add_library(CLI11::CLI11 INTERFACE IMPORTED)
    set_target_properties(CLI11::CLI11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_fp8kit_cli11_dir}"
                          INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${_fp8kit_cli11_dir}")
endif()
set(CLI11_FOUND TRUE)
