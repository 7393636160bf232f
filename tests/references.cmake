# tests/references.cmake: fails when a comment or a document names a file of the project that does
# not exist - the "Checked by tests/unit/test_x.cpp" that outlived a move or a rename. Scans the
# comments of the sources (// and # lines), README.md and docs/*.md for paths under include/ src/
# tools/ bench/ tests/ docs/ scripts/ examples/, and checks each one. Run by ctest (label unit):
#   cmake -DROOT=<source tree> -P references.cmake
#   cmake -DSELF_TEST=<scratch> -P references.cmake   plants a dangling and a good reference and
#       fails unless only the dangling one is reported.
cmake_minimum_required(VERSION 3.25)

# Generated at build time (configure_file), or planted by the confinement tests' self-checks.
set(generated "include/fp8kit/version\\.hpp|tools/gpt/corpus\\.cpp|.*/planted[a-z_]*\\.(cpp|hpp)")
set(path_re "(include|src|tools|bench|tests|docs|scripts|examples)/[A-Za-z0-9_./-]*[A-Za-z0-9_]\\.(cpp|hpp|h|cuh|cu|py|sh|cmake|md|txt|in|json)")

function(check_tree root out)
    set(bad "")
    file(GLOB_RECURSE sources RELATIVE "${root}"
         "${root}/include/*.hpp" "${root}/src/*.cpp" "${root}/src/*.hpp" "${root}/src/*.cu" "${root}/tools/*.cpp"
         "${root}/tools/*.hpp" "${root}/bench/*.cpp" "${root}/bench/*.hpp" "${root}/examples/*.cpp"
         "${root}/tests/*.cpp" "${root}/tests/*.hpp" "${root}/tests/*.cu" "${root}/tests/*.py" "${root}/tests/*.sh"
         "${root}/tests/*.cmake" "${root}/scripts/*" "${root}/docs/*.md")
    if(EXISTS "${root}/README.md")
        list(APPEND sources README.md)
    endif()
    foreach(file IN LISTS sources)
        if(file MATCHES "^tests/references\\.cmake$")  # its own self-test names made-up files
            continue()
        endif()
        if(file MATCHES "\\.md$")
            file(STRINGS "${root}/${file}" lines)
        else()
            # Comment lines, and the comment at the end of a code line.
            file(STRINGS "${root}/${file}" lines REGEX "(^[ \t]*(//|#[^!a-z]|#$))|([ \t]//)")
        endif()
        foreach(line IN LISTS lines)
            # Paths built from a variable ($src/tests/..., ${ROOT}/src/...) are not names in prose.
            string(REGEX REPLACE "[$}][A-Za-z_{}]*/" " " line "${line}")
            string(REGEX MATCHALL "${path_re}" found "${line}")
            foreach(p IN LISTS found)
                if(p MATCHES "^(${generated})$" OR EXISTS "${root}/${p}")
                    continue()
                endif()
                string(APPEND bad "\n  ${file}: names ${p}, which does not exist")
            endforeach()
        endforeach()
    endforeach()
    set(${out} "${bad}" PARENT_SCOPE)
endfunction()

if(DEFINED SELF_TEST)
    set(tree "${SELF_TEST}")
    file(REMOVE_RECURSE "${tree}")
    file(WRITE "${tree}/tests/unit/test_real.cpp" "// a test\n")
    file(WRITE "${tree}/src/core/x.cpp"
         "// Checked by tests/unit/test_real.cpp and tests/unit/test_gone.cpp.\nint x = 1;  // see docs/NOPE.md\n")
    check_tree("${tree}" bad)
    if(NOT bad MATCHES "tests/unit/test_gone\\.cpp" OR NOT bad MATCHES "docs/NOPE\\.md")
        message(SEND_ERROR "a dangling reference was not caught:${bad}")
    endif()
    if(bad MATCHES "test_real")
        message(SEND_ERROR "false alarm on an existing file:${bad}")
    endif()
    file(REMOVE_RECURSE "${tree}")
    return()
endif()

if(NOT DEFINED ROOT)
    message(FATAL_ERROR "usage: cmake -DROOT=<source tree> -P references.cmake (or -DSELF_TEST=<scratch>)")
endif()
check_tree("${ROOT}" bad)
if(bad)
    message(FATAL_ERROR "references to files that do not exist:${bad}")
endif()
message(STATUS "references: every file named in a comment or document exists")
