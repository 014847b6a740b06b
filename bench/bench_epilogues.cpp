// cuBLASLt's epilogues against the passes they replace, at GPT-2 124M's MLP (d 768, hidden 3072):
//   fc forward   post = gelu(x W_fc^T + b), pre kept    GELU_AUX_BIAS   vs the product, then gelu
//   fc backward  d_pre = (dy W_proj) gelu'(pre), db_fc   DGELU_BGRAD     vs the product, gelu', column sums
//   proj wgrad   dW_proj += dy^T post, db_proj            BGRADB          vs the product, column sums
// in bf16 and tf32 products (fp32 keeps the GELU unfused: gemm_plan.cpp), at 8 and 64 rows of
// 1024 tokens. Before measuring, the bytes each fusion saves are counted (the f32 passes it
// removes) and the time they take at the device's copy bandwidth is the prediction; the table
// prints predicted and measured savings side by side. Times are CUDA events, the median of
// --iters after two untimed calls. It also says whether cuBLASLt served every fused epilogue
// (gemm_unfused_problems(): a problem it refused runs the fallback, and fused == unfused then).
//
//   bench_epilogues [--json FILE] [--iters N]
//
// The matrix products are the same on both sides, so the peer is the unfused path itself: the
// ratio is fused / unfused time. Exits 77 without a CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "cuda_timing.hpp"
#include "gemm.hpp"
#include "layer_kernels.hpp"

using namespace ablate;
using namespace ablate::cuda_layers;
using json = nlohmann::json;

namespace {

constexpr int64_t kD = 768, kH = 3072;

struct Options {
  std::string json_path;
  int iters = 20;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw Error(ErrorKind::input, "bench_epilogues", a + " needs a value");
    if (a == "--json") o.json_path = argv[++i];
    else if (a == "--iters") o.iters = std::max(3, std::stoi(argv[++i]));
    else throw Error(ErrorKind::input, "bench_epilogues", "unknown argument " + a + " (--json FILE, --iters N)");
  }
  return o;
}

