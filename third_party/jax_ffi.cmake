# XLA FFI headers for the JAX handlers, taken from the installed jaxlib
# (jax.ffi.include_dir()). Optional: without them rudnn.jax reports that the build
# has no JAX support. Build with --no-build-isolation so the build sees your jax.
set(RUDNN_JAX_FFI_FOUND OFF)
if(NOT RUDNN_WITH_JAX STREQUAL "OFF")
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c
      "import importlib.util, os; s = importlib.util.find_spec('jaxlib'); print(os.path.join(list(s.submodule_search_locations)[0], 'include') if s else '')"
    OUTPUT_VARIABLE RUDNN_JAX_FFI_INCLUDE_DIR OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(RUDNN_JAX_FFI_INCLUDE_DIR AND EXISTS "${RUDNN_JAX_FFI_INCLUDE_DIR}/xla/ffi/api/ffi.h")
    set(RUDNN_JAX_FFI_FOUND ON)
    message(STATUS "ruDNN: XLA FFI headers from ${RUDNN_JAX_FFI_INCLUDE_DIR}")
  elseif(RUDNN_WITH_JAX STREQUAL "ON")
    message(FATAL_ERROR "ruDNN: RUDNN_WITH_JAX=ON but jaxlib's XLA FFI headers were not found")
  else()
    message(STATUS "ruDNN: jaxlib not found; building without the JAX FFI handlers")
  endif()
endif()
