// The CPU's math libraries choose their kernels once, when they are loaded; see cpu_kernels.cpp.
#pragma once

namespace ablate {

// Called before the first plugin is loaded (the CPU layers load OpenBLAS with them). Where the
// user has not named OpenBLAS's kernels (OPENBLAS_CORETYPE), names the widest set this processor
// and its operating system run: an OpenBLAS older than the processor otherwise falls back to its
// SSE3 kernels. Logs its choice at debug; the first call decides, later ones do nothing.
void choose_cpu_blas_kernels();

}  // namespace ablate
