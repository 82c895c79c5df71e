// CUDA reduction kernel: dst += src, launched on the caller's stream.
//
// Self-contained (no torch headers) so that it compiles with nvcc alone; setup.py adds it to the
// extension when torch is a CUDA build, and tests/test_cuda_kernel.py compiles it with nvcc whenever
// a CUDA toolkit is present. The executor launches it on the current stream right after the
// receive's wait(), which on NCCL makes that stream wait for the receive: the reduction is
// therefore ordered after the data arrived and before any later send of the same bytes.
//
// dtype codes (reduce.cpp: cuda_dtype_code): 0 float32, 1 float64, 2 float16, 3 bfloat16,
// 4 int32, 5 int64. Half types add in float and round once per element, like ATen.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

template <typename T>
__global__ void add_kernel(T* __restrict__ dst, const T* __restrict__ src, int64_t count) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] = dst[i] + src[i];
  }
}

__global__ void add_kernel_half(__half* __restrict__ dst, const __half* __restrict__ src, int64_t count) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] = __float2half(__half2float(dst[i]) + __half2float(src[i]));
  }
}

__global__ void add_kernel_bf16(__nv_bfloat16* __restrict__ dst, const __nv_bfloat16* __restrict__ src,
                                int64_t count) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] = __float2bfloat16(__bfloat162float(dst[i]) + __bfloat162float(src[i]));
  }
}

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

int64_t blocks_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return blocks < kMaxBlocks ? blocks : kMaxBlocks;
}

}  // namespace

extern "C" int stragglerkit_cuda_reduce_add(void* dst, const void* src, int64_t count, int dtype_code,
                                            void* stream_handle) {
  if (count <= 0) {
    return 0;
  }
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  const dim3 grid(static_cast<unsigned>(blocks_for(count)));
  switch (dtype_code) {
    case 0:
      add_kernel<<<grid, kThreads, 0, stream>>>(static_cast<float*>(dst), static_cast<const float*>(src), count);
      break;
    case 1:
      add_kernel<<<grid, kThreads, 0, stream>>>(static_cast<double*>(dst), static_cast<const double*>(src), count);
      break;
    case 2:
      add_kernel_half<<<grid, kThreads, 0, stream>>>(static_cast<__half*>(dst), static_cast<const __half*>(src),
                                                     count);
      break;
    case 3:
      add_kernel_bf16<<<grid, kThreads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst),
                                                     static_cast<const __nv_bfloat16*>(src), count);
      break;
    case 4:
      add_kernel<<<grid, kThreads, 0, stream>>>(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), count);
      break;
    case 5:
      add_kernel<<<grid, kThreads, 0, stream>>>(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count);
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}
