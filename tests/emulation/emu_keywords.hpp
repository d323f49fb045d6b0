// The CUDA keywords of the kernels' source, defined away for the host compiler. Include it after
// every header that needs the real CUDA, CUTLASS or CuTe definitions and before the kernels'
// headers and extracted text (no include guard on purpose: it only defines macros).
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __grid_constant__
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n)
