# tests/layering.cmake: fails when an #include runs against the layering of ../shared/DESIGN.md -
# layers only point down:
#   tools/, python/  ->  nn  ->  io  ->  core (ref, cpu, cuda behind the backend table)  ->  platform
# The backends sit side by side below core's interface (core/ops.hpp): they include core, core
# includes none of them (it reaches them, device memory included, through their tables).
# An internal header ("core/ops.hpp", "platform/platform.hpp", "nn/...") may be included only by
# its own layer and the layers the table allows; a public header (<fp8kit/nn.hpp>, ...) only by
# layers at or above it; nothing includes tools/. The applications live in tools/ too (the GPT
# app, tools/gpt, on the public headers only): its header "gpt/gpt.hpp" is for the command and
# the benchmarks that time its training (bench/compare_libs.cpp) alone, never for the library
# (src/, the public headers in include/) or examples/. The command uses the benchmarks' library
# (`fp8kit bench`, advise's timings, the table printer of formats and train): tools/ may include
# "bench/...".
# Another layer's file is named by its folder ("bench/common.hpp"), so that this check sees it:
# a quoted include of no such folder must name a file beside the one including it.
# Run by ctest (label unit) two ways:
#   cmake -DROOT=<source tree> -P layering.cmake        checks src/ include/ tools/ bench/ examples/ python/;
#   cmake -DSELF_TEST=<scratch> -P layering.cmake       plants each kind of violation in a scratch
#       tree and fails unless every one is caught (and a clean include passes).
cmake_minimum_required(VERSION 3.25)

# layer -> the internal directories (quoted "dir/..." includes) it may use.
set(internal_core "core|platform")
set(internal_ref "core|ref")
set(internal_cpu "core|cpu|platform")
set(internal_cuda "core|cuda|platform")  # platform: cuBLASLt is loaded at run time (src/cuda/cublaslt.cpp)
set(internal_platform "platform")
set(internal_io "io|platform")
set(internal_nn "nn")
set(internal_tools "gpt|bench")  # the GPT app's header (tools/gpt/gpt.hpp), the benchmarks (bench/)
set(internal_bench "gpt")  # the GPT app, whose training compare_libs times
set(internal_examples "")
set(internal_python "")  # the Python extension (python/): public headers only
set(internal_include "")  # the public headers include only each other
# layer -> the public headers it must not include (those of the layers above it).
set(upper_io "nn")
set(above_core "nn|checkpoint|safetensors")
foreach(l core ref cpu cuda platform)
    set(upper_${l} "${above_core}")
endforeach()

function(check_tree root out)
    set(bad "")
    foreach(layer core ref cpu cuda platform io nn include tools bench examples python)
        if(layer MATCHES "^(include|tools|bench|examples|python)$")
            set(dir "${root}/${layer}")
        else()
            set(dir "${root}/src/${layer}")
        endif()
        file(GLOB_RECURSE files RELATIVE "${root}" "${dir}/*.cpp" "${dir}/*.hpp" "${dir}/*.h" "${dir}/*.cu"
             "${dir}/*.cuh" "${dir}/*.in")
        foreach(file IN LISTS files)
            file(STRINGS "${root}/${file}" lines REGEX "^[ \t]*#[ \t]*include")
            get_filename_component(folder "${root}/${file}" DIRECTORY)
            foreach(line IN LISTS lines)
                if(line MATCHES "#[ \t]*include[ \t]*\"(core|ref|cpu|cuda|platform|io|nn|tools|gpt|bench)/")
                    set(target "${CMAKE_MATCH_1}")
                    if("${internal_${layer}}" STREQUAL "" OR NOT target MATCHES "^(${internal_${layer}})$")
                        string(APPEND bad "\n  ${file} (layer ${layer}) includes ${target}'s internals: ${line}")
                    endif()
                elseif(line MATCHES "#[ \t]*include[ \t]*[<\"]fp8kit/([a-z_0-9]+)\\.hpp[>\"]")
                    set(header "${CMAKE_MATCH_1}")
                    if(DEFINED upper_${layer} AND header MATCHES "^(${upper_${layer}})$")
                        string(APPEND bad "\n  ${file} (layer ${layer}) includes a layer above it: ${line}")
                    endif()
                elseif(line MATCHES "#[ \t]*include[ \t]*\"([^\"]+)\"")
                    set(name "${CMAKE_MATCH_1}")
                    if(name MATCHES "/" OR NOT EXISTS "${folder}/${name}")
                        string(APPEND bad "\n  ${file} (layer ${layer}) includes a file that is not beside it without "
                                          "naming its layer's folder (as \"bench/common.hpp\"): ${line}")
                    endif()
                endif()
            endforeach()
        endforeach()
    endforeach()
    set(${out} "${bad}" PARENT_SCOPE)
endfunction()

