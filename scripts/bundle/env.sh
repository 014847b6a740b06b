# Sourced by the bundle's scripts: points ablate's test programs at the bundle instead of the
# paths of the machine that built it, sets Open MPI up to run from the bundle (singleton start, no
# ssh), and finds the CUDA libraries the bundle does not carry: the driver's libcuda, and cudart,
# cuBLAS, cuDNN and NCCL from the nvidia.* pip wheels of this machine's python3.
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export ABLATE_BUILD_DIR="$bundle" ABLATE_SOURCE_DIR="$bundle/src" ABLATE_BINARY="$bundle/bin/ablate"
export ABLATE_PLUGIN_DIR="$bundle/bin/plugins" ABLATE_TEST_PLUGIN_DIR="$bundle/tests/test_plugins"
export OMPI_MCA_mca_component_path="$bundle/openmpi/components" PMIX_MCA_mca_component_path="$bundle/openmpi/pmix"
export OMPI_MCA_ess_singleton_isolated=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPAL_PKGDATADIR="$bundle/openmpi/share" OMPI_MCA_btl_vader_single_copy_mechanism=none
# The bundle's mpirun starts ranks on this machine only: the isolated launcher forks them itself
# (the default one looks for ssh or rsh even for local ranks).
export OMPI_MCA_plm=isolated
# The CUDA toolkit's tools (compute-sanitizer, nvcc) where they are installed but not on PATH.
for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do [ -d "$d" ] && PATH="$PATH:$d"; done
export PATH

# The lib/ folders of the nvidia.* wheels (nvidia/cu13/lib, nvidia/cudnn/lib, nvidia/nccl/lib, ...),
# keeping their layout: their own RUNPATHs point at each other.
nvidia_lib_dirs() {
  command -v python3 >/dev/null 2>&1 || return 0
  python3 - <<'PY' 2>/dev/null
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
for base in (list(spec.submodule_search_locations) if spec else []):
    for name in sorted(os.listdir(base)):
        lib = os.path.join(base, name, "lib")
        if os.path.isdir(lib):
            print(lib)
PY
}
ablate_cuda_dirs=$(nvidia_lib_dirs | paste -sd: -)
# Then the toolkit's own libraries, for a machine whose loader cache does not list them (the wheels
# come first: they are what the machine's PyTorch, the bench's peer, loads too).
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && ablate_cuda_dirs="${ablate_cuda_dirs:+$ablate_cuda_dirs:}$d"
done
if [ -n "$ablate_cuda_dirs" ]; then export LD_LIBRARY_PATH="$ablate_cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi

# Where each CUDA library the plugins need was found, or that it was not.
cuda_libraries_report() {
  local need lib where
  need=$(for f in "$bundle"/bin/plugins/*.so "$bundle"/bin/test_* "$bundle"/bin/bench_*; do
    [ -f "$f" ] && readelf -d "$f" 2>/dev/null | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'
  done | grep -E '^lib(cuda|cudart|cublas|cublasLt|cudnn|nccl|nvrtc|nvJitLink)' | sort -u)
  # And what cudnn_flash opens at run time rather than links: cuDNN 9's front library and the
  # sub-libraries it loads itself, and NVRTC, with which cuDNN compiles its runtime kernels.
  if [ -f "$bundle/bin/plugins/libablate_cudnn_flash.so" ]; then
    need=$(printf '%s\n' $need libcudnn.so.9 libcudnn_graph.so.9 libcudnn_engines_precompiled.so.9 \
      libcudnn_engines_runtime_compiled.so.9 libcudnn_heuristic.so.9 libcudnn_ops.so.9 libcudnn_adv.so.9 \
      libnvrtc.so.13 libnvrtc-builtins.so.13.0 | sort -u)
  fi
  for lib in $need; do
    where=""
    IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
    for d in "${dirs[@]}"; do [ -n "$d" ] && [ -e "$d/$lib" ] && where="$d/$lib" && break; done
    [ -z "$where" ] && where=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
    if [ -n "$where" ]; then echo "  found   $lib: $where"; else echo "  MISSING $lib: not in the nvidia.* wheels of python3 nor the system's libraries (ldconfig -p)"; fi
  done
}
