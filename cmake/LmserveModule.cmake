# Project-wide compile settings, applied to project targets only (not to dependencies).
add_library(lmserve_options INTERFACE)
target_compile_options(lmserve_options INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wnon-virtual-dtor -Wno-missing-field-initializers>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wshadow=local>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${LMSERVE_WERROR}>>:-Werror>
  $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${LMSERVE_WERROR}>>:-Werror=all-warnings>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
if(LMSERVE_SANITIZE)
  target_compile_options(lmserve_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_link_options(lmserve_options INTERFACE -fsanitize=address,undefined)
endif()
if(LMSERVE_FUZZ)
  # Every project object is instrumented for coverage; the fuzz targets add the libFuzzer main.
  target_compile_options(lmserve_options INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer>)
  target_link_options(lmserve_options INTERFACE -fsanitize=address,undefined)
endif()
target_include_directories(lmserve_options INTERFACE ${PROJECT_SOURCE_DIR}/src)

# lmserve_module(NAME SOURCES <files...> DEPS <targets...>)
# One static library per src/ folder, named lmserve_<NAME>. A module whose sources have not
# landed yet is an INTERFACE library, so the dependency graph is declared before the code.
function(lmserve_module name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  set(target lmserve_${name})
  if(ARG_SOURCES)
    add_library(${target} STATIC ${ARG_SOURCES})
    target_link_libraries(${target} PUBLIC lmserve_options ${ARG_DEPS})
  else()
    add_library(${target} INTERFACE)
    target_link_libraries(${target} INTERFACE lmserve_options ${ARG_DEPS})
  endif()
endfunction()
