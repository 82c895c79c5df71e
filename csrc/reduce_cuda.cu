// CUDA reduction kernel: dst += src, launched on the caller's stream.
//
// Self-contained (no torch headers) so that it compiles with nvcc alone; setup.py adds it to the
// extension when torch is a CUDA build, and tests/test_cuda_kernel.py compiles it with nvcc whenever
// a CUDA toolkit is present. The executor launches it on the current stream right after the
// receive's wait() (NCCL) or after the staged receive's copy to the device (gloo), so the reduction
// is ordered after the data arrived and before any later send of the same bytes.
//
// Memory-bound: each element is read twice and written once. Where dst and src share their
// alignment modulo 16 bytes (always, for the executor's spans of one dtype past a 16-byte-aligned
// allocation, except at odd offsets), the body moves 16-byte vectors and only the < 16-byte head
// and tail go element by element; otherwise every element does. Why vectors: on an H100 at
// 256 MiB the element-wise kernel alone reached 59 % of the copy bandwidth for float16/bfloat16
// (93 % float32), the vector body 99 % for every dtype (measured side by side, 2026-11-26).
// scripts/gpu_check.sh measures it against the device's copy (docs/results.md, "GPU check").
//
// dtype codes (reduce.cpp: cuda_dtype_code): 0 float32, 1 float64, 2 float16, 3 bfloat16,
// 4 int32, 5 int64. Half types add in float and round once per element, like ATen.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace {

template <typename T>
struct Add {
  __device__ static T apply(T a, T b) { return a + b; }
};

template <>
struct Add<__half> {
  __device__ static __half apply(__half a, __half b) { return __float2half(__half2float(a) + __half2float(b)); }
};

template <>
struct Add<__nv_bfloat16> {
  __device__ static __nv_bfloat16 apply(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __float2bfloat16(__bfloat162float(a) + __bfloat162float(b));
  }
};

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;
constexpr int64_t kVectorBytes = 16;

int64_t blocks_for(int64_t work_items) {
  const int64_t blocks = (work_items + kThreads - 1) / kThreads;
  return blocks < 1 ? 1 : (blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Element by element, any alignment.
template <typename T>
__global__ void add_elements(T* __restrict__ dst, const T* __restrict__ src, int64_t count) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    dst[i] = Add<T>::apply(dst[i], src[i]);
  }
}

// `head` elements one by one up to dst's 16-byte boundary, then `vectors` 16-byte vectors, then the
// remaining tail one by one. Requires dst + head and src + head to be 16-byte aligned.
template <typename T>
__global__ void add_vectors(T* __restrict__ dst, const T* __restrict__ src, int64_t count, int64_t head,
                            int64_t vectors) {
  constexpr int kLanes = kVectorBytes / sizeof(T);
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t tail_start = head + vectors * kLanes;
  if (thread < head) {
    dst[thread] = Add<T>::apply(dst[thread], src[thread]);
  }
  if (thread < count - tail_start) {
    const int64_t i = tail_start + thread;
    dst[i] = Add<T>::apply(dst[i], src[i]);
  }
  uint4* dst_vectors = reinterpret_cast<uint4*>(dst + head);
  const uint4* src_vectors = reinterpret_cast<const uint4*>(src + head);
  for (int64_t v = thread; v < vectors; v += stride) {
    uint4 a = dst_vectors[v];
    const uint4 b = src_vectors[v];
    T* a_lanes = reinterpret_cast<T*>(&a);
    const T* b_lanes = reinterpret_cast<const T*>(&b);
#pragma unroll
    for (int k = 0; k < kLanes; ++k) {
      a_lanes[k] = Add<T>::apply(a_lanes[k], b_lanes[k]);
    }
    dst_vectors[v] = a;
  }
}

template <typename T>
int launch(void* dst_raw, const void* src_raw, int64_t count, cudaStream_t stream) {
  T* dst = static_cast<T*>(dst_raw);
  const T* src = static_cast<const T*>(src_raw);
  const auto dst_address = reinterpret_cast<uintptr_t>(dst);
  const auto src_address = reinterpret_cast<uintptr_t>(src);
  constexpr int64_t kLanes = kVectorBytes / sizeof(T);
  const bool same_alignment = dst_address % kVectorBytes == src_address % kVectorBytes;
  const bool element_aligned = dst_address % sizeof(T) == 0;
  int64_t head = 0;
  if (same_alignment && element_aligned) {
    head = static_cast<int64_t>((kVectorBytes - dst_address % kVectorBytes) % kVectorBytes) / sizeof(T);
  }
  if (!same_alignment || !element_aligned || count - head < kLanes) {
    add_elements<T><<<blocks_for(count), kThreads, 0, stream>>>(dst, src, count);
  } else {
    const int64_t vectors = (count - head) / kLanes;
    add_vectors<T><<<blocks_for(vectors), kThreads, 0, stream>>>(dst, src, count, head, vectors);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" int stragglerkit_cuda_reduce_add(void* dst, const void* src, int64_t count, int dtype_code,
                                            void* stream_handle) {
  if (count <= 0) {
    return 0;
  }
  cudaStream_t stream = static_cast<cudaStream_t>(stream_handle);
  switch (dtype_code) {
    case 0: return launch<float>(dst, src, count, stream);
    case 1: return launch<double>(dst, src, count, stream);
    case 2: return launch<__half>(dst, src, count, stream);
    case 3: return launch<__nv_bfloat16>(dst, src, count, stream);
    case 4: return launch<int32_t>(dst, src, count, stream);
    case 5: return launch<int64_t>(dst, src, count, stream);
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}