cuda::DeviceBuffer<float> random_buffer(std::size_t n, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> h(n);
  for (float& v : h) v = normal(rng);
  cuda::DeviceBuffer<float> d;
  d.upload(h.data(), n);
  return d;
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  if (!cuda::device_available()) {
    std::printf("bench_epilogues: no CUDA device; skipped\n");
    return 77;
  }
  cudaDeviceProp prop{};
  ABLATE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream = nullptr;
  ABLATE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double bw = bench::copy_bandwidth(stream);
  std::mt19937 rng(20261123);
  const auto W_fc = random_buffer(std::size_t(kH * kD), 0.02f, rng), b_fc = random_buffer(kH, 0.02f, rng);
  const auto W_proj = random_buffer(std::size_t(kD * kH), 0.02f, rng);
  cuda::DeviceBuffer<float> dW_proj, db_fc, db_proj;
  dW_proj.resize(std::size_t(kD * kH));
  db_fc.resize(kH);
  db_proj.resize(kD);
  dW_proj.fill_zero();
  db_fc.fill_zero();
  db_proj.fill_zero();
  ABLATE_CUDA_CHECK(cudaDeviceSynchronize());

  json table = json::array();
  std::printf("%-12s %-5s %6s %10s %10s %8s %14s %14s\n", "op", "mode", "rows", "unfused ms", "fused ms", "ratio", "saved ms pred",
              "saved ms meas");
  for (const MatmulMode mode : {MatmulMode::bf16, MatmulMode::tf32}) {
    for (const int64_t rows : {int64_t(8 * 1024), int64_t(64 * 1024)}) {
      const int64_t nh = rows * kH;
      const auto x = random_buffer(std::size_t(rows * kD), 1.0f, rng), dy = random_buffer(std::size_t(rows * kD), 1e-3f, rng);
      cuda::DeviceBuffer<float> pre, post, d_pre;
      pre.resize(std::size_t(nh));
      post.resize(std::size_t(nh));
      d_pre.resize(std::size_t(nh));
      const Weight fc{W_fc.data(), nullptr}, proj{W_proj.data(), nullptr};
      struct Case {
        const char* op;
        std::function<void()> unfused, fused;
        double saved_bytes;  // the f32 traffic of the passes the epilogue removes
      };
      const std::vector<Case> cases = {
          {"fc forward",
           [&] {
             gemm_x_wt(x.data(), rows, kD, kH, fc, b_fc.data(), nullptr, 0.0f, pre.data(), stream, mode);
             launch_gelu_forward(pre.data(), post.data(), nh, stream);
           },
           [&] { gemm_x_wt_gelu(x.data(), rows, kD, kH, fc, b_fc.data(), pre.data(), post.data(), stream, mode); },
           8.0 * double(nh)},  // gelu: read pre, write post
          {"fc backward",
           [&] {
             gemm_dy_w(dy.data(), rows, kH, kD, proj, false, d_pre.data(), stream, mode);
             launch_gelu_backward(pre.data(), d_pre.data(), nh, stream);
             add_column_sums(d_pre.data(), db_fc.data(), rows, kH, stream);
           },
           [&] { gemm_dy_w_dgelu(dy.data(), rows, kH, kD, proj, pre.data(), d_pre.data(), db_fc.data(), stream, mode); },
           16.0 * double(nh)},  // gelu': read pre, read and write d_pre; column sums: read d_pre
          {"proj wgrad",
           [&] {
             gemm_add_dyt_x(dy.data(), rows, kH, kD, post.data(), dW_proj.data(), nullptr, stream, mode);
             add_column_sums(dy.data(), db_proj.data(), rows, kD, stream);
           },
           [&] { gemm_add_dyt_x(dy.data(), rows, kH, kD, post.data(), dW_proj.data(), db_proj.data(), stream, mode); },
           4.0 * double(rows * kD)},  // column sums: read dy
      };
      for (const Case& c : cases) {
        const double tu = bench::median_event_ms(stream, o.iters, c.unfused);
        const double tf = bench::median_event_ms(stream, o.iters, c.fused);
        const double predicted = c.saved_bytes / bw * 1e3;
        std::printf("%-12s %-5s %6lld %10.3f %10.3f %8.3f %14.3f %14.3f\n", c.op, to_string(mode), static_cast<long long>(rows), tu,
                    tf, tf / tu, predicted, tu - tf);
        table.push_back({{"op", c.op},
                         {"mode", to_string(mode)},
                         {"rows", rows},
                         {"unfused_ms", tu},
                         {"fused_ms", tf},
                         {"fused_over_unfused", tf / tu},
                         {"saved_bytes", c.saved_bytes},
                         {"saved_ms_predicted", predicted},
                         {"saved_ms_measured", tu - tf}});
      }
    }
  }
  const int64_t unfused = gemm_unfused_problems();
  std::printf("\ncopy bandwidth %.0f GB/s (read + written); fused epilogues cuBLASLt refused: %lld%s\n", bw / 1e9,
              static_cast<long long>(unfused), unfused > 0 ? " (those rows ran the fallback on both sides)" : "");
  json out = {{"device", prop.name}, {"copy_bandwidth_gbs", bw / 1e9}, {"epilogues_refused", unfused}, {"rows", table}};
  for (const json& r : table) {
    if (r["mode"] == "bf16" && r["rows"] == 64 * 1024) out[std::string(r["op"]) + " bf16 fused/unfused"] = r["fused_over_unfused"];
  }
  if (!o.json_path.empty()) std::ofstream(o.json_path) << out.dump(2) << "\n";
  cudaStreamDestroy(stream);
  return 0;
} catch (const Error& e) {
  std::fprintf(stderr, "bench_epilogues: %s\n", e.what());
  return e.exit_code();
}
