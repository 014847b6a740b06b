// What the data-parallel tests under mpiexec share (test_data_parallel.cpp on the cpu,
// test_nccl_ranks.cpp on the emulated cuda device): the environment Open MPI needs in CI and the
// tolerances of N ranks against one process with the same global batch.
#pragma once

#include <string>

namespace ablate::test {

// Open MPI refuses to run as root without the first two (CI containers run as root); more ranks
// than cores need oversubscription; containers often forbid the cross-process memory reads of its
// shared-memory transport, so the tests copy.
inline const std::string kMpiTestEnv = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
                                       "OMPI_MCA_btl_vader_single_copy_mechanism=none";

// |loss difference| allowed per step. The per-step losses are means of a few hundred float terms
// over 20 steps of AdamW, and the gradients sum in another order: measured differences are ~1e-8.
inline constexpr double kDpLossTolerance = 1e-6;
// Relative grad_norm difference allowed per step. Each gradient element is an fp32 sum over the
// positions of a micro-batch (at most 4*64 = 256 in these tests), which N ranks add in another
// order than one process. A recursive fp32 sum of n terms of one sign is exact to about n*u
// relative (u = 2^-24, the unit roundoff), so the norm of such elements may differ by up to
// 256 * 2^-24 = 1.5e-5 relative (measured: 1e-8 on one Intel machine, 1.4e-6 on an AMD EPYC, whose
// BLAS blocks the sums differently).
inline constexpr double kDpGradNormRelTolerance = 256.0 / double(1 << 24);

}  // namespace ablate::test