if(DEFINED SELF_TEST)
    set(tree "${SELF_TEST}")
    # expect_check(file text want_fail [other files of the tree...])
    function(expect_check file text want_fail)
        file(REMOVE_RECURSE "${tree}")
        file(WRITE "${tree}/${file}" "// planted\n#include <vector>\n${text}\nint f() { return 1; }\n")
        foreach(other IN LISTS ARGN)
            file(WRITE "${tree}/${other}" "// planted\n")
        endforeach()
        check_tree("${tree}" bad)
        if(want_fail AND NOT bad)
            message(SEND_ERROR "not caught: '${text}' in ${file}")
        elseif(NOT want_fail AND bad)
            message(SEND_ERROR "false alarm: '${text}' in ${file}:${bad}")
        endif()
    endfunction()
    # nn into core internals, tools into platform, io into nn, anything into tools, core up.
    expect_check(src/nn/planted.cpp "#include \"core/ops.hpp\"" TRUE)
    expect_check(src/nn/planted.cpp "#include \"platform/platform.hpp\"" TRUE)
    expect_check(tools/planted.cpp "#include \"platform/platform.hpp\"" TRUE)
    expect_check(tools/planted.cpp "#include \"io/shards.hpp\"" TRUE)
    expect_check(src/io/planted.cpp "#include \"nn/layers.hpp\"" TRUE)
    expect_check(src/io/planted.cpp "#include <fp8kit/nn.hpp>" TRUE)
    expect_check(src/core/planted.cpp "#include \"fp8kit/checkpoint.hpp\"" TRUE)
    expect_check(src/cpu/planted.cpp "#include \"io/x.hpp\"" TRUE)
    expect_check(src/ref/planted.cpp "#include \"cpu/gemm_kernels.hpp\"" TRUE)
    expect_check(bench/planted.cpp "#include \"cpu/parallel.hpp\"" TRUE)
    expect_check(src/core/planted.cpp "#  include \"tools/commands.hpp\"" TRUE)
    # core reaches the backends through their tables only.
    expect_check(src/core/planted.cpp "#include \"cuda/common.cuh\"" TRUE)
    expect_check(src/core/planted.cpp "#include \"cpu/gemm_kernels.hpp\"" TRUE)
    expect_check(src/core/planted.cpp "#include \"ref/x.hpp\"" TRUE)
    # The GPT app (tools/gpt): the library, its public headers, bench and examples never include
    # it; the app itself uses public headers only.
    expect_check(src/nn/planted.cpp "#include \"gpt/gpt.hpp\"" TRUE)
    expect_check(include/fp8kit/planted.hpp "#include \"gpt/gpt.hpp\"" TRUE)
    expect_check(include/fp8kit/planted.hpp "#include \"core/ops.hpp\"" TRUE)
    expect_check(examples/planted.cpp "#include \"gpt/gpt.hpp\"" TRUE)
    expect_check(tools/gpt/planted.cpp "#include \"nn/layer_args.hpp\"" TRUE)
    expect_check(python/planted.cpp "#include \"core/ops.hpp\"" TRUE)
    expect_check(python/planted.cpp "#include \"gpt/gpt.hpp\"" TRUE)
    # Another layer's file by a bare name (found through an include path, unseen by the table).
    expect_check(tools/planted.cpp "#include \"common.hpp\"" TRUE bench/common.hpp)
    expect_check(bench/planted.cpp "#include \"gpt.hpp\"" TRUE tools/gpt/gpt.hpp)
    expect_check(src/core/planted.cpp "#include \"device.hpp\"" TRUE src/cuda/device.hpp)
    expect_check(src/core/planted.cpp "#include \"../cuda/device.hpp\"" TRUE src/cuda/device.hpp)
    expect_check(examples/planted.cpp "#include \"bench/common.hpp\"" TRUE)
    expect_check(src/nn/planted.cpp "#include \"bench/common.hpp\"" TRUE)
    # What the layering allows.
    expect_check(src/nn/planted.cpp "#include \"fp8kit/checkpoint.hpp\"" FALSE)
    expect_check(src/nn/planted.cpp "#include \"nn/layer_args.hpp\"" FALSE)
    expect_check(src/cpu/planted.cpp "#include \"core/ops.hpp\"" FALSE)
    expect_check(src/cuda/planted.cu "#include \"core/ops.hpp\"" FALSE)
    expect_check(src/io/planted.cpp "#include \"platform/platform.hpp\"" FALSE)
    expect_check(tools/planted.cpp "#include \"fp8kit/nn.hpp\"" FALSE)
    expect_check(tools/planted.cpp "#include \"commands.hpp\"" FALSE tools/commands.hpp)
    expect_check(tools/planted.cpp "#include \"bench/common.hpp\"" FALSE)
    expect_check(bench/planted.cpp "#include \"common.hpp\"" FALSE bench/common.hpp)
    expect_check(bench/planted.cpp "#include \"gpt/gpt.hpp\"" FALSE)
    expect_check(tools/planted.cpp "#include \"gpt/gpt.hpp\"" FALSE)
    expect_check(tools/gpt/planted.cpp "#include \"fp8kit/nn.hpp\"" FALSE)
    expect_check(python/planted.cpp "#include \"fp8kit/nn.hpp\"" FALSE)
    expect_check(include/fp8kit/planted.hpp "#include \"fp8kit/tensor.hpp\"" FALSE)
    file(REMOVE_RECURSE "${tree}")
    return()
endif()

if(NOT DEFINED ROOT)
    message(FATAL_ERROR "usage: cmake -DROOT=<source tree> -P layering.cmake (or -DSELF_TEST=<scratch>)")
endif()
check_tree("${ROOT}" bad)
if(bad)
    message(FATAL_ERROR "includes against the layering (../shared/DESIGN.md, 'Layout and layers'):${bad}")
endif()
message(STATUS "layering: every include points down")
