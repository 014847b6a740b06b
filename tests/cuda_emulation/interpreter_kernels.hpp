// Kernels that exercise the interpreter itself (interpreter_kernels.cu): correct uses of each
// construct, and one kernel per fault the interpreter must name.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace ablate::emu_test {

// out[t] for every thread t of a block of `threads`: its linear index, read back through a shared
// array after a barrier from the thread mirrored across the block.
void mirror_through_shared(int* out, int threads);
// out[lane] = the warp-level results of shfl_xor / shfl / up / down / ballot / count for one warp.
void warp_collectives(int* out);
// out[0] = __syncthreads_count(t odd), out[1] = _and(t < threads), out[2] = _or(t == 5) for `threads`.
void barrier_votes(int* out, int threads);
// out[i] = i, through a block-sized dynamic shared array.
void dynamic_shared(int* out, int threads);
// A grid of (gx, gy) blocks of (bx, by) threads: out[linear global index] = 1 + blockIdx.y.
void grid_indices(int* out, unsigned gx, unsigned gy, unsigned bx, unsigned by);

// x[i] += a * y[i] for i < n, launched on stream `s` (a capture records it).
void axpy_on(float* x, const float* y, float a, int n, cudaStream_t s);
// out[k] = the index of the thread that took the k-th turn (an atomic counter), for `threads`.
void arrival_order(int* out, int* counter, int threads);
// The order of arrival in each of three turns a barrier separates: 3 x threads indices.
void arrival_rounds(int* out, int* counter, int threads);
// out[lane]: votes and 16-lane shuffles for one warp: [0, 32) __any_sync(lane == 7), [32, 64)
// __all_sync(lane < 40), [64, 96) shfl_xor(lane, 1, width 8), [96, 128) shfl(lane * 3, 5, width 16),
// [128, 160) __activemask(), [160] a float atomicAdd of 0.5 by every lane.
void warp_votes_and_widths(int* out, float* sum);
// A full-mask ballot after lanes >= `live` have returned (CUDA counts only the non-exited lanes):
// out[lane] = the ballot of lanes with an odd index, for lanes < live.
void ballot_after_returns(unsigned* out, int live);

// Faults: each must raise ablate::emu::Error.
void barrier_after_early_return(int threads);     // some threads return before __syncthreads
void full_mask_shuffle(float* out, int threads);  // 0xffffffff in a block not a multiple of 32
void shared_one_short(int* out);                  // writes s[32] of a 32-element __shared__ array
void write_past_allocation(int* p, int n);        // writes p[n]
void empty_grid_launch(int* p);                   // <<<0, 32>>>
void oversized_block_launch(int* p);              // <<<1, 1025>>>
void divergent_barriers(int* out);                // odd and even threads at different __syncthreads
void missing_barrier_sum(int* out, int threads);  // a shared sum with no barrier between write and read
void shuffle_outside_mask(int* out);              // mask 0x0000ffff, lane 3 reads lane 19
void mismatched_collectives(int* out);            // even lanes ballot, odd lanes shuffle
void return_during_shuffle(int* out);             // lane 31 returns; the others shuffle with it
void grid_y_too_large(int* p);                    // <<<dim3(1, 65536), 32>>>
void too_much_shared(int* out);                   // 40 KiB + 16 KiB of __shared__ arrays

}  // namespace ablate::emu_test
