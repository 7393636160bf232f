# tests/layers_link.cmake: checks the link-time layering of cmake/layers.cmake on a scratch project
# of two layers (low, and high above it): they build when every call points down, and the build
# fails, naming the symbol, when low calls up into high. (The real layers are linked the same way
# in every build with tests: fp8kit_core_links_alone, fp8kit_io_links_alone, fp8kit_nn_links_alone.)
# Run by ctest (label unit):
#   cmake -DROOT=<source tree> -DSCRATCH=<dir> -DCXX=<compiler> -P layers_link.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED ROOT OR NOT DEFINED SCRATCH OR NOT DEFINED CXX)
    message(FATAL_ERROR "usage: cmake -DROOT=<source tree> -DSCRATCH=<dir> -DCXX=<compiler> -P layers_link.cmake")
endif()
file(REMOVE_RECURSE "${SCRATCH}")
file(WRITE "${SCRATCH}/src/CMakeLists.txt" "cmake_minimum_required(VERSION 3.25)
project(layers_link CXX)
option(PLANTED \"low calls up into high\" OFF)
include(${ROOT}/cmake/layers.cmake)
fp8kit_layer(low SOURCES low.cpp CHECK_MAIN ${ROOT}/cmake/links_alone.cpp)
fp8kit_layer(high SOURCES high.cpp BELOW low CHECK_MAIN ${ROOT}/cmake/links_alone.cpp)
if(PLANTED)
    target_compile_definitions(low PRIVATE PLANTED)
endif()
add_library(whole)
fp8kit_layer_objects(whole high)
add_executable(user user.cpp)
target_link_libraries(user PRIVATE whole)
")
file(WRITE "${SCRATCH}/src/low.cpp" "int low_value() { return 1; }
#ifdef PLANTED
int high_value();
int low_calls_up() { return high_value(); }
#endif
")
file(WRITE "${SCRATCH}/src/high.cpp" "int low_value();\nint high_value() { return low_value() + 1; }\n")
file(WRITE "${SCRATCH}/src/user.cpp" "int high_value();\nint main() { return high_value() == 2 ? 0 : 1; }\n")

function(build planted out_rc out_log)
    execute_process(COMMAND ${CMAKE_COMMAND} -S "${SCRATCH}/src" -B "${SCRATCH}/build"
                            -DCMAKE_CXX_COMPILER=${CXX} -DPLANTED=${planted}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "configuring the scratch project failed:\n${log}")
    endif()
    execute_process(COMMAND ${CMAKE_COMMAND} --build "${SCRATCH}/build"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
    set(${out_rc} ${rc} PARENT_SCOPE)
    set(${out_log} "${log}" PARENT_SCOPE)
endfunction()

# Every call points down: the layers link alone, and the library of their objects serves a user.
build(OFF rc log)
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the clean layers failed to build:\n${log}")
endif()
execute_process(COMMAND "${SCRATCH}/build/user" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the library made of the layers' objects computed the wrong value (exit ${rc})")
endif()
# low calls up: low_links_alone must fail, on the name of the missing symbol.
build(ON rc log)
if(rc EQUAL 0)
    message(FATAL_ERROR "not caught: the planted call from low up into high linked")
endif()
if(NOT log MATCHES "low_links_alone" OR NOT log MATCHES "high_value")
    message(FATAL_ERROR "the planted call failed the build, but not in low_links_alone on high_value:\n${log}")
endif()
file(REMOVE_RECURSE "${SCRATCH}")
message(STATUS "layers_link: a call up a layer fails the build; calls down link")
