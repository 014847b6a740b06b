// Kernels of the interpreter's own tests (test_interpreter.cpp). Written as CUDA: the same file
// compiles with nvcc.
#include "interpreter_kernels.hpp"

namespace ablate::emu_test {
namespace {

__global__ void mirror_kernel(int* out) {
  __shared__ int s[1024];
  const int t = threadIdx.x;
  s[t] = t;
  __syncthreads();
  out[t] = s[blockDim.x - 1 - t];
}

__global__ void warp_kernel(int* out) {
  const int lane = threadIdx.x;
  const int x = __shfl_xor_sync(0xffffffffu, lane * 10, 1);
  const int y = __shfl_sync(0xffffffffu, lane * 10, 31 - lane);
  const int u = __shfl_up_sync(0xffffffffu, lane, 3);
  const int d = __shfl_down_sync(0xffffffffu, lane, 3, 16);
  const unsigned b = __ballot_sync(0xffffffffu, lane % 3 == 0);
  out[lane] = x;
  out[32 + lane] = y;
  out[64 + lane] = u;
  out[96 + lane] = d;
  out[128 + lane] = int(b);
}

__global__ void votes_kernel(int* out) {
  const int t = threadIdx.x;
  const int c = __syncthreads_count(t % 2 == 1);
  const int a = __syncthreads_and(t < int(blockDim.x));
  const int o = __syncthreads_or(t == 5);
  if (t == 0) {
    out[0] = c;
    out[1] = a;
    out[2] = o;
  }
}

__global__ void dynamic_kernel(int* out) {
  extern __shared__ int dyn[];
  dyn[threadIdx.x] = int(threadIdx.x);
  __syncthreads();
  out[threadIdx.x] = dyn[threadIdx.x];
}

__global__ void grid_kernel(int* out) {
  const unsigned x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  out[y * gridDim.x * blockDim.x + x] = 1 + int(blockIdx.y);
}

__global__ void early_return_kernel(int threads) {
  __shared__ int s[1024];
  if (int(threadIdx.x) >= threads - 7) return;
  s[threadIdx.x] = 1;
  __syncthreads();
}

__global__ void full_mask_kernel(float* out) {
  float v = float(threadIdx.x);
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
}

__global__ void short_shared_kernel(int* out) {
  __shared__ int s[32];
  s[threadIdx.x] = int(threadIdx.x);  // launched with 33 threads
  __syncthreads();
  out[threadIdx.x] = s[0];
}

__global__ void past_end_kernel(int* p, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) p[i] = i;  // one past the end
}

__global__ void touch_kernel(int* p) { p[threadIdx.x] = 1; }

__global__ void divergent_kernel(int* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

__global__ void missing_barrier_kernel(int* out) {
  __shared__ int s[1024];
  s[threadIdx.x] = int(threadIdx.x) + 1;
  int total = 0;  // no __syncthreads: reads what other threads may not have written yet
  for (int k = 0; k < int(blockDim.x); ++k) total += s[k];
  out[threadIdx.x] = total;
}

__global__ void arrival_kernel(int* out, int* counter) { out[atomicAdd(counter, 1)] = int(threadIdx.x); }
// Three turns apart, a barrier between them: each thread writes its index where it arrives.
__global__ void arrival_rounds_kernel(int* out, int* counter) {
  out[atomicAdd(counter, 1)] = int(threadIdx.x);
  __syncthreads();
  out[atomicAdd(counter, 1)] = int(threadIdx.x);
  __syncthreads();
  out[atomicAdd(counter, 1)] = int(threadIdx.x);
}

__global__ void votes_widths_kernel(int* out, float* sum) {
  const int lane = threadIdx.x;
  out[lane] = __any_sync(0xffffffffu, lane == 7);
  out[32 + lane] = __all_sync(0xffffffffu, lane < 40);
  out[64 + lane] = __shfl_xor_sync(0xffffffffu, lane, 1, 8);
  out[96 + lane] = __shfl_sync(0xffffffffu, lane * 3, 5, 16);
  out[128 + lane] = int(__activemask());
  atomicAdd(sum, 0.5f);
}

__global__ void ballot_after_returns_kernel(unsigned* out, int live) {
  const int lane = threadIdx.x;
  if (lane >= live) return;
  out[lane] = __ballot_sync(0xffffffffu, lane % 2 == 1);
}

__global__ void outside_mask_kernel(int* out) {
  const int lane = threadIdx.x;
  if (lane < 16) out[lane] = __shfl_sync(0x0000ffffu, lane, lane == 3 ? 19 : 0);
}

__global__ void mismatched_kernel(int* out) {
  const int lane = threadIdx.x;
  out[lane] = lane % 2 == 0 ? int(__ballot_sync(0xffffffffu, 1)) : __shfl_xor_sync(0xffffffffu, lane, 1);
}

__global__ void return_during_shuffle_kernel(int* out) {
  const int lane = threadIdx.x;
  if (lane == 31) return;
  out[lane] = __shfl_xor_sync(0xffffffffu, lane, 1);
}

__global__ void big_shared_kernel(int* out) {
  __shared__ int a[10240], b[4096];  // 40 KiB + 16 KiB
  a[threadIdx.x] = 1;
  b[threadIdx.x] = 2;
  __syncthreads();
  out[threadIdx.x] = a[0] + b[0];
}

__global__ void axpy_kernel(float* x, const float* y, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += a * y[i];
}

}  // namespace

void axpy_on(float* x, const float* y, float a, int n, cudaStream_t s) { axpy_kernel<<<(n + 63) / 64, 64, 0, s>>>(x, y, a, n); }
void arrival_order(int* out, int* counter, int threads) { arrival_kernel<<<1, threads>>>(out, counter); }
void arrival_rounds(int* out, int* counter, int threads) { arrival_rounds_kernel<<<1, threads>>>(out, counter); }
void warp_votes_and_widths(int* out, float* sum) { votes_widths_kernel<<<1, 32>>>(out, sum); }
void ballot_after_returns(unsigned* out, int live) { ballot_after_returns_kernel<<<1, 32>>>(out, live); }
void shuffle_outside_mask(int* out) { outside_mask_kernel<<<1, 32>>>(out); }
void mismatched_collectives(int* out) { mismatched_kernel<<<1, 32>>>(out); }
void return_during_shuffle(int* out) { return_during_shuffle_kernel<<<1, 32>>>(out); }
void grid_y_too_large(int* p) { touch_kernel<<<dim3(1, 65536), 32>>>(p); }
void too_much_shared(int* out) { big_shared_kernel<<<1, 32>>>(out); }

void mirror_through_shared(int* out, int threads) { mirror_kernel<<<1, threads>>>(out); }
void warp_collectives(int* out) { warp_kernel<<<1, 32>>>(out); }
void barrier_votes(int* out, int threads) { votes_kernel<<<1, threads>>>(out); }
void dynamic_shared(int* out, int threads) { dynamic_kernel<<<1, threads, threads * sizeof(int)>>>(out); }
void grid_indices(int* out, unsigned gx, unsigned gy, unsigned bx, unsigned by) { grid_kernel<<<dim3(gx, gy), dim3(bx, by)>>>(out); }
void barrier_after_early_return(int threads) { early_return_kernel<<<1, threads>>>(threads); }
void full_mask_shuffle(float* out, int threads) { full_mask_kernel<<<1, threads>>>(out); }
void shared_one_short(int* out) { short_shared_kernel<<<1, 33>>>(out); }
void write_past_allocation(int* p, int n) { past_end_kernel<<<(n + 31) / 32 + 1, 32>>>(p, n); }
void empty_grid_launch(int* p) { touch_kernel<<<0, 32>>>(p); }
void oversized_block_launch(int* p) { touch_kernel<<<1, 1025>>>(p); }
void divergent_barriers(int* out) { divergent_kernel<<<1, 64>>>(out); }
void missing_barrier_sum(int* out, int threads) { missing_barrier_kernel<<<1, threads>>>(out); }

}  // namespace ablate::emu_test
