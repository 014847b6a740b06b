// The `nccl` communicator in a world of one rank (label gpu; exits 77, skipped, without a GPU):
// every collective on a device buffer gives what `single` gives on the same data (the identity),
// for even and uneven shard layouts and the dtypes NCCL reduces, and a host buffer is refused.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ablate/communicator.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAILED: %s\n", what.c_str());
  }
}

#define CHECK_CUDA(call)                                                                                   \
  do {                                                                                                     \
    const cudaError_t err_ = (call);                                                                       \
    if (err_ != cudaSuccess) {                                                                             \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                                        \
    }                                                                                                      \
  } while (0)

std::unique_ptr<ablate::Communicator> make(ablate::Registry& registry, const std::string& name) {
  const ablate::Params common{"run", {}};
  const ablate::Params own{"run." + name, name == "nccl"
                                              ? std::map<std::string, ablate::Value, std::less<>>{{"timeout_s", ablate::Value(30.0)}}
                                              : std::map<std::string, ablate::Value, std::less<>>{}};
  ablate::RunContext run;
  run.device = name == "nccl" ? "cuda" : "cpu";
  return registry.create<ablate::Communicator>(ablate::Kind::communicator, name, {common, own, run});
}

// Runs `op` through both communicators on the same bytes (nccl on a device copy) and compares.
void compare(ablate::Communicator& single, ablate::Communicator& nccl, ablate::DType dtype, int64_t n, const std::string& what,
             const std::function<void(ablate::Communicator&, ablate::TensorView)>& op) {
  const std::size_t bytes = std::size_t(n) * ablate::dtype_size(dtype);
  std::vector<unsigned char> host(bytes);
  for (std::size_t i = 0; i < bytes; ++i) host[i] = (unsigned char)((i * 37 + 11) % 61);  // finite in every dtype
  std::vector<unsigned char> reference = host;
  ablate::TensorView t;
  t.dtype = dtype;
  t.ndim = 1;
  t.shape[0] = n;
  t.data = reference.data();
  op(single, t);
  void* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, bytes));
  CHECK_CUDA(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaDeviceSynchronize());  // a legacy-stream copy, before work on a non-blocking stream
  t.data = device;
  t.device = ablate::DeviceType::cuda;
  op(nccl, t);
  std::vector<unsigned char> got(bytes);
  CHECK_CUDA(cudaMemcpy(got.data(), device, bytes, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaFree(device));
  expect(got == reference, what + " of " + std::to_string(n) + " " + ablate::to_string(dtype));
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  ablate::Registry registry;
  registry.load_directories({ABLATE_PLUGIN_DIR});
  auto single = make(registry, "single");
  auto nccl = make(registry, "nccl");
  expect(nccl->world() == 1 && nccl->rank() == 0 && nccl->local_rank() == 0, "a world of one rank");
  using ablate::DType;
  using ablate::ReduceOp;
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32}) {
    for (int64_t n : {1, 7, 4096, 1000003}) {
      compare(*single, *nccl, dtype, n, "all_reduce sum", [](auto& c, auto t) { c.all_reduce(t, ReduceOp::sum); });
      compare(*single, *nccl, dtype, n, "all_reduce max", [](auto& c, auto t) { c.all_reduce(t, ReduceOp::max); });
      compare(*single, *nccl, dtype, n, "reduce_scatter", [](auto& c, auto t) { c.reduce_scatter(t, ReduceOp::sum); });
      compare(*single, *nccl, dtype, n, "all_gather", [](auto& c, auto t) { c.all_gather(t); });
      compare(*single, *nccl, dtype, n, "broadcast", [](auto& c, auto t) { c.broadcast(t, 0); });
    }
  }
  // Stream order, as the engine uses it: collectives issued against a model stream return at once,
  // and join() completes them (and the host-scalar collective completes on return, too).
  cudaStream_t model_stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&model_stream, cudaStreamNonBlocking));
  nccl->set_stream(ablate::Stream(model_stream));
  for (int64_t n : {7, 1000003}) {
    compare(*single, *nccl, DType::f32, n, "stream-ordered all_reduce + join", [](auto& c, auto t) {
      c.all_reduce(t, ReduceOp::sum);
      c.join();
    });
    compare(*single, *nccl, DType::f32, n, "stream-ordered reduce to rank 0 + join", [](auto& c, auto t) {
      c.reduce(t, ReduceOp::sum, 0);
      c.join();
    });
  }
  double scalars[2] = {3.0, -1.5};
  nccl->all_reduce_host(ablate::flat_view(scalars, DType::f64, 2), ReduceOp::sum);
  expect(scalars[0] == 3.0 && scalars[1] == -1.5, "all_reduce_host in stream order");
  nccl->set_stream(nullptr);
  CHECK_CUDA(cudaStreamDestroy(model_stream));
  nccl->barrier();
  std::vector<float> host(16, 1.0f);
  ablate::TensorView on_host;
  on_host.data = host.data();
  on_host.ndim = 1;
  on_host.shape[0] = 16;
  on_host.device = ablate::DeviceType::cuda;  // claims a GPU buffer but points at host memory
  bool refused = false;
  try {
    nccl->all_reduce(on_host, ReduceOp::sum);
  } catch (const ablate::Error& e) {
    refused = e.kind() == ablate::ErrorKind::input && std::strstr(e.what(), "not GPU memory") != nullptr;
  }
  expect(refused, "a host buffer is refused");
  std::printf("%s\n", failures == 0 ? "all passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
