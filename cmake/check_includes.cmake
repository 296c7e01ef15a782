# Fails if a file of module MODULE (src/MODULE) includes a header of a module
# it may not use. Run by the build before the module compiles (see
# failsafe_check_includes in CMakeLists.txt).
#   -DMODULE=name -DROOT=<src> -DALLOWED=a,b,... -DTEST_ALLOWED=a,b,...
#   -DSTAMP=<file touched on success>
cmake_minimum_required(VERSION 3.25)
string(REPLACE "," ";" allowed_main "${ALLOWED}")
string(REPLACE "," ";" allowed_test "${TEST_ALLOWED}")
file(GLOB_RECURSE files "${ROOT}/${MODULE}/*.h" "${ROOT}/${MODULE}/*.cc" "${ROOT}/${MODULE}/*.cuh"
     "${ROOT}/${MODULE}/*.cu")
set(bad "")
foreach(f ${files})
  get_filename_component(name "${f}" NAME)
  set(allowed ${allowed_main})
  set(kind "")
  # Tests and their helpers may use the test dependencies too.
  if(name MATCHES "(_test\\.cc|^test_[a-z_]+\\.(h|cc))$")
    set(allowed ${allowed_test})
    set(kind " tests")
  endif()
  file(STRINGS "${f}" lines REGEX "^[ \t]*#[ \t]*include[ \t]+\"[a-z_]+/")
  foreach(line ${lines})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]+\"([a-z_]+)/.*" "\\1" used "${line}")
    if(IS_DIRECTORY "${ROOT}/${used}" AND NOT used IN_LIST allowed)
      file(RELATIVE_PATH rel "${ROOT}/.." "${f}")
      string(REPLACE ";" ", " list "${allowed}")
      string(APPEND bad "\n  ${rel}: ${line}\n    (${MODULE}${kind} may use ${list})")
    endif()
  endforeach()
endforeach()
if(bad)
  message(FATAL_ERROR "an include across a module boundary:${bad}\n"
                      "The modules and what each may use: docs/ARCHITECTURE.md, Modules.")
endif()
file(TOUCH "${STAMP}")
