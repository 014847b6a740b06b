// Attention backends on a CUDA device: forward and forward + backward time and TFLOP/s of
// `cudnn_flash` (bf16 tensors as cuDNN takes them, and f32 tensors as the model hands them today,
// converted around each call) and `naive_cuda` (f32), at the shapes (B, H, T, D) = (16, 12, 1024, 64),
// (8, 16, 2048, 128), (4, 32, 4096, 128), causal; and a packed case: documents drawn from
// `synthetic_probes` (the seeds' length distribution) packed into rows of 1024, against the same
// documents one per padded row.
//
//   bench_attention [--json FILE] [--iters N] [--shapes all|small]
//
// FLOPs are the causal ones, counted once: forward 4 * T^2 * D / 2 per (row, head) (QK^T and PV
// over the lower triangle), backward 2.5x forward; a packed row counts sum(len^2) in place of T^2.
// Times are CUDA events on the device's stream, the median of --iters after two untimed calls.
// Exits 77 without a CUDA device. bench/peers/pytorch_sdpa.py times PyTorch's SDPA at the same
// shapes in the same call (the bundle runs both).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/runtime/run_spec.hpp"
#include "ablate/attention.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/cuda_check.hpp"
#include "ablate/device.hpp"
#include "ablate/device_math.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/pipeline.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/session.hpp"
#include "attention_support.hpp"
#include "cuda_timing.hpp"

using namespace ablate;
using json = nlohmann::json;

namespace {

struct Options {
  std::string json_path;
  int iters = 10;
  bool small = false;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(ErrorKind::input, "bench_attention", a + " needs a value");
      return argv[++i];
    };
    if (a == "--json") o.json_path = value();
    else if (a == "--iters") o.iters = std::max(1, std::stoi(value()));
    else if (a == "--shapes") o.small = value() == "small";
    else throw Error(ErrorKind::input, "bench_attention", "unknown argument " + a + " (--json FILE --iters N --shapes all|small)");
  }
  return o;
}

// The batch's rows as (start, length) segments; empty rows are padding.
using Rows = std::vector<test::RowLayout>;
using test::make_batch;

// Causal forward FLOPs of a batch: 4 * D * H * (sum over segments of len^2) / 2.
double forward_flops(const Batch& b, int32_t H, int32_t D) {
  double sq = 0;
  for (const Segment& s : b.segments) sq += double(s.length) * double(s.length);
  return 2.0 * D * H * sq;
}

struct Arm {
  std::string backend;
  DType dtype;
};

struct Result {
  std::string label, backend, dtype, status;
  int32_t B = 0, H = 0, T = 0, D = 0;
  bool packed = false;
  double real_fraction = 1.0, fwd_ms = 0, fwd_bwd_ms = 0, fwd_tflops = 0, fwd_bwd_tflops = 0;
};

class Bench {
 public:
  explicit Bench(int iters) : iters_(iters) {
    registry_.load_directories(Registry::default_search_path());
    RunContext on_gpu;
    on_gpu.device = "cuda";
    static const Params run{"run", {}};
    device_ = registry_.create<Device>(Kind::device, "cuda", {run, run, on_gpu});
    for (const char* name : {"cudnn_flash", "naive_cuda"}) {
      if (!registry_.find(Kind::attention, name)) continue;
      static const Params common{"attention", {}};
      const Params own{std::string("attention.") + name, {}};
      auto a = registry_.create<Attention>(Kind::attention, name, {common, own, on_gpu});
      backends_[name] = std::move(a);
    }
  }

