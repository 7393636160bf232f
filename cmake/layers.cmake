# cmake/layers.cmake: the library's layers as build targets (../shared/DESIGN.md, "Layout and
# layers": tools -> nn -> io -> core, with ref, cpu and platform inside core).
#
# fp8kit_layer(<target> SOURCES <file>... [BELOW <layer>...] [CHECK_MAIN <file.cpp>])
#   An OBJECT library holding one layer's code. It sees the usage requirements of the layers BELOW
#   it and of nothing else; the installed library is made of the layers' objects
#   (fp8kit_layer_objects), so users still link the one fp8kit::fp8kit.
#   With CHECK_MAIN, the layer is also linked into a program of its own objects and those of every
#   layer below it, nothing more: a call that runs up or sideways (core into io, io into nn) is an
#   undefined reference there and fails the build - the link-time half of the layering, beside the
#   include check of tests/layering.cmake. Checked by tests/layers_link.cmake, which plants such a
#   call and fails unless the build does.

# fp8kit_layer: see above. Records the layer and everything below it in the target property
# FP8KIT_LAYER_CLOSURE.
function(fp8kit_layer name)
    cmake_parse_arguments(PARSE_ARGV 1 arg "" "CHECK_MAIN" "SOURCES;BELOW")
    add_library(${name} OBJECT ${arg_SOURCES})
    set(closure ${name})
    foreach(below IN LISTS arg_BELOW)
        target_link_libraries(${name} PUBLIC ${below})
        get_target_property(below_closure ${below} FP8KIT_LAYER_CLOSURE)
        list(APPEND closure ${below_closure})
    endforeach()
    list(REMOVE_DUPLICATES closure)
    set_target_properties(${name} PROPERTIES FP8KIT_LAYER_CLOSURE "${closure}")
    if(arg_CHECK_MAIN)
        # Linking an object library puts all of its objects on the link line, so every symbol any
        # of them uses must be defined by this layer, a layer below, or a library they link.
        add_executable(${name}_links_alone ${arg_CHECK_MAIN})
        target_link_libraries(${name}_links_alone PRIVATE ${closure})
        set_target_properties(${name}_links_alone PROPERTIES
            RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/layers)
    endif()
endfunction()

# fp8kit_layer_objects(<target> <top layer>): adds the objects of <top layer> and of every layer
# below it to <target>.
function(fp8kit_layer_objects target top)
    get_target_property(closure ${top} FP8KIT_LAYER_CLOSURE)
    foreach(layer IN LISTS closure)
        target_sources(${target} PRIVATE $<TARGET_OBJECTS:${layer}>)
    endforeach()
    set_target_properties(${target} PROPERTIES LINKER_LANGUAGE CXX)
endfunction()
