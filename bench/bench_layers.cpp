// Every layer of GPT-2 124M on a CUDA device, forward and backward, timed at the training step's
// shapes (B * T = 65,536 rows, d 768, MLP 3072, vocabulary 50,304 padded from 50,257), each beside
// the time predicted from its FLOPs and bytes:
//
//   predicted = max(FLOPs / product rate, bytes / copy bandwidth)      (a roofline, no overlap credit)
//
// where the product rate is measured here, on this card, by the `linear` layer itself on an
// 8192 x 8192 x 8192 product in the run's precision, and the copy bandwidth by a 1 GiB device copy.
// The bytes are the least a pass must move: each input read once, each output (and what forward
// keeps for backward) written once, in the dtypes the model holds them in under --dtype (bf16: the
// norms' outputs, q, k, v, the MLP's hidden activation and its gradient, and every product's input
// in bf16, products reading the bf16 copy of the weights; the residual stream, the other gradients
// and the parameter gradients f32; fp8 and fp8_e4m3 hold what bf16 holds, and the bytes count no
// FP8 quantisation pass, so their prediction is the bf16 plan's traffic at the FP8 product rate;
// under them a second classifier row has its own products in FP8 ([model.cross_entropy] fp8),
// its quantising passes counted; and the norm and the two projections that add to the stream are
// timed again with the stream in bf16, run.residual_dtype = "bf16"). A layer far above its
// prediction moves more than it must or computes below the card's rate; that is where the step's
// time goes (docs/performance.md). Attention is bench_attention's (beside PyTorch SDPA). q, k and
// v are timed twice: as one d -> 3d product (what fusing them would give) and as the model runs
// them today, three d -> d products on one input, the input gradient added up over the three; the
// difference is what one product would save. A Llama-style SwiGLU MLP at the same width is timed
// beside the GELU one (hidden 8d/3 rounded up to 64).
//
//   bench_layers [--json FILE] [--iters N] [--rows N] [--dtype bf16|fp8|fp8_e4m3|tf32|fp32] [--shapes gpt2|small]
//
// The layers are the model's own: made through the Registry by name for device "cuda", called with
// LayerCalls as the model calls them. Times are CUDA events on the device's stream, the median of
// --iters after two untimed calls. Exits 77 without a CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/cuda_check.hpp"
#include "ablate/device.hpp"
#include "ablate/error.hpp"
#include "ablate/layer.hpp"
#include "ablate/layer_params.hpp"
#include "ablate/runtime/registry.hpp"
#include "cuda_timing.hpp"

using namespace ablate;
using json = nlohmann::json;

namespace {

struct Options {
  std::string json_path, dtype = "bf16";
  int iters = 10;
  int64_t rows = 65536;
  bool small = false;
};

Options parse(int argc, char** argv) {
  Options o;
  bool rows_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(ErrorKind::input, "bench_layers", a + " needs a value");
      return argv[++i];
    };
    if (a == "--json") {
      o.json_path = value();
    } else if (a == "--iters") {
      o.iters = std::max(1, std::stoi(value()));
    } else if (a == "--rows") {
      o.rows = std::max<int64_t>(1, std::stoll(value()));
      rows_given = true;
    } else if (a == "--dtype") {
      o.dtype = value();
      if (!holds_bf16(o.dtype) && o.dtype != "tf32" && o.dtype != "fp32") {
        throw Error(ErrorKind::input, "bench_layers", "--dtype " + o.dtype + ": expected bf16, fp8, fp8_e4m3, tf32 or fp32");
      }
    } else if (a == "--shapes") {
      const std::string s = value();
      if (s != "gpt2" && s != "small") throw Error(ErrorKind::input, "bench_layers", "--shapes " + s + ": expected gpt2 or small");
      o.small = s == "small";
    } else {
      throw Error(ErrorKind::input, "bench_layers",
                  "unknown argument " + a +
                      " (--json FILE --iters N --rows N --dtype bf16|fp8|fp8_e4m3|tf32|fp32 --shapes gpt2|small)");
    }
  }
  if (o.small && !rows_given) o.rows = 256;
  return o;
}

// The model's widths: GPT-2 124M, or a small stand-in for a run on the emulated device.
struct Widths {
  int64_t d, hidden, vocab, real_vocab, positions, product;  // product: the rate measurement's N
};

Widths widths(bool small) {
  if (small) return {64, 256, 512, 500, 256, 256};
  return {768, 3072, 50304, 50257, 1024, 8192};
}

// What one pass must move and compute.
struct Cost {
  double flops = 0, bytes = 0;
};

