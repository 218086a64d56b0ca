# Run at build time (cmake -P) by the lmserve_build_info target: writes build_info.cpp from the
# template configured at configure time (TEMPLATE, with every field but the commit filled in)
# and the commit checked out now, "-dirty" appended when tracked files differ from it. The file
# is rewritten only when its text changes, so an unchanged commit relinks nothing.
# In: SOURCE_DIR, TEMPLATE, OUT.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE_DIR}
                OUTPUT_VARIABLE LMSERVE_GIT_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT LMSERVE_GIT_COMMIT)
  set(LMSERVE_GIT_COMMIT unknown)
else()
  execute_process(COMMAND git status --porcelain --untracked-files=no WORKING_DIRECTORY ${SOURCE_DIR}
                  OUTPUT_VARIABLE changes OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(changes)
    string(APPEND LMSERVE_GIT_COMMIT "-dirty")
  endif()
endif()
configure_file(${TEMPLATE} ${OUT} @ONLY)