  Result run(const std::string& label, const Arm& arm, const Batch& batch, int32_t H, int32_t D, bool packed) {
    Result r;
    r.label = label;
    r.backend = arm.backend;
    r.dtype = to_string(arm.dtype);
    r.B = batch.rows;
    r.H = H;
    r.T = batch.seq_len;
    r.D = D;
    r.packed = packed;
    int64_t real = 0;
    for (const Segment& s : batch.segments) real += s.length;
    r.real_fraction = double(real) / (double(batch.rows) * batch.seq_len);
    auto it = backends_.find(arm.backend);
    if (it == backends_.end()) {
      r.status = "not built";
      return r;
    }
    Attention& attn = *it->second;
    AttentionProblem p;
    p.batch = batch.rows;
    p.seq_len = batch.seq_len;
    p.heads = p.kv_heads = H;
    p.head_dim = D;
    p.dtype = arm.dtype;
    p.device = DeviceType::cuda;
    p.packed = packed;
    if (std::string why = attn.supports(p); !why.empty()) {
      r.status = "refused: " + why;
      return r;
    }
    try {
      const int64_t n = int64_t(p.batch) * p.seq_len * H * D;
      Buffer q = random(arm.dtype, n), k = random(arm.dtype, n), v = random(arm.dtype, n), dout = random(arm.dtype, n);
      Buffer out = device_->alloc(arm.dtype, n), dq = device_->alloc(arm.dtype, n), dk = device_->alloc(arm.dtype, n),
             dv = device_->alloc(arm.dtype, n), saved = device_->alloc(DType::f32, attn.saved_elements(p));
      DeviceBatch db;
      device_->upload_batch(batch, db);
      const auto shaped = [&](Buffer& b) {
        TensorView t = b.view();
        t.ndim = 4;
        t.shape[0] = p.batch;
        t.shape[1] = p.seq_len;
        t.shape[2] = H;
        t.shape[3] = D;
        return t;
      };
      const auto forward = [&] {
        test::attention_forward(attn, p, db.views, shaped(q), shaped(k), shaped(v), shaped(out), saved.view(), device_->stream());
      };
      const auto both = [&] {
        forward();
        test::attention_backward(attn, p, db.views, shaped(q), shaped(k), shaped(v), shaped(out), saved.view(), shaped(dout),
                                 shaped(dq), shaped(dk), shaped(dv), device_->stream());
      };
      r.fwd_ms = time_ms(forward);
      r.fwd_bwd_ms = time_ms(both);
      const double f = forward_flops(batch, H, D);
      r.fwd_tflops = f / (r.fwd_ms * 1e-3) / 1e12;
      r.fwd_bwd_tflops = 3.5 * f / (r.fwd_bwd_ms * 1e-3) / 1e12;
      r.status = "ok";
    } catch (const std::exception& e) {
      (void)cudaGetLastError();
      r.status = std::string("failed: ") + e.what();
    }
    return r;
  }

  Device& device() { return *device_; }

 private:
  Buffer random(DType dtype, int64_t n) {
    std::mt19937 rng{uint32_t(n)};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> h(static_cast<std::size_t>(n));
    for (float& x : h) x = normal(rng);
    Buffer b = device_->alloc(dtype, n);
    if (dtype == DType::bf16) {
      std::vector<uint16_t> bits(h.size());
      for (std::size_t i = 0; i < h.size(); ++i) bits[i] = device_math::bf16_bits(h[i]);
      device_->upload(b.view(), bits.data());
    } else {
      device_->upload(b.view(), h.data());
    }
    return b;
  }

  template <class F>
  double time_ms(F&& call) {
    return bench::median_event_ms(device_->stream().as<cudaStream_t>(), iters_, call);
  }

  int iters_;
  Registry registry_;
  std::unique_ptr<Device> device_;
  std::map<std::string, std::unique_ptr<Attention>> backends_;
};