// One layer as the model calls it: its spec, which activations it gets in bf16, whether it adds
// into the residual stream, and its forward and backward costs.
struct Case {
  std::string label, layer;
  LayerSpec spec;
  bool x_bf16 = false, y_bf16 = false, residual = false, loss = false;
  bool fp8 = false;  // the classifier with [model.cross_entropy] fp8 (its products in FP8)
  // run.residual_dtype = "bf16": the stream the layer reads or adds to held in bf16 (a norm's x, a
  // projection's residual and y).
  bool stream_bf16 = false;
  // The layer called this many times on one x, as the model calls q's, k's and v's projections on
  // the norm's output: forward each writing its output, backward the first writing d_x (v's) and
  // the others adding to it (k's, q's), each with its own weight gradient.
  int calls = 1;
  Cost fwd, bwd;
};

Case named(std::string label, std::string layer) {
  Case c;
  c.label = std::move(label);
  c.layer = std::move(layer);
  return c;
}

struct Result {
  std::string label, layer, pass, status;
  double flops = 0, bytes = 0, predicted_ms = 0, measured_ms = 0;
};

// The cases and their costs, counted from the shapes (see the header for what is counted).
std::vector<Case> gpt2_cases(const Widths& w, int64_t rows, bool bf16, bool fp8) {
  const double N = double(rows), d = double(w.d), h = double(w.hidden), V = double(w.vocab);
  const double act = bf16 ? 2 : 4;  // a held activation (norm output, q/k/v, product input)
  const double wt = bf16 ? 2 : 4;   // the weights a product reads (the bf16 copy under bf16)
  std::vector<Case> cs;
  {
    Case c = named("wte lookup", "embedding");
    c.spec.in = w.d;
    c.spec.out = w.vocab;
    c.fwd = {0, N * 4 + N * d * 4 + N * d * 4};      // ids; rows of the table read; y written
    c.bwd = {0, N * 4 + N * d * 4 + N * d * 4 * 2};  // ids; dy read; the gradient rows read and written
    cs.push_back(c);
  }
  {
    Case c = named("wpe add", "learned");
    c.spec.in = w.d;
    c.spec.max_positions = w.positions;
    c.fwd = {N * d, N * 4 + N * d * 4 * 3};                  // positions; x, the table's rows read, y written
    c.bwd = {N * d, N * 4 + N * d * 4 * 2 + N * d * 4 * 2};  // dy read, d_x written; the gradient rows read and written
    cs.push_back(c);
  }
  {
    Case c = named("ln (d)", "layernorm");
    c.spec.in = w.d;
    c.y_bf16 = bf16;
    c.fwd = {8 * N * d, N * d * 4 + N * d * act + N * 8};  // x read, y written, mean and rstd kept
    c.bwd = {12 * N * d, N * d * 4 * 3 + N * 8};           // x, dy read, dx written; the statistics
    cs.push_back(c);
  }
  const auto product = [&](const char* label, int64_t in, int64_t out, bool residual) {
    Case c = named(label, "linear");
    c.spec.in = in;
    c.spec.out = out;
    c.x_bf16 = bf16;
    c.y_bf16 = bf16 && !residual;  // q, k, v in bf16 for attention; a projection adds into the f32 stream
    c.residual = residual;
    const double i = double(in), o = double(out);
    c.fwd = {2 * N * i * o, N * i * act + i * o * wt + N * o * (residual ? 8 : act) + o * 4};
    // d_x = dy W, dW += dy^T x, db += column sums of dy.
    c.bwd = {4 * N * i * o, N * o * 4 + N * i * act + i * o * wt + N * i * 4 + i * o * 8 + o * 8};
    cs.push_back(c);
  };
  product("attn qkv (d -> 3d)", w.d, 3 * w.d, false);
  {
    // q, k and v as the model runs them today: three d -> d products on the same input, against the
    // one product above (what fusing them would be; docs/performance.md, "One q, k, v product").
    // Backward the second and third add to the f32 d_x: 8 bytes an element more each.
    product("attn q, k, v (3 x d -> d)", w.d, w.d, false);
    Case& c = cs.back();
    c.calls = 3;
    c.fwd = {3 * c.fwd.flops, 3 * c.fwd.bytes};
    c.bwd = {3 * c.bwd.flops, 3 * c.bwd.bytes + 2 * N * d * 4};
  }
  product("attn proj (d -> d) + residual", w.d, w.d, true);
  {
    Case c = named("mlp (d -> 4d -> d) + residual", "gelu_mlp");
    c.spec.in = w.d;
    c.spec.out = w.hidden;
    c.x_bf16 = bf16;
    c.residual = true;
    // fc: x read, the pre-activation and the activation written (both held: bf16 under bf16);
    // proj: the activation read, the stream read and written.
    c.fwd = {4 * N * d * h, N * d * act + 2 * d * h * wt + 3 * N * h * act + N * d * 8};
    // proj: dy read, dW_proj from the activation; the gradient below the GELU written from the
    // pre-activation (held like it); fc: that gradient read twice (dx and dW_fc), x read, dx written;
    // the weight gradients read and written.
    c.bwd = {8 * N * d * h, N * d * 4 + N * h * act * 5 + N * d * act + N * d * 4 + 2 * d * h * (wt + 8)};
    cs.push_back(c);
  }
  {
    // The Llama-style MLP at this width (hidden layer_params::swiglu_hidden(d)): gate and up on x, the SwiGLU,
    // down added to the stream. g and u written and read (bf16 under bf16: the products write them
    // so), h written and read; backward dh written and read, dg and du written and each read by its
    // two products; x read by the weight gradients, d_x written then added to.
    Case c = named("swiglu mlp (d -> 8d/3 -> d) + residual", "swiglu_mlp");
    c.spec.in = w.d;
    c.spec.out = layer_params::swiglu_hidden(w.d);
    c.x_bf16 = bf16;
    c.residual = true;
    const double hs = double(c.spec.out);  // (the model's own widths: GPT-2 124M's d, Llama's MLP)
    c.fwd = {6 * N * d * hs, N * d * act + 3 * d * hs * wt + N * hs * act * 6 + N * d * 8};
    c.bwd = {12 * N * d * hs, N * d * 4 + N * hs * act * 13 + N * d * act + N * d * 12 + 3 * d * hs * (wt + 8)};
    cs.push_back(c);
  }
  if (bf16) {
    // The same three with the residual stream in bf16 (run.residual_dtype = "bf16"): the norm reads
    // 2 bytes of x (forward and backward), a projection reads and writes 2 bytes of the stream.
    const auto find = [&](const char* label) {
      return *std::find_if(cs.begin(), cs.end(), [&](const Case& c) { return c.label == label; });
    };
    Case ln = find("ln (d)"), proj = find("attn proj (d -> d) + residual"), mlp = find("mlp (d -> 4d -> d) + residual");
    for (Case* c : {&ln, &proj, &mlp}) {
      c->label += ", bf16 stream";
      c->stream_bf16 = true;
    }
    ln.x_bf16 = true;
    ln.fwd.bytes -= N * d * 2;
    ln.bwd.bytes -= N * d * 2;
    proj.fwd.bytes -= N * d * 4;
    mlp.fwd.bytes -= N * d * 4;
    cs.insert(cs.end(), {ln, proj, mlp});
  }
  {
    Case c = named("classifier + cross-entropy", "cross_entropy");
    c.spec.in = w.d;
    c.spec.out = w.vocab;
    c.spec.real_out = w.real_vocab;
    c.x_bf16 = bf16;
    c.loss = true;
    // One call: logits (2 N d V), d_x (2 N d V), dW (2 N d V). Logits written once and read once by
    // the row kernel, their gradient written once and read by both products (bf16 under bf16, f32
    // otherwise); x, W read, d_x written, dW read and written.
    const double logit = bf16 ? 2 : 4;
    c.fwd = {6 * N * d * V, N * V * logit * 4 + N * d * (act + 4) + d * V * (wt + 8) + N * 8};
    cs.push_back(c);
    if (fp8) {
      // Under FP8 products, the classifier with its own products in FP8 too ([model.cross_entropy]
      // fp8): the same, and each product quantises both operands with current scaling (the amax
      // read, then read again and one byte written): x and W twice each (once transposed), the
      // logit gradient twice (dx's product and dW's), 5 bytes an element each time.
      c.label += ", fp8";
      c.fp8 = true;
      c.fwd.bytes += 10 * (N * V + N * d + d * V);
      cs.push_back(c);
    }
  }
  return cs;
}

