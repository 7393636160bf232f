# cmake/cross/host_headers.cmake: a header-only Debian package of the build machine (CLI11,
# nlohmann-json) as an imported target for cross builds. Header-only code serves any target, but
# the target's compiler must never search the build machine's /usr/include (its C library headers
# would shadow the target's), so the package's folder is linked into a folder of its own in the
# build tree. Used by the <Package>Config.cmake files next to it; checked by the windows-cross and
# arm64-cross builds.
function(fp8kit_host_headers package target probe folder debian)
    if(TARGET ${target})
        set(${package}_FOUND TRUE PARENT_SCOPE)
        return()
    endif()
    find_path(FP8KIT_${package}_HOST_INCLUDE ${probe} PATHS /usr/include /usr/local/include
              NO_DEFAULT_PATH NO_CMAKE_FIND_ROOT_PATH)
    if(NOT FP8KIT_${package}_HOST_INCLUDE)
        set(${package}_FOUND FALSE PARENT_SCOPE)
        set(${package}_NOT_FOUND_MESSAGE "${probe} not found in /usr/include (Debian package ${debian})"
            PARENT_SCOPE)
        return()
    endif()
    set(dir "${CMAKE_BINARY_DIR}/cross-include/${package}")
    file(MAKE_DIRECTORY "${dir}")
    file(CREATE_LINK "${FP8KIT_${package}_HOST_INCLUDE}/${folder}" "${dir}/${folder}" SYMBOLIC)
    add_library(${target} INTERFACE IMPORTED GLOBAL)
    set_target_properties(${target} PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${dir}"
                          INTERFACE_SYSTEM_INCLUDE_DIRECTORIES "${dir}")
    set(${package}_FOUND TRUE PARENT_SCOPE)
endfunction()
