# cmake/cross/nlohmann_jsonConfig.cmake: nlohmann_json::nlohmann_json for cross builds, from the
# build machine's headers (its version is checked by nlohmann_jsonConfigVersion.cmake).
include(${CMAKE_CURRENT_LIST_DIR}/host_headers.cmake)
fp8kit_host_headers(nlohmann_json nlohmann_json::nlohmann_json nlohmann/json.hpp nlohmann nlohmann-json3-dev)