class Bench {
 public:
  Bench(const Options& o) : o_(o) {
    registry_.load_directories(Registry::default_search_path());
    run_.device = "cuda";
    run_.dtype = o.dtype;
    static const Params run{"run", {}};
    device_ = registry_.create<Device>(Kind::device, "cuda", {run, run, run_});
    stream_ = device_->stream().as<cudaStream_t>();
  }

  Device& device() { return *device_; }
  cudaStream_t stream() const { return stream_; }

  // The product rate of this card in the run's precision: the `linear` layer's forward on an
  // N x N x N product (no bias), FLOP/s.
  double product_rate(int64_t n) {
    Case c = named("product rate", "linear");
    c.spec.in = c.spec.out = n;
    c.spec.bias = false;
    c.x_bf16 = holds_bf16(o_.dtype);
    c.y_bf16 = c.x_bf16;
    const double ms = time_case(c, n, false);
    return 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3);
  }

  // Median ms of the case's forward (backward = false) or backward, after one forward.
  double time_case(const Case& c, int64_t rows, bool backward) {
    const bool bf16 = holds_bf16(o_.dtype);
    LayerBase& layer = make(c.layer, c.fp8);
    ParamTable table;
    layer.declare_params(c.spec, "bench", table);
    const int64_t n_in = rows * c.spec.in, n_out = c.loss ? 0 : rows * out_width(c);
    Buffer params = filled(DType::f32, std::max<int64_t>(1, table.total), 0.02f);
    Buffer grads = filled(DType::f32, std::max<int64_t>(1, table.total), 0.0f);
    Buffer copy;
    if (bf16) {
      copy = device_->alloc(DType::bf16, params.count());
      device_->to_bf16(copy.view(), params.view());
    }
    Buffer x = filled(c.x_bf16 ? DType::bf16 : DType::f32, n_in, 0.5f);
    Buffer y = filled(c.y_bf16 || c.stream_bf16 ? DType::bf16 : DType::f32, std::max<int64_t>(1, n_out), 0.0f);
    Buffer d_y = filled(DType::f32, std::max<int64_t>(1, n_out), 1e-3f), d_x = filled(DType::f32, n_in, 0.0f);
    Buffer saved = filled(DType::f32, std::max<int64_t>(1, layer.activation_elements(c.spec, rows)), 0.0f);
    Buffer scratch = filled(DType::f32, std::max<int64_t>(1, layer.scratch_elements(c.spec, rows)), 0.0f);
    Buffer losses = filled(DType::f32, rows, 0.0f);
    Batch batch = ids(rows, c.spec);
    DeviceBatch db;
    device_->upload_batch(batch, db);

    LayerCall call;
    call.spec = &c.spec;
    call.batch = &db.views;
    call.rows = rows;
    call.stream = device_->stream();
    call.x = x.view();
    call.params = params.view();
    if (bf16) call.params_bf16 = copy.view();
    call.saved = saved.view();
    call.scratch = scratch.view();
    if (c.loss) {
      auto& loss = dynamic_cast<LossLayer&>(layer);
      call.losses = losses.view();
      call.d_x = d_x.view();
      call.grads = grads.view();
      call.grad_scale = 1.0 / double(rows);
      return bench::median_event_ms(stream_, o_.iters, [&] { loss.loss(call); });
    }
    auto& l = dynamic_cast<Layer&>(layer);
    call.y = y.view();
    if (c.residual) call.residual = y.view();  // the stream: y = y + f(x), as the model adds
    if (!backward) {
      return bench::median_event_ms(stream_, o_.iters, [&] {
        for (int k = 0; k < c.calls; ++k) l.forward(call);
      });
    }
    l.forward(call);
    LayerCall back = call;
    back.residual = {};
    back.y = {};
    back.d_y = d_y.view();
    back.d_x = d_x.view();
    back.grads = grads.view();
    return bench::median_event_ms(stream_, o_.iters, [&] {
      for (int k = 0; k < c.calls; ++k) {
        back.input_grad = k == 0 ? GradMode::overwrite : GradMode::accumulate;
        l.backward(back);
      }
    });
  }

 private:
  static int64_t out_width(const Case& c) {
    if (c.layer == "linear") return c.spec.out;
    return c.spec.in;  // lookups, norms, the MLP: d wide
  }

  // `fp8`: the layer's own key fp8 = true (cross_entropy's products in FP8).
  LayerBase& make(const std::string& name, bool fp8) {
    const std::string key = name + (fp8 ? " fp8" : "");
    auto it = layers_.find(key);
    if (it != layers_.end()) return *it->second;
    const Params common{"model", {}};
    const Params own = fp8 ? Params{"model." + name, {{"fp8", Value{true}}}} : Params{"model." + name, {}};
    auto made = registry_.create<LayerBase>(Kind::layer, name, {common, own, run_});
    return *layers_.emplace(key, std::move(made)).first->second;
  }

  Buffer filled(DType dtype, int64_t n, float value) {
    if (dtype == DType::f32) {
      Buffer b = device_->alloc(DType::f32, n);
      device_->fill(b.view(), value);
      return b;
    }
    Buffer f = filled(DType::f32, n, value);
    Buffer b = device_->alloc(dtype, n);
    device_->to_bf16(b.view(), f.view());
    return b;
  }

  // One row of `rows` positions: every token, target and position different where the table allows
  // (a scatter-add without long runs of one id), segment 1 throughout.
  static Batch ids(int64_t rows, const LayerSpec& spec) {
    Batch b;
    b.reset(1, int32_t(rows));
    const int64_t vocab = spec.real_out > 0 ? spec.real_out : spec.out > 0 ? spec.out : 1;
    const int64_t positions = spec.max_positions > 0 ? spec.max_positions : 1;
    for (int64_t r = 0; r < rows; ++r) {
      b.tokens[std::size_t(r)] = int32_t((r * 7919) % vocab);
      b.targets[std::size_t(r)] = int32_t((r * 104729 + 1) % vocab);
      b.positions[std::size_t(r)] = int32_t(r % positions);
      b.segment_ids[std::size_t(r)] = 1;
    }
    return b;
  }

  const Options& o_;
  Registry registry_;
  RunContext run_;
  std::unique_ptr<Device> device_;
  cudaStream_t stream_ = nullptr;
  std::map<std::string, std::unique_ptr<LayerBase>> layers_;
};

