# CUTLASS / CuTe headers. Nothing is vendored: by default they come from the pinned
# `nvidia-cutlass` wheel (its cutlass_library/source/include); -DCUTLASS_DIR=<cutlass
# checkout or install prefix> points at a user's own copy instead.
set(CUTLASS_DIR "" CACHE PATH "CUTLASS root (holding include/cutlass); empty: use the nvidia-cutlass wheel")

if(CUTLASS_DIR)
  set(_rudnn_cutlass_include ${CUTLASS_DIR}/include)
else()
  if(NOT Python_EXECUTABLE)
    find_package(Python 3.9 COMPONENTS Interpreter REQUIRED)
  endif()
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c
      "import importlib.util, os; s = importlib.util.find_spec('cutlass_library'); print(os.path.join(list(s.submodule_search_locations)[0], 'source', 'include') if s else '')"
    OUTPUT_VARIABLE _rudnn_cutlass_include OUTPUT_STRIP_TRAILING_WHITESPACE)
endif()

if(NOT _rudnn_cutlass_include OR NOT EXISTS "${_rudnn_cutlass_include}/cute/tensor.hpp")
  message(FATAL_ERROR "ruDNN: CUTLASS/CuTe headers not found (looked in '${_rudnn_cutlass_include}'). "
    "Install the pinned wheel (pip install nvidia-cutlass==4.2.0.0) or pass -DCUTLASS_DIR=<path>.")
endif()
message(STATUS "ruDNN: CUTLASS headers from ${_rudnn_cutlass_include}")

# CUTLASS 3.x's convolution collectives include cutlass/util/packed_stride.hpp, which CUTLASS
# keeps in tools/util/include (the wheel ships it beside include/).
get_filename_component(_rudnn_cutlass_util_include "${_rudnn_cutlass_include}/../tools/util/include" ABSOLUTE)
if(NOT EXISTS "${_rudnn_cutlass_util_include}/cutlass/util/packed_stride.hpp")
  message(FATAL_ERROR "ruDNN: cutlass/util/packed_stride.hpp not found in '${_rudnn_cutlass_util_include}' "
    "(CUTLASS's tools/util/include, needed by the sm90 convolution kernels).")
endif()

add_library(rudnn_cutlass_headers INTERFACE)
target_include_directories(rudnn_cutlass_headers SYSTEM INTERFACE ${_rudnn_cutlass_include} ${_rudnn_cutlass_util_include})