// Documents from synthetic_probes (their lengths, capped at T), first-fit packed into `rows` rows of
// T; and the same documents one per row, padded.
std::pair<Batch, Batch> probe_batches(Registry& registry, int32_t T, int32_t rows) {
  const Config cfg = Config::parse("[data]\nname = \"synthetic_probes\"\n", "bench_attention", {}, registry);
  const ablate::RunSpec spec = ablate::RunSpec::from(cfg);
  auto source = ablate::Session(spec, registry, RunContext{}).data_source();
  Rows packed(static_cast<std::size_t>(rows)), padded;
  std::vector<int32_t> used(static_cast<std::size_t>(rows), 0);
  Document d;
  for (uint64_t i = 0; i < source->size(Split::train); ++i) {
    source->read(Split::train, i, d);
    const int32_t len = std::min<int32_t>(T, int32_t(d.tokens.size()) + 1);  // + the end-of-document target
    std::size_t r = 0;
    while (r < used.size() && used[r] + len > T) ++r;
    if (r == used.size()) break;  // the first document that fits nowhere ends the batch
    packed[r].push_back({used[r], len});
    used[r] += len;
    padded.push_back({{0, len}});
  }
  return {make_batch(T, packed), make_batch(T, padded)};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    // The packed case's layout is host work: made (and described) with or without a device.
    Registry host_registry;
    host_registry.load_directories(Registry::default_search_path());
    const auto [packed, padded] = probe_batches(host_registry, o.small ? 256 : 1024, o.small ? 2 : 8);
    const auto real_fraction = [](const Batch& b) {
      int64_t real = 0;
      for (const Segment& s : b.segments) real += s.length;
      return double(real) / (double(b.rows) * b.seq_len);
    };
    std::printf("probe documents: %zu, packed into %d rows of %d (%.1f%% real), padded %d rows (%.1f%% real)\n",
                padded.segments.size(), packed.rows, packed.seq_len, 100 * real_fraction(packed), padded.rows,
                100 * real_fraction(padded));
    if (!cuda::device_available()) {
      std::printf("bench_attention: no CUDA device; skipped\n");
      return 77;
    }
    Bench bench(o.iters);
    std::vector<Result> results;
    struct Shape {
      int32_t B, H, T, D;
    };
    std::vector<Shape> shapes = {{16, 12, 1024, 64}, {8, 16, 2048, 128}, {4, 32, 4096, 128}};
    if (o.small) shapes = {{2, 4, 256, 64}};
    const std::vector<Arm> arms = {{"cudnn_flash", DType::bf16}, {"cudnn_flash", DType::f32}, {"naive_cuda", DType::f32}};
    for (const Shape& s : shapes) {
      const Batch b = make_batch(s.T, Rows(std::size_t(s.B), {{0, s.T}}));
      const std::string label =
          "B" + std::to_string(s.B) + " H" + std::to_string(s.H) + " T" + std::to_string(s.T) + " D" + std::to_string(s.D);
      for (const Arm& a : arms) results.push_back(bench.run(label, a, b, s.H, s.D, false));
    }
    for (const Arm& a : arms) {
      results.push_back(bench.run("probes packed", a, packed, 12, 64, true));
      results.push_back(bench.run("probes padded", a, padded, 12, 64, false));
    }

    std::printf("%-22s %-12s %-5s %6s %10s %10s %10s %10s  %s\n", "shape", "backend", "dtype", "real%", "fwd ms", "fwd TF/s", "f+b ms",
                "f+b TF/s", "status");
    json out = json::object();
    out["device"] = bench.device().describe();
    out["rows"] = json::array();
    for (const Result& r : results) {
      std::printf("%-22s %-12s %-5s %6.1f %10.3f %10.1f %10.3f %10.1f  %s\n", r.label.c_str(), r.backend.c_str(), r.dtype.c_str(),
                  100 * r.real_fraction, r.fwd_ms, r.fwd_tflops, r.fwd_bwd_ms, r.fwd_bwd_tflops, r.status.c_str());
      out["rows"].push_back({{"shape", r.label},
                             {"backend", r.backend},
                             {"dtype", r.dtype},
                             {"B", r.B},
                             {"H", r.H},
                             {"T", r.T},
                             {"D", r.D},
                             {"packed", r.packed},
                             {"real_fraction", r.real_fraction},
                             {"fwd_ms", r.fwd_ms},
                             {"fwd_tflops", r.fwd_tflops},
                             {"fwd_bwd_ms", r.fwd_bwd_ms},
                             {"fwd_bwd_tflops", r.fwd_bwd_tflops},
                             {"status", r.status}});
    }
    // The headline: cudnn_flash (bf16) over naive_cuda at T = 2048, and packed over padded time.
    const auto find = [&](const std::string& label, const std::string& backend, const std::string& dtype) -> const Result* {
      for (const Result& r : results) {
        if (r.label == label && r.backend == backend && r.dtype == dtype && r.status == "ok") return &r;
      }
      return nullptr;
    };
    if (const Result* f = find("B8 H16 T2048 D128", "cudnn_flash", "bf16"), *n = find("B8 H16 T2048 D128", "naive_cuda", "f32");
        f && n) {
      out["flash_over_naive_t2048"] = n->fwd_bwd_ms / f->fwd_bwd_ms;
    }
    if (const Result* p = find("probes packed", "cudnn_flash", "bf16"), *d = find("probes padded", "cudnn_flash", "bf16"); p && d) {
      out["padded_over_packed_time"] = d->fwd_bwd_ms / p->fwd_bwd_ms;
      out["packed_real_fraction"] = p->real_fraction;
      out["padded_real_fraction"] = d->real_fraction;
    }
    if (!o.json_path.empty()) std::ofstream(o.json_path) << out.dump(2) << "\n";
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return e.kind() == ErrorKind::input ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 1;
  }
}