Result measure(Bench& bench, const Case& c, int64_t rows, bool backward, double rate, double bandwidth) {
  Result r;
  r.label = c.label;
  r.layer = c.layer;
  r.pass = c.loss ? "fwd+bwd" : backward ? "bwd" : "fwd";
  const Cost cost = backward ? c.bwd : c.fwd;
  r.flops = cost.flops;
  r.bytes = cost.bytes;
  r.predicted_ms = 1e3 * std::max(cost.flops / rate, cost.bytes / bandwidth);
  try {
    r.measured_ms = bench.time_case(c, rows, backward);
    r.status = "ok";
  } catch (const std::exception& e) {
    (void)cudaGetLastError();
    r.status = std::string("failed: ") + e.what();
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (!cuda::device_available()) {
      std::printf("bench_layers: no CUDA device; skipped\n");
      return 77;
    }
    const Widths w = widths(o.small);
    Bench bench(o);
    const double bandwidth = bench::copy_bandwidth(bench.stream(), o.small ? std::size_t(8) << 20 : std::size_t(1) << 30);
    const double rate = bench.product_rate(w.product);
    std::printf("bench_layers: %s, run.dtype %s, %lld rows; product rate %.1f TFLOP/s (linear %lld^3), copy %.0f GB/s\n",
                bench.device().describe().c_str(), o.dtype.c_str(), static_cast<long long>(o.rows), rate / 1e12,
                static_cast<long long>(w.product), bandwidth / 1e9);
    std::vector<Result> results;
    for (const Case& c : gpt2_cases(w, o.rows, holds_bf16(o.dtype), fp8_dtype(o.dtype))) {
      results.push_back(measure(bench, c, o.rows, false, rate, bandwidth));
      if (!c.loss) results.push_back(measure(bench, c, o.rows, true, rate, bandwidth));
    }
    std::printf("%-44s %-8s %10s %10s %12s %12s %8s\n", "layer", "pass", "GFLOP", "MB", "predicted ms", "measured ms", "ratio");
    json rows = json::array();
    bool all_ok = true;
    for (const Result& r : results) {
      const double ratio = r.predicted_ms > 0 ? r.measured_ms / r.predicted_ms : 0.0;
      if (r.status == "ok") {
        std::printf("%-44s %-8s %10.1f %10.1f %12.3f %12.3f %8.2f\n", r.label.c_str(), r.pass.c_str(), r.flops / 1e9, r.bytes / 1e6,
                    r.predicted_ms, r.measured_ms, ratio);
      } else {
        all_ok = false;
        std::printf("%-44s %-8s %s\n", r.label.c_str(), r.pass.c_str(), r.status.c_str());
      }
      rows.push_back({{"label", r.label},
                      {"layer", r.layer},
                      {"pass", r.pass},
                      {"status", r.status},
                      {"flops", r.flops},
                      {"bytes", r.bytes},
                      {"predicted_ms", r.predicted_ms},
                      {"measured_ms", r.measured_ms},
                      {"measured_over_predicted", ratio}});
    }
    if (!o.json_path.empty()) {
      const json out = {{"device", bench.device().describe()}, {"dtype", o.dtype}, {"rows", o.rows}, {"product_tflops", rate / 1e12},
                        {"copy_gbs", bandwidth / 1e9},         {"results", rows}};
      std::ofstream(o.json_path) << out.dump(2) << "\n";
    }
    return all_ok ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_layers: %s\n", e.what());
    return e.kind() == ErrorKind::input ? 2 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_layers: %s\n", e.what());
    return 1;
  }
}
