# libruDNN itself: its sources, flags, install and CMake package (included by CMakeLists.txt
# unless RUDNN_PREBUILT_LIBRARY names a library built already).
if(RUDNN_WITH_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES ${RUDNN_CUDA_ARCHS})
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  include(third_party/cutlass.cmake)
endif()

# What every compile of libruDNN's sources gets (the library and its per-generation object libraries).
function(rudnn_compile_settings target)
  target_include_directories(${target} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/cpp/include ${CMAKE_CURRENT_SOURCE_DIR}/cpp/src)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  if(RUDNN_WITH_CUDA)
    target_compile_definitions(${target} PRIVATE RUDNN_WITH_CUDA=1)
    target_link_libraries(${target} PRIVATE rudnn_cutlass_headers)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall -Xcudafe=--display_error_number>)
    if(RUDNN_PTXAS_VERBOSE)
      target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-v>)
    endif()
  endif()
endfunction()

file(GLOB RUDNN_CXX_SOURCES CONFIGURE_DEPENDS cpp/src/*/*.cpp)
if(RUDNN_WITH_CUDA)
  file(GLOB RUDNN_CUDA_SOURCES CONFIGURE_DEPENDS cpp/src/*/*.cu)
  if(NOT RUDNN_WITH_SM90WS)
    list(FILTER RUDNN_CUDA_SOURCES EXCLUDE REGEX "_sm90ws_[^/]*\\.cu$")
  endif()
  if(NOT RUDNN_WITH_MOE_GEMM_VARIANTS)
    list(FILTER RUDNN_CUDA_SOURCES EXCLUDE REGEX "_sm90_variant_[^/]*\\.cu$")
  endif()
else()
  list(FILTER RUDNN_CXX_SOURCES EXCLUDE REGEX "cpp/src/core/device\\.cpp$")
endif()

# Each kernel generation compiles only for the architectures that run it. *_sm90*.cu (wgmma, TMA;
# their kernels are empty stubs below sm_90) go to the 9x entries of RUDNN_CUDA_ARCHS; *_sm80*.cu
# (mma.sync, cp.async) to the others: Hopper runs them only when asked to (RUDNN_ATTENTION_FLASH=sm80,
# RUDNN_MOE_SM80_ON_SM90=1, attention's "autotune"), from their compute_80 PTX, which the driver
# compiles at first use. A list without entries of one kind (the GPU check's "90a") compiles that
# generation for the whole list. This halves the compiles of 50 of the 76 CUDA files (42 of the 68 without sm90ws).
set(RUDNN_KERNEL_OBJECTS "")
if(RUDNN_WITH_CUDA)
  set(_rudnn_archs_sm90 ${RUDNN_CUDA_ARCHS})
  list(FILTER _rudnn_archs_sm90 INCLUDE REGEX "^9")
  set(_rudnn_archs_sm80 ${RUDNN_CUDA_ARCHS})
  list(FILTER _rudnn_archs_sm80 EXCLUDE REGEX "^9")
  foreach(gen sm80 sm90)
    set(_files ${RUDNN_CUDA_SOURCES})
    list(FILTER _files INCLUDE REGEX "_${gen}[^/]*\\.cu$")
    if(_files AND _rudnn_archs_${gen} AND NOT "${_rudnn_archs_${gen}}" STREQUAL "${RUDNN_CUDA_ARCHS}")
      list(REMOVE_ITEM RUDNN_CUDA_SOURCES ${_files})
      add_library(ruDNN_${gen} OBJECT ${_files})
      set_target_properties(ruDNN_${gen} PROPERTIES CUDA_ARCHITECTURES "${_rudnn_archs_${gen}}")
      rudnn_compile_settings(ruDNN_${gen})
      list(APPEND RUDNN_KERNEL_OBJECTS $<TARGET_OBJECTS:ruDNN_${gen}>)
    endif()
  endforeach()
endif()

add_library(ruDNN SHARED ${RUDNN_CXX_SOURCES} ${RUDNN_CUDA_SOURCES} ${RUDNN_KERNEL_OBJECTS})
rudnn_compile_settings(ruDNN)
# The build's identity in the on-disk autotune cache's keys (core/tune_cache.hpp): the version
# and the commit the tree is at when configured, so that a rebuilt library times its kernels anew.
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}
  OUTPUT_VARIABLE RUDNN_COMMIT OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rudnn_git_status)
