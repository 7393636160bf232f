# cmake/cross/CLI11Config.cmake: CLI11::CLI11 for cross builds, from the build machine's headers.
include(${CMAKE_CURRENT_LIST_DIR}/host_headers.cmake)
fp8kit_host_headers(CLI11 CLI11::CLI11 CLI/CLI.hpp CLI libcli11-dev)
