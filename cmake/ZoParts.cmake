# Parts: each folder of the library is a static library target of its own
# (PIC, so libzoffload.so is built from the same objects). A part's folder is
# its private include dir: only its own sources see its headers. What a part
# offers the other parts sits in <folder>/interface, its PUBLIC include dir.
# Parts use each other through target_link_libraries PRIVATE, one way only
# (docs/ARCHITECTURE.md draws the arrows).
#
# zo_add_part(<target> SOURCES <files>... [PARTS <parts>...] [LIBS <libs>...]
#             [DIRS <folders>...] [TOOLS])
#   PARTS: the parts it uses; LIBS: external libraries; DIRS: the folders
#   whose headers are private to it, when not just the current one (a part
#   spread over several folders);
#   TOOLS: a tools-level library, left out of libzoffload.
#
# Each part and the parts it uses are recorded for tools/scripts/check-walls.sh,
# which refuses an #include of another part's private header and a cycle
# among the parts (zo_write_parts_manifest).

function(zo_add_part name)
  cmake_parse_arguments(P "TOOLS" "" "SOURCES;PARTS;LIBS;DIRS" ${ARGN})
  add_library(${name} STATIC ${P_SOURCES})
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  set(private_dirs "")
  if(NOT P_DIRS)
    set(P_DIRS .)
  endif()
  foreach(d ${P_DIRS})
    get_filename_component(d ${d} ABSOLUTE BASE_DIR ${CMAKE_CURRENT_SOURCE_DIR})
    list(APPEND private_dirs ${d})
  endforeach()
  target_include_directories(${name}
    PUBLIC ${PROJECT_SOURCE_DIR}/include ${PROJECT_BINARY_DIR}/include
    PRIVATE ${private_dirs})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/interface)
    target_include_directories(${name} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/interface)
  endif()
  target_link_libraries(${name} PRIVATE ${P_PARTS} ${P_LIBS})
  if(ZO_HAVE_CUDA)
    target_compile_definitions(${name} PRIVATE ZO_HAVE_CUDA=1)
    if(ZO_HAVE_NCCL)
      target_compile_definitions(${name} PRIVATE ZO_HAVE_NCCL=1)
    endif()
  endif()
  set_target_properties(${name} PROPERTIES ZO_PART_PRIVATE_DIRS "${private_dirs}")
  list(JOIN private_dirs "," dirs)
  set_property(GLOBAL APPEND PROPERTY ZO_PARTS_MANIFEST "part ${name} ${dirs}")
  set_property(GLOBAL APPEND PROPERTY ZO_ALL_PARTS ${name})
  if(NOT P_TOOLS)
    set_property(GLOBAL APPEND PROPERTY ZO_LIBRARY_PARTS ${name})
  endif()
endfunction()

# A test that must reach a part's internals (a fault hook, a function made
# testable) names the part here: it gets the part's private include dirs, and
# check-walls.sh lets the test's folder include that part's private headers.
# Test through the public API when you can.
function(zo_part_internal_for_tests test part)
  get_target_property(dirs ${part} ZO_PART_PRIVATE_DIRS)
  target_include_directories(${test} PRIVATE ${dirs})
  target_link_libraries(${test} PRIVATE ${part})
  set_property(GLOBAL APPEND PROPERTY ZO_PARTS_MANIFEST "test ${CMAKE_CURRENT_SOURCE_DIR} ${part}")
endfunction()

# A part's test hooks: <part>_testing, a static library of its own that only
# test programs link (through zoffload_testing), so neither libzoffload nor
# the tools hold them. Its sources sit in the part's folder under DIR and may
# use the part's private headers; DIR holds the header the tests include
# (DIR/zo/<name>_testing.h). The part itself keeps no more than the point
# where a hook attaches.
#
# zo_add_part_testing(<part> DIR <folder> SOURCES <files>...)
function(zo_add_part_testing part)
  cmake_parse_arguments(T "" "DIR" "SOURCES" ${ARGN})
  set(t ${part}_testing)
  add_library(${t} STATIC ${T_SOURCES})
  get_target_property(dirs ${part} ZO_PART_PRIVATE_DIRS)
  target_include_directories(${t} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/${T_DIR} PRIVATE ${dirs})
  target_link_libraries(${t} PRIVATE ${part} zo_core)
  if(ZO_HAVE_CUDA)
    target_compile_definitions(${t} PRIVATE ZO_HAVE_CUDA=1)
  endif()
  target_link_libraries(zoffload_testing INTERFACE ${t})
endfunction()

# Writes the parts and the tests' exceptions for check-walls.sh; call it last.
function(zo_write_parts_manifest file)
  get_property(lines GLOBAL PROPERTY ZO_PARTS_MANIFEST)
  get_property(parts GLOBAL PROPERTY ZO_ALL_PARTS)
  foreach(p ${parts})
    # The links as they stand after every CMakeLists has run, not only
    # those zo_add_part was given.
    get_target_property(links ${p} LINK_LIBRARIES)
    set(uses "")
    foreach(l ${links})
      if(l IN_LIST parts)
        list(APPEND uses ${l})
      endif()
    endforeach()
    list(JOIN uses "," uses)
    list(APPEND lines "uses ${p} ${uses}")
  endforeach()
  list(REMOVE_DUPLICATES lines)
  list(JOIN lines "\n" text)
  file(WRITE ${file} "${text}\n")
endfunction()
