# cmake/cross/nlohmann_jsonConfigVersion.cmake: find_package(nlohmann_json <version>) in cross
# builds answers with the build machine's package version (header-only: any target may use it).
include(/usr/share/cmake/nlohmann_json/nlohmann_jsonConfigVersion.cmake OPTIONAL RESULT_VARIABLE _fp8kit_json_version_file)
if(NOT _fp8kit_json_version_file)
    set(PACKAGE_VERSION "unknown")
    set(PACKAGE_VERSION_UNSUITABLE TRUE)
endif()