if(NOT rudnn_git_status EQUAL 0 OR RUDNN_COMMIT STREQUAL "")
  set(RUDNN_COMMIT "unknown")
endif()
set_source_files_properties(cpp/src/core/tune_cache.cpp PROPERTIES
  COMPILE_DEFINITIONS "RUDNN_VERSION=\"${PROJECT_VERSION}\";RUDNN_COMMIT=\"${RUDNN_COMMIT}\"")
# Only the file that holds the kernel table knows whether sm90ws was built (a definition on the
# whole target would change every compile's flags, and with them every ccache key).
if(RUDNN_WITH_CUDA AND RUDNN_WITH_SM90WS)
  set_source_files_properties(cpp/src/attention/attention_cuda.cu PROPERTIES COMPILE_DEFINITIONS RUDNN_WITH_SM90WS=1)
endif()
# The same for the MoE GEMM variants: the file that picks a schedule and the ones that define them
# (CMakeLists.txt tells the bindings' module.cpp, for rudnn._C.has_moe_gemm_variants).
if(RUDNN_WITH_CUDA AND RUDNN_WITH_MOE_GEMM_VARIANTS)
  file(GLOB _rudnn_variants CONFIGURE_DEPENDS cpp/src/moe/grouped_gemm_sm90_variant_*.cu)
  set_source_files_properties(cpp/src/moe/experts_tc_cuda.cu ${_rudnn_variants} PROPERTIES
    COMPILE_DEFINITIONS RUDNN_WITH_MOE_GEMM_VARIANTS=1)
endif()
target_include_directories(ruDNN
  PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/cpp/include> $<INSTALL_INTERFACE:${RUDNN_INSTALL_INCLUDEDIR}>)
if(RUDNN_WITH_CUDA)
  # cudart is linked statically: the library then loads on machines without a CUDA
  # toolkit (and without a GPU, where CUDA calls report "no device").
  target_link_libraries(ruDNN PRIVATE CUDA::cudart_static)
endif()
if(SKBUILD)
  # A wheel cannot hold symlinks, so libruDNN.so -> .so.0 -> .so.0.1.0 would be three full copies:
  # the wheel gets one file, named by the SONAME that rudnn._C and CMake consumers link against.
  set_target_properties(ruDNN PROPERTIES OUTPUT_NAME ruDNN SOVERSION ${PROJECT_VERSION_MAJOR})
  set(RUDNN_NAMELINK NAMELINK_SKIP)
else()
  set_target_properties(ruDNN PROPERTIES OUTPUT_NAME ruDNN VERSION ${PROJECT_VERSION} SOVERSION ${PROJECT_VERSION_MAJOR})
  set(RUDNN_NAMELINK "")
endif()
if(CMAKE_SYSTEM_NAME STREQUAL "Linux")
  # A missing backend function is a link error here, not an ImportError at run time.
  target_link_options(ruDNN PRIVATE -Wl,--no-undefined)
endif()
rudnn_hide_static_archives(ruDNN)

# ---- install + CMake package config (find_package(ruDNN)) ----
include(CMakePackageConfigHelpers)
install(TARGETS ruDNN EXPORT ruDNNTargets
  LIBRARY DESTINATION ${RUDNN_INSTALL_LIBDIR} ${RUDNN_NAMELINK}
  ARCHIVE DESTINATION ${RUDNN_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${RUDNN_INSTALL_LIBDIR})
install(DIRECTORY cpp/include/rudnn DESTINATION ${RUDNN_INSTALL_INCLUDEDIR})
install(EXPORT ruDNNTargets NAMESPACE ruDNN:: DESTINATION ${RUDNN_INSTALL_CMAKEDIR})
configure_package_config_file(cmake/ruDNNConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/ruDNNConfig.cmake
  INSTALL_DESTINATION ${RUDNN_INSTALL_CMAKEDIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/ruDNNConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/ruDNNConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/ruDNNConfigVersion.cmake
  DESTINATION ${RUDNN_INSTALL_CMAKEDIR})
