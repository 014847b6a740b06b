// The CUDA training path end to end through the `ablate` program: a small quickstart model trained
// on cuda in f32 follows the CPU's f32 run step by step; a cuda run stopped and resumed gives the
// uninterrupted run's losses bit for bit; a cuda checkpoint resumes on the cpu and back; a run whose
// memory plan cannot fit the device is refused before training; bf16 products follow the CPU within
// bf16's rounding, with the activations only products read held in bf16 (the plan's saving checked
// exactly); FP8 products (current and delayed scaling) follow the bf16 run within FP8's rounding,
// delayed scaling's state resumes bit for bit, and a bf16 resume ignores it. Exits 77 (CTest:
// skipped) without a CUDA device.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>

#include "ablate/cuda_check.hpp"
#include "ablate/error.hpp"
#include "fp8_device.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/registry.hpp"
#include "run_files.hpp"
#include "test_support.hpp"

using namespace ablate::test;
namespace fs = std::filesystem;

namespace {

// The tiny quickstart of tests/train, with a seq_len not a multiple of 64 and packed rows.
const std::string kTiny = " --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.max_seq_len=80"
                          " --set batching.batch_size=4 --set batching.seq_len=77 --set run.threads=2 --set run.eval_batches=2"
                          " --set data.synthetic_probes.documents=2000 --set data.synthetic_probes.validation_documents=50"
                          " --set checkpoint.every=100";
const std::string kCuda = " --set run.device=cuda --set attention.name=naive_cuda --set optimizer.name=adamw_fused";
const std::string kCpu = " --set run.device=cpu --set attention.name=naive_cpu --set optimizer.name=adamw";

std::string config() { return std::string(ABLATE_SOURCE_DIR) + "/configs/quickstart.toml"; }

CommandResult train(const std::string& args) {
  const CommandResult r = run_ablate("train " + config() + kTiny + args);
  INFO(r.output);
  return r;
}

// True under the emulated CUDA device (ABLATE_EMULATE_CUDA=1, docs/emulated-cuda.md).
bool emulated() {
  const char* v = std::getenv("ABLATE_EMULATE_CUDA");
  return v != nullptr && std::string(v) == "1";
}

double rel(double a, double b) { return std::abs(a - b) / std::max(1e-30, std::abs(b)); }

// A GPT-2-shaped model's options (learned positions, LayerNorm, GELU MLP, heads of d_model / heads).
ablate::ModelOptions gpt_shape(int64_t d_model, int64_t layers, int64_t heads, int64_t vocab, int64_t seq, int64_t hidden) {
  ablate::ModelOptions o;
  o.d_model = d_model;
  o.n_layers = layers;
  o.n_heads = o.n_kv_heads = heads;
  o.head_dim = d_model / heads;
  o.vocab_size = o.vocab_padded = vocab;
  o.max_seq_len = seq;
  o.mlp_hidden = hidden;
  o.attention = "naive_cuda";
  return o;
}

// The activation plan a model of options `o` makes on cuda under a run.dtype (the model is built,
// its arena never allocated).
struct PlanProbe {
  ablate::Registry registry;
  ablate::ModelOptions o;
  explicit PlanProbe(ablate::ModelOptions options) : o(std::move(options)) { registry.load_directories({plugin_dir()}); }
  bool has(const char* attention) const { return registry.find(ablate::Kind::attention, attention, "cuda") != nullptr; }
  ablate::ActivationPlan plan(const char* dtype, int64_t rows, int64_t seq_len, const char* residual = "fp32") {
    ablate::RunContext run;
    run.device = "cuda";
    run.dtype = dtype;
    run.residual_dtype = residual;
    run.threads = 2;
    ablate::Model m(o, registry, run);
    return m.activation_plan(rows, seq_len);
  }
};

}  // namespace

TEST_CASE("cuda f32 follows the cpu f32 run step by step (same weights, same batches)") {
  TempDir tmp;
  const fs::path cpu = tmp.path() / "cpu", gpu = tmp.path() / "gpu";
  // The probe-grammar evaluation on its first 16 items, with the validation loss: the same trainer
  // loop scores it through the device's forward pass.
  const std::string evals = " --set eval.probe_rows.enabled=true --set eval.probe_rows.limit=16 --set eval.probe_rows.path=" +
                            std::string(ABLATE_SOURCE_DIR) + "/configs/evals/probe-rows.jsonl";
  REQUIRE(train(kCpu + evals + " --set run.steps=20 --set run.eval_every=10 --run-dir " + cpu.string()).exit_code == 0);
  REQUIRE(train(kCuda + evals + " --set run.steps=20 --set run.eval_every=10 --run-dir " + gpu.string()).exit_code == 0);
  const auto a = metrics(cpu), b = metrics(gpu);
  REQUIRE(a.size() == 20);
  REQUIRE(b.size() == 20);
  // Step 1 starts from the same parameters: only the order of f32 sums differs (products of up to
  // a few hundred terms, softmax over 80 columns), so the loss and the gradient norm agree to about
  // 1e-6 relative; 1e-5 leaves a margin. Later steps go through AdamW, whose update divides by
  // sqrt(v): a gradient element near zero turns a 1e-6 difference into a visible one, and 20 steps
  // at lr 3e-3 compound it. 2e-3 relative on the loss is still far below a step's change (~1e-1).
  CHECK(rel(b[0]["loss"].get<double>(), a[0]["loss"].get<double>()) < 1e-5);
  CHECK(rel(b[0]["grad_norm"].get<double>(), a[0]["grad_norm"].get<double>()) < 1e-5);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(rel(b[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 2e-3);
    if (a[i].contains("val_loss")) CHECK(rel(b[i]["val_loss"].get<double>(), a[i]["val_loss"].get<double>()) < 2e-3);
    // Accuracies are counts of 16 items: the weights' 2e-3 may move an ending within that of a tie
    // across it, so one item either way.
    CHECK(a[i].contains("eval/probe_rows/acc") == a[i].contains("val_loss"));
    CHECK(b[i].contains("eval/probe_rows/acc") == a[i].contains("val_loss"));
    if (a[i].contains("eval/probe_rows/acc")) {
      CHECK(b[i]["eval/probe_rows/items"].get<double>() == 16);
      CHECK(std::abs(b[i]["eval/probe_rows/acc"].get<double>() - a[i]["eval/probe_rows/acc"].get<double>()) <= 1.0 / 16 + 1e-12);
    }
  }
  // MFU is measured against the device's peak (the table's, for a known GPU); an emulated device
  // says so in run.json and has no peak, so no MFU.
  CHECK(read_json(gpu / "run.json")["device"].get<std::string>() == "cuda");
  if (emulated()) {
    CHECK(read_json(gpu / "run.json")["device_name"].get<std::string>().find("emulated") != std::string::npos);
    CHECK(b.back()["mfu"].get<double>() == 0.0);
  } else {
    CHECK(b.back()["mfu"].get<double>() > 0.0);
  }
}

TEST_CASE(
    "one name on every device: adamw and naive train on cuda as adamw_fused and naive_cuda do, on the cpu as adamw and naive_cpu") {
  // `adamw` on cuda is adamw_fused's kernel and `naive` each device's exact backend: the same runs
  // bit for bit, so moving an experiment to the GPU takes run.device alone.
  TempDir tmp;
  const std::string steps = " --set run.steps=3 --run-dir ";
  const std::string plain = " --set attention.name=naive --set optimizer.name=adamw";
  for (const char* device : {"cuda", "cpu"}) {
    INFO("run.device = " << device);
    const std::string on = std::string(" --set run.device=") + device;
    const fs::path named = tmp.path() / (std::string(device) + "-named"), plain_dir = tmp.path() / (std::string(device) + "-plain");
    const std::string old_names = std::string(device) == "cuda" ? kCuda : kCpu;
    REQUIRE(train(old_names + steps + named.string()).exit_code == 0);
    REQUIRE(train(on + plain + steps + plain_dir.string()).exit_code == 0);
    const auto a = metrics(named), b = metrics(plain_dir);
    REQUIRE(a.size() == 3);
    REQUIRE(b.size() == 3);
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(b[i]["loss"].get<double>() == a[i]["loss"].get<double>());
      CHECK(b[i]["grad_norm"].get<double>() == a[i]["grad_norm"].get<double>());
    }
  }
}

TEST_CASE("LoRA on cuda follows the cpu LoRA run step by step: GPT-2 style with an fp32 base, Llama style with an NF4 base") {
  // The frozen base's layers (embedding, learned, layernorm or rmsnorm, gelu_mlp or swiglu_mlp,
  // linear, cross_entropy) compute input gradients only, the lora adapters on q and v train
  // (dropout 0.1 on their input: the same mask on both devices), NF4 weights are dequantized by
  // the cuda device's kernel. Tolerances as for the f32 run above.
  const std::string lora =
      " --set adapter.name=lora --set adapter.lora.rank=4 --set adapter.lora.alpha=8 --set adapter.lora.dropout=0.1"
      " --set run.steps=6 --set run.eval_every=3";
  const std::string llama = " --set model.norm=rmsnorm --set model.mlp=swiglu_mlp --set model.position=rope --set model.bias=false"
                            " --set model.tie_embeddings=false --set adapter.base_dtype=nf4";
  for (const std::string& shape : {std::string(), llama}) {
    INFO(std::string(shape.empty() ? "gpt2 style, fp32 base" : "llama style, nf4 base"));
    TempDir tmp;
    const fs::path cpu = tmp.path() / "cpu", gpu = tmp.path() / "gpu";
    REQUIRE(train(kCpu + lora + shape + " --run-dir " + cpu.string()).exit_code == 0);
    REQUIRE(train(kCuda + lora + shape + " --run-dir " + gpu.string()).exit_code == 0);
    const auto a = metrics(cpu), b = metrics(gpu);
    REQUIRE(a.size() == 6);
    REQUIRE(b.size() == 6);
    CHECK(rel(b[0]["loss"].get<double>(), a[0]["loss"].get<double>()) < 1e-5);
    CHECK(rel(b[0]["grad_norm"].get<double>(), a[0]["grad_norm"].get<double>()) < 1e-5);
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("step " << a[i]["step"]);
      CHECK(rel(b[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 2e-3);
    }
    const auto ra = read_json(cpu / "run.json"), rb = read_json(gpu / "run.json");
    CHECK(rb["trainable_parameters"] == ra["trainable_parameters"]);
    CHECK(rb["grad_bytes"].get<int64_t>() == 4 * rb["trainable_parameters"].get<int64_t>());
    CHECK(rb["nf4_bytes"] == ra["nf4_bytes"]);
    if (!shape.empty()) CHECK(rb["nf4_bytes"].get<int64_t>() > 0);
  }
}

TEST_CASE(
    "run.dtype = bf16 holds the norms' outputs, q, k, v, the attention output, their gradients and the MLP's hidden activation in bf16: the plan's saving, exactly") {
  // d_model 32, mlp hidden 128, 2 blocks; one row of 64 positions: every slot a multiple of the
  // plan's 64-element (256-byte) rounding, so the saving is exact. Per block ln1 and ln2 (N*C
  // values each) take N*C/2 f32 elements instead of N*C, the MLP keeps pre and post in bf16 (N*H/2
  // each) instead of 2*N*H; lnf likewise once. The scratch (the MLP's, the largest here) grows by
  // the bf16 gradient below the GELU (N*H/2), which backward's product writes beside the f32 region
  // its fallback uses.
  PlanProbe probe(gpt_shape(32, 2, 2, 64, 64, 128));
  ablate::ModelOptions& o = probe.o;
  const auto plan = [&](const char* dtype) { return probe.plan(dtype, 1, 64); };
  const auto plan_elements = [&](const char* dtype) { return plan(dtype).elements; };
  const int64_t N = 64, C = 32, H = 128;
  // Both attention backends take q, k, v and write the attention output in bf16 too
  // (Attention::bf16_activations): q_lin, k_lin, v and att, N * C each, per block at half the bytes
  // (q and k are q_lin and k_lin without the qk-norm); and their gradients d_q, d_k, d_v and d_att
  // (Attention::bf16_gradients, LayerBase::bf16_attention_grads), N * C each, once.
  const int64_t saving =
      o.n_layers * (2 * (N * C / 2) + (2 * N * H - N * H) + 4 * (N * C / 2)) + N * C / 2 - N * H / 2 + 4 * (N * C / 2);
  CHECK(plan_elements("fp32") - plan_elements("bf16") == saving);
  CHECK(plan_elements("fp32") == plan_elements("tf32"));
  // What holds bf16 (run.json's activation_bytes_by_dtype): per block ln1, ln2, q_lin, k_lin, v and
  // att at N * C / 2 elements each and the MLP's pre and post at N * H / 2 each; lnf and the four
  // attention gradients once.
  const ablate::ActivationPlan bf16 = plan("bf16"), fp32 = plan("fp32");
  CHECK(bf16.bf16_elements == o.n_layers * (6 * (N * C / 2) + N * H) + N * C / 2 + 4 * (N * C / 2));
  CHECK(bf16.bf16_bytes() + bf16.f32_bytes() + bf16.workspace_bytes == bf16.bytes());
  CHECK(fp32.bf16_elements == 0);
  CHECK(fp32.f32_bytes() == fp32.elements * 4);
  if (probe.has("cudnn_flash")) {
    o.attention = "cudnn_flash";
    CHECK(plan_elements("fp32") - plan_elements("bf16") == saving);
  }
}

TEST_CASE("GPT-2 124M under run.dtype = bf16 holds at most 0.6x the activation bytes of fp32") {
  // The real shape (12 blocks of d_model 768, 12 heads, hidden 3072, vocabulary 50304) at the
  // micro-batch the GPU runs train (64 rows of 1024): the plan is a pure function of the layers'
  // answers, so only the parameters are allocated. The arena (every slot the plan holds) is
  // compared with naive_cuda, whose T x T score workspace is the same in both precisions and no
  // part of what bf16 changes; with cudnn_flash (a GPU with cuDNN) the whole of activation_bytes,
  // workspace included.
  PlanProbe probe(gpt_shape(768, 12, 12, 50304, 1024, 3072));
  probe.o.vocab_size = 50257;
  const auto plan = [&](const char* attention, const char* dtype) {
    probe.o.attention = attention;
    return probe.plan(dtype, 64, 1024);
  };
  const ablate::ActivationPlan fp32 = plan("naive_cuda", "fp32"), bf16 = plan("naive_cuda", "bf16");
  const double arena = double(bf16.elements) / double(fp32.elements);
  MESSAGE("GPT-2 124M arena, bf16 / fp32: " << arena << " (" << bf16.elements * 4 / (1 << 20) << " / " << fp32.elements * 4 / (1 << 20)
                                            << " MiB at 64 x 1024)");
  CHECK(arena <= 0.6);
  CHECK(double(bf16.bf16_bytes()) > 0.5 * double(bf16.f32_bytes()));
  if (probe.has("cudnn_flash")) {
    const ablate::ActivationPlan f = plan("cudnn_flash", "fp32"), b = plan("cudnn_flash", "bf16");
    MESSAGE("with cudnn_flash, activation_bytes bf16 / fp32: " << double(b.bytes()) / double(f.bytes()));
    CHECK(double(b.bytes()) <= 0.6 * double(f.bytes()));
  }
}

TEST_CASE("run.residual_dtype = bf16 holds the residual stream in bf16 too: the plan's saving, exactly; GPT-2 124M's arena") {
  // The model of the case above: the stream is each block's input (res, n_layers + 1 slots of N * C
  // values, the last lnf's input) and the attention's output added to it (mid, n_layers slots):
  // every one at half the bytes, and nothing else changes.
  PlanProbe probe(gpt_shape(32, 2, 2, 64, 64, 128));
  const int64_t N = 64, C = 32, L = probe.o.n_layers;
  const ablate::ActivationPlan bf16 = probe.plan("bf16", 1, 64), stream = probe.plan("bf16", 1, 64, "bf16");
  CHECK(bf16.elements - stream.elements == (2 * L + 1) * (N * C / 2));
  CHECK(stream.bf16_elements - bf16.bf16_elements == (2 * L + 1) * (N * C / 2));
  // The FP8 modes hold what bf16 holds, and in the GELU MLP's scratch the partial sums of fc's bias
  // gradient: one per 32 rows and hidden value (hidden 128).
  CHECK(probe.plan("fp8", 1, 64, "bf16").elements == stream.elements + (N + 31) / 32 * 128);
  // Without bf16 products there is no plan for the stream to join: refused (exit 2 from `ablate`).
  try {
    probe.plan("fp32", 1, 64, "bf16");
    FAIL("a bf16 stream without bf16 products was accepted");
  } catch (const ablate::Error& e) {
    CHECK(e.exit_code() == 2);
    CHECK(std::string(e.what()).find("run.residual_dtype") != std::string::npos);
  }
  // GPT-2 124M at 64 x 1024: 25 stream slots of 192 MiB each, halved.
  PlanProbe gpt2(gpt_shape(768, 12, 12, 50304, 1024, 3072));
  gpt2.o.vocab_size = 50257;
  const ablate::ActivationPlan f = gpt2.plan("fp32", 64, 1024), b = gpt2.plan("bf16", 64, 1024),
                               r = gpt2.plan("bf16", 64, 1024, "bf16");
  MESSAGE("GPT-2 124M arena at 64 x 1024, MiB: fp32 " << f.elements * 4 / (1 << 20) << ", bf16 " << b.elements * 4 / (1 << 20)
                                                      << ", bf16 + bf16 residual " << r.elements * 4 / (1 << 20));
  CHECK(b.elements - r.elements == 25 * (64 * 1024 * 768 / 2));
}

TEST_CASE("run.dtype = tf32 trains on cuda within TF32's rounding of the f32 run") {
  TempDir tmp;
  const fs::path f32 = tmp.path() / "f32", tf32 = tmp.path() / "tf32";
  REQUIRE(train(kCuda + " --set run.steps=10 --run-dir " + f32.string()).exit_code == 0);
  REQUIRE(train(kCuda + " --set run.dtype=tf32 --set run.steps=10 --run-dir " + tf32.string()).exit_code == 0);
  const auto a = metrics(f32), b = metrics(tf32);
  REQUIRE(a.size() == b.size());
  // TF32 keeps 10 mantissa bits (2^-11 relative per input): products over d_model = 32 terms differ
  // by ~1e-3 relative, and the loss, a mean over many positions, by less; 1e-2 bounds 10 steps.
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(rel(b[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 1e-2);
  CHECK(b.back()["loss"].get<double>() < b.front()["loss"].get<double>());
}

TEST_CASE("run.dtype = bf16 follows the cpu f32 run within bf16's rounding, and resumes bit for bit") {
  TempDir tmp;
  const fs::path cpu = tmp.path() / "cpu", bf16 = tmp.path() / "bf16", parts = tmp.path() / "parts";
  const std::string steps = " --set run.steps=20 --set run.eval_every=10";
  REQUIRE(train(kCpu + steps + " --run-dir " + cpu.string()).exit_code == 0);
  REQUIRE(train(kCuda + " --set run.dtype=bf16" + steps + " --run-dir " + bf16.string()).exit_code == 0);
  const auto a = metrics(cpu), b = metrics(bf16);
  REQUIRE(a.size() == 20);
  REQUIRE(b.size() == 20);
  // bf16 keeps 8 significant bits (2^-9 relative per operand): a product over d_model = 32 or the
  // MLP's 128 terms errs by about 2^-9 * sqrt(K) / sqrt(K) ~ 2e-3 relative per element, and the
  // loss, a mean over ~300 positions of a log-softmax of such logits, by less. Through 20 AdamW
  // steps at lr 3e-3 the runs drift apart as the f32 pair does, 8x more (2^-9 vs TF32's 2^-11
  // would be 4x; 8x leaves a margin): 3e-2 relative on each step's loss, 1e-2 on the first step.
  CHECK(rel(b[0]["loss"].get<double>(), a[0]["loss"].get<double>()) < 1e-2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(rel(b[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 3e-2);
  }
  CHECK(b.back()["loss"].get<double>() < b.front()["loss"].get<double>());
  // MFU is counted against the device's bf16 peak (every GPU of the table has one above 60 TFLOP/s).
  const auto summary = read_json(bf16 / "summary.json");
  if (summary["peak_source"] == "device table") CHECK(summary["peak_tflops"].get<double>() > 60.0);
  // Stopped and resumed: the same bits (the bf16 copies are made afresh from the f32 weights).
  REQUIRE(train(kCuda + " --set run.dtype=bf16" + steps + " --run-dir " + parts.string() + " --stop-at 7").exit_code == 0);
  REQUIRE(train(kCuda + " --set run.dtype=bf16" + steps + " --resume " + parts.string()).exit_code == 0);
  const auto c = metrics(parts);
  REQUIRE(c.size() == b.size());
  for (std::size_t i = 0; i < b.size(); ++i) CHECK(c[i]["loss"].get<double>() == b[i]["loss"].get<double>());

  // run.residual_dtype = bf16: the stream rounded to bf16 at each of its six writes (the embedding,
  // the position table, then two adds per block), each 2^-8 relative at most and about 2^-10 rms,
  // independent from write to write: about sqrt(6) 2^-10 ~ 2.4e-3 relative on the final norm's
  // input, which the norm passes on to the logits and, averaged over ~300 positions, far less to
  // the loss. The same bounds as bf16's own
  // hold with room; and it must have rounded (not the bf16 run under another name).
  const fs::path stream = tmp.path() / "stream", stream_parts = tmp.path() / "stream_parts";
  const std::string bf16_stream = " --set run.dtype=bf16 --set run.residual_dtype=bf16";
  REQUIRE(train(kCuda + bf16_stream + steps + " --run-dir " + stream.string()).exit_code == 0);
  const auto r = metrics(stream);
  REQUIRE(r.size() == 20);
  CHECK(rel(r[0]["loss"].get<double>(), a[0]["loss"].get<double>()) < 1e-2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(rel(r[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 3e-2);
    CHECK(rel(r[i]["loss"].get<double>(), b[i]["loss"].get<double>()) < 3e-2);
  }
  CHECK(r[0]["loss"].get<double>() != b[0]["loss"].get<double>());
  CHECK(r.back()["loss"].get<double>() < r.front()["loss"].get<double>());
  // run.json counts the stream as bf16 bytes.
  const auto bytes = [](const fs::path& run) { return read_json(run / "run.json")["activation_bytes_by_dtype"]; };
  CHECK(bytes(stream)["bf16"].get<int64_t>() > bytes(bf16)["bf16"].get<int64_t>());
  CHECK(bytes(stream)["f32"].get<int64_t>() < bytes(bf16)["f32"].get<int64_t>());
  // Nothing of it is state: stopped and resumed, the same bits.
  REQUIRE(train(kCuda + bf16_stream + steps + " --run-dir " + stream_parts.string() + " --stop-at 7").exit_code == 0);
  REQUIRE(train(kCuda + bf16_stream + steps + " --resume " + stream_parts.string()).exit_code == 0);
  const auto rr = metrics(stream_parts);
  REQUIRE(rr.size() == r.size());
  for (std::size_t i = 0; i < r.size(); ++i) CHECK(rr[i]["loss"].get<double>() == r[i]["loss"].get<double>());
}

TEST_CASE("run.residual_dtype = bf16 with an adapter on the output projection (which adds to the stream in f32) is refused, exit 2") {
  TempDir tmp;
  const CommandResult r = train(kCuda +
                                " --set run.dtype=bf16 --set run.residual_dtype=bf16 --set adapter.name=lora"
                                " --set 'adapter.targets=[\"q\",\"o\"]' --set run.steps=2 --run-dir " +
                                (tmp.path() / "r").string());
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("run.residual_dtype") != std::string::npos);
  CHECK(r.output.find("'lora'") != std::string::npos);
  CHECK(!fs::exists(tmp.path() / "r" / "metrics.jsonl"));
}

TEST_CASE("run.dtype = fp8 follows the bf16 run within FP8's rounding over 20 steps, current and delayed scaling; delayed "
          "scaling's state resumes bit for bit, and a bf16 resume ignores it") {
  if (!device_has_fp8()) {
    // Refused before training, naming the capability (exit 2), rather than failing in cuBLASLt.
    TempDir tmp;
    const CommandResult r = train(kCuda + " --set run.dtype=fp8 --set run.steps=2 --run-dir " + (tmp.path() / "r").string());
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("FP8 matrix products") != std::string::npos);
    return;
  }
  TempDir tmp;
  const fs::path bf16 = tmp.path() / "bf16", fp8 = tmp.path() / "fp8", delayed = tmp.path() / "delayed", parts = tmp.path() / "parts";
  const std::string steps = " --set run.steps=20 --set run.eval_every=10";
  const std::string scaling = " --set run.fp8_scaling=delayed --set run.fp8_amax_history=4";
  REQUIRE(train(kCuda + " --set run.dtype=bf16" + steps + " --run-dir " + bf16.string()).exit_code == 0);
  REQUIRE(train(kCuda + " --set run.dtype=fp8" + steps + " --run-dir " + fp8.string()).exit_code == 0);
  REQUIRE(train(kCuda + " --set run.dtype=fp8" + scaling + steps + " --run-dir " + delayed.string()).exit_code == 0);
  const fs::path head = tmp.path() / "head";  // the classifier's products in FP8 too
  REQUIRE(train(kCuda + " --set run.dtype=fp8 --set model.cross_entropy.fp8=true" + steps + " --run-dir " + head.string()).exit_code ==
          0);
  const fs::path attn = tmp.path() / "attn";  // attention's products on FP8 values too (naive_cuda's reference)
  REQUIRE(
      train(kCuda + " --set run.dtype=fp8 --set attention.naive_cuda.fp8=true" + steps + " --run-dir " + attn.string()).exit_code ==
      0);
  const auto a = metrics(bf16), b = metrics(fp8), c = metrics(delayed), h = metrics(head), t = metrics(attn);
  REQUIRE(a.size() == 20);
  REQUIRE(b.size() == 20);
  REQUIRE(c.size() == 20);
  REQUIRE(h.size() == 20);
  REQUIRE(t.size() == 20);
  // (fp8_e4m3's products, and delayed scaling's, are checked against their definition in
  // test_cuda_layers.cpp.) E4M3 keeps 4 significant bits (2^-4 relative per operand), E5M2 3. At
  // this model's scale the logits are of order 0.1 (d_model 32, weights of std 0.02): FP8's
  // rounding moves each by about 2^-4 of that, ~6e-3, with random sign; the loss is a mean over
  // ~300 positions of log-softmaxes, so it moves by ~6e-3 / sqrt(300) ~ 3.5e-4 absolute, ~1e-4
  // relative of a loss near 4, and 20 AdamW steps of such gradients drift about as far again.
  // Delayed scaling's scales come from up to 4 steps back, where amaxes differ by a few percent:
  // a little less of the format's range used, the same order of error. 2e-3 relative is ten
  // times that; a product that read a wrong scale, format or layout is off by whole factors.
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(rel(b[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 2e-3);
    CHECK(rel(c[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 2e-3);
    // The classifier's logits in FP8 as well: the same order of rounding on one more product.
    CHECK(rel(h[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 2e-3);
    // Attention's q, k, v and probabilities in E4M3, dO and dS in E5M2: the same order again.
    CHECK(rel(t[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 2e-3);
  }
  CHECK(h[0]["loss"].get<double>() != b[0]["loss"].get<double>());  // the head did quantise (the first forward differs)
  CHECK(t[0]["loss"].get<double>() != b[0]["loss"].get<double>());  // so did attention
  // FP8 attention outside an FP8 run.dtype: refused before training, naming the key.
  const CommandResult refused = train(
      kCuda + " --set run.dtype=bf16 --set attention.naive_cuda.fp8=true --set run.steps=2 --run-dir " + (tmp.path() / "x").string());
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("attention.naive_cuda.fp8") != std::string::npos);
  CHECK(b.back()["loss"].get<double>() < b.front()["loss"].get<double>());
  CHECK(b[5]["loss"].get<double>() != a[5]["loss"].get<double>());  // FP8 did round: not bf16 under another name
  CHECK(c[0]["loss"].get<double>() == b[0]["loss"].get<double>());  // the first step scales as current scaling does
  for (std::size_t i = 0; i < c.size(); ++i) {  // delayed scaling reports its saturated values each step; current has none
    CHECK(c[i].contains("fp8_saturated"));
    CHECK(c[i].value("fp8_saturated_worst", -1.0) <= c[i].value("fp8_saturated", -1.0));
    CHECK_FALSE(b[i].contains("fp8_saturated"));
  }
  CHECK(c[5]["loss"].get<double>() != b[5]["loss"].get<double>());  // then by the history
  // Delayed scaling's state is in the checkpoint: stopped and resumed, the same bits.
  REQUIRE(train(kCuda + " --set run.dtype=fp8" + scaling + steps + " --run-dir " + parts.string() + " --stop-at 7").exit_code == 0);
  CHECK(fs::exists(parts / "checkpoints" / "step_00000007" / "scaling.safetensors"));
  // It resumes in bf16 too: the parameters and optimizer state are bf16's, the scaling state is
  // ignored with a warning (besides the one every changed config gets).
  const fs::path as_bf16 = tmp.path() / "as_bf16";
  fs::copy(parts, as_bf16, fs::copy_options::recursive);
  const CommandResult r = train(kCuda + " --set run.dtype=bf16 --set run.steps=9 --resume " + as_bf16.string());
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("does not use: ignored") != std::string::npos);
  CHECK(metrics(as_bf16).size() == 9);
  REQUIRE(train(kCuda + " --set run.dtype=fp8" + scaling + steps + " --resume " + parts.string()).exit_code == 0);
  const auto d = metrics(parts);
  REQUIRE(d.size() == c.size());
  for (std::size_t i = 0; i < c.size(); ++i) CHECK(d[i]["loss"].get<double>() == c[i]["loss"].get<double>());
}

TEST_CASE("a Llama-style model (RMSNorm, SwiGLU, RoPE, GQA) under run.dtype = fp8 follows its bf16 run within FP8's rounding, "
          "current and delayed scaling") {
  // The SwiGLU MLP's three products (gate, up, down) and the grouped k and v projections in FP8,
  // as configs/llama-1b.toml runs them; the same bound as the GPT-2 case above, for the same
  // reasons (logits of order 0.1, a loss near 4 averaged over ~300 positions).
  if (!device_has_fp8()) return;  // refused (exit 2): the GPT-2 case checks that
  TempDir tmp;
  const std::string llama = " --set model.norm=rmsnorm --set model.mlp=swiglu_mlp --set model.mlp_hidden=96"
                            " --set model.position=rope --set model.bias=false --set model.tie_embeddings=false"
                            " --set model.n_kv_heads=1 --set run.steps=10 --set run.eval_every=0";
  const fs::path bf16 = tmp.path() / "bf16", fp8 = tmp.path() / "fp8", delayed = tmp.path() / "delayed";
  REQUIRE(train(kCuda + llama + " --set run.dtype=bf16 --run-dir " + bf16.string()).exit_code == 0);
  REQUIRE(train(kCuda + llama + " --set run.dtype=fp8 --run-dir " + fp8.string()).exit_code == 0);
  REQUIRE(train(kCuda + llama + " --set run.dtype=fp8 --set run.fp8_scaling=delayed --set run.fp8_amax_history=4 --run-dir " +
                delayed.string())
              .exit_code == 0);
  const auto a = metrics(bf16), b = metrics(fp8), c = metrics(delayed);
  REQUIRE(a.size() == 10);
  REQUIRE(b.size() == 10);
  REQUIRE(c.size() == 10);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(rel(b[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 2e-3);
    CHECK(rel(c[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 2e-3);
  }
  CHECK(b[0]["loss"].get<double>() != a[0]["loss"].get<double>());  // FP8 did round, from the first forward pass
  CHECK(c[0]["loss"].get<double>() == b[0]["loss"].get<double>());  // a fresh slot scales as current scaling
  CHECK(c[5]["loss"].get<double>() != b[5]["loss"].get<double>());  // then by the history
  CHECK(b.back()["loss"].get<double>() < b.front()["loss"].get<double>());
}

TEST_CASE("one rank: the loss sum, gradient norm and clip factor kept on the device train to the bits of the host path "
          "(adamw_fused and adamw8bit, clipping binding at every step)") {
  // optimizer.shard_state at one rank reads the loss sum and the norm to the host after the
  // backward pass and forms the clip factor there (engine.cpp); without it, the device forms it
  // and the optimizer reads it in device memory.
  TempDir tmp;
  for (const char* optimizer : {"adamw_fused", "adamw8bit"}) {
    INFO(optimizer);
    const std::string common =
        kCuda + " --set optimizer.name=" + optimizer + " --set optimizer.grad_clip=0.05 --set run.steps=6 --set run.eval_every=0";
    const fs::path device = tmp.path() / (std::string(optimizer) + "_device"), host = tmp.path() / (std::string(optimizer) + "_host");
    REQUIRE(train(common + " --run-dir " + device.string()).exit_code == 0);
    REQUIRE(train(common + " --set optimizer.shard_state=true --run-dir " + host.string()).exit_code == 0);
    const auto a = metrics(device), b = metrics(host);
    REQUIRE(a.size() == 6);
    REQUIRE(b.size() == a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("step " << a[i]["step"]);
      CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
      CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
      CHECK(a[i]["grad_norm"].get<double>() > 0.05);
      // Only a step that waits for nothing until its end measures the host's share of it
      // (StepOutcome::issue_s): at most the step's own time. (The emulated device runs each kernel
      // as it is issued, so the share itself says nothing here.)
      REQUIRE(a[i].contains("host_pct"));
      CHECK(a[i]["host_pct"].get<double>() > 0.0);
      CHECK(a[i]["host_pct"].get<double>() <= 100.0);
      CHECK_FALSE(b[i].contains("host_pct"));
    }
    CHECK(read_json(device / "summary.json").contains("host_pct"));
    CHECK_FALSE(read_json(host / "summary.json").contains("host_pct"));
    CHECK(slurp(device / "checkpoints/step_00000006/model.safetensors") ==
          slurp(host / "checkpoints/step_00000006/model.safetensors"));
  }
}

TEST_CASE("a one-rank nccl run equals the single communicator's run on cuda, step by step and bit for bit") {
  TempDir tmp;
  const std::string common = kCuda + " --set run.steps=10 --set run.eval_every=5 --set run.grad_accum_steps=2";
  const fs::path single = tmp.path() / "single", nccl = tmp.path() / "nccl";
  REQUIRE(train(common + " --set run.communicator=single --run-dir " + single.string()).exit_code == 0);
  REQUIRE(train(common + " --set run.communicator=nccl --run-dir " + nccl.string()).exit_code == 0);
  const auto a = metrics(single), b = metrics(nccl);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
    CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
  }
  CHECK(slurp(single / "checkpoints/step_00000010/model.safetensors") == slurp(nccl / "checkpoints/step_00000010/model.safetensors"));
  CHECK(read_json(nccl / "run.json")["communicator"] == "nccl");
}

TEST_CASE("run.cuda_graph replays captured steps to the losses and weights of the steps issued call by call, bit for bit") {
  // Dense rows (one 77-token document a row): every step's batch has one layout, so step 1 is issued
  // call by call, step 2 captured (then launched) and every later one replayed. An evaluation moves
  // the model's buffers to other batches: the step after it is issued again and the next captured.
  // Packed rows of short documents change layout every step: nothing is replayed, and the run says so.
  TempDir tmp;
  const std::string dense = " --set data.synthetic_probes.min_length=77 --set data.synthetic_probes.max_length=77"
                            " --set batching.long_documents=truncate --set run.steps=8";
  const auto pair = [&](const std::string& name, const std::string& sets, int64_t captured, int64_t replayed) {
    INFO(name);
    const fs::path calls = tmp.path() / (name + "_calls"), graph = tmp.path() / (name + "_graph");
    REQUIRE(train(kCuda + sets + " --run-dir " + calls.string()).exit_code == 0);
    const CommandResult r = train(kCuda + sets + " --set run.cuda_graph=true --run-dir " + graph.string());
    REQUIRE(r.exit_code == 0);
    const auto a = metrics(calls), b = metrics(graph);
    REQUIRE(a.size() == 8);
    REQUIRE(b.size() == a.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO("step " << a[i]["step"]);
      CHECK(b[i]["loss"].get<double>() == a[i]["loss"].get<double>());
      CHECK(b[i]["grad_norm"].get<double>() == a[i]["grad_norm"].get<double>());
      CHECK(b[i].contains("val_loss") == a[i].contains("val_loss"));
      if (a[i].contains("val_loss")) CHECK(b[i]["val_loss"].get<double>() == a[i]["val_loss"].get<double>());
    }
    CHECK(slurp(graph / "checkpoints/step_00000008/model.safetensors") ==
          slurp(calls / "checkpoints/step_00000008/model.safetensors"));
    CHECK(slurp(graph / "checkpoints/step_00000008/optimizer.safetensors") ==
          slurp(calls / "checkpoints/step_00000008/optimizer.safetensors"));
    const auto summary = read_json(graph / "summary.json");
    CHECK(summary["captured_steps"] == captured);
    CHECK(summary["replayed_steps"] == replayed);
    CHECK_FALSE(read_json(calls / "summary.json").contains("replayed_steps"));
    return r.output;
  };
  (void)pair("f32", dense + " --set run.eval_every=0", 1, 6);
  // Evaluations after steps 3 and 6: issued at 1, 4, 7; captured at 2, 5, 8; replayed at 3, 6.
  (void)pair("evals", dense + " --set run.eval_every=3", 3, 2);
  (void)pair("bf16", dense + " --set run.dtype=bf16 --set run.eval_every=0", 1, 6);
  (void)pair("fp8", dense + " --set run.dtype=fp8 --set run.eval_every=0", 1, 6);
  const std::string packed = pair("packed",
                                  " --set data.synthetic_probes.length_median=24 --set data.synthetic_probes.min_length=8"
                                  " --set run.steps=8 --set run.eval_every=0",
                                  0, 0);
  CHECK(packed.find("no step was replayed") != std::string::npos);
}

TEST_CASE("run.cuda_graph is refused, exit 2 naming the key, where a step cannot be captured") {
  TempDir tmp;
  const struct {
    const char* sets;
    const char* key;
  } cases[] = {
      {" --set run.device=cpu --set attention.name=naive_cpu --set optimizer.name=adamw", "run.device"},
      {" --set optimizer.name=adamw8bit", "optimizer.name"},
      {" --set run.grad_accum_steps=2", "run.grad_accum_steps"},
      {" --set model.dropout=0.1", "model.dropout"},
      {" --set optimizer.shard_state=true", "optimizer.shard_state"},
      {" --set run.dtype=fp8 --set run.fp8_scaling=delayed", "run.fp8_scaling"},
  };
  int n = 0;
  for (const auto& c : cases) {
    INFO(c.sets);
    const fs::path dir = tmp.path() / std::to_string(n++);
    const CommandResult r = train(kCuda + c.sets + " --set run.cuda_graph=true --set run.steps=2 --run-dir " + dir.string());
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.key) != std::string::npos);
    CHECK(r.output.find("run.cuda_graph = true needs") != std::string::npos);
    CHECK_FALSE(fs::exists(dir / "metrics.jsonl"));
  }
}

TEST_CASE("a cuda run stopped and resumed gives the uninterrupted run's losses bit for bit (accumulation, dropout)") {
  TempDir tmp;
  const std::string common = kCuda + " --set run.steps=16 --set run.grad_accum_steps=2 --set model.dropout=0.1 --set run.eval_every=8";
  const fs::path full = tmp.path() / "full", parts = tmp.path() / "parts";
  REQUIRE(train(common + " --run-dir " + full.string()).exit_code == 0);
  REQUIRE(train(common + " --run-dir " + parts.string() + " --stop-at 6").exit_code == 0);
  REQUIRE(run_ablate("train " + config() + kTiny + common + " --resume " + parts.string()).exit_code == 0);
  const auto a = metrics(full), b = metrics(parts);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
    CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
  }
  CHECK(slurp(full / "checkpoints/step_00000016/model.safetensors") == slurp(parts / "checkpoints/step_00000016/model.safetensors"));
}

TEST_CASE("a cuda checkpoint resumes on the cpu, and a cpu checkpoint on cuda (the files are the same format)") {
  TempDir tmp;
  const std::string steps = " --set run.steps=16 --set run.eval_every=8";
  const fs::path gpu = tmp.path() / "gpu", g2c = tmp.path() / "g2c", c2g = tmp.path() / "c2g";
  REQUIRE(train(kCuda + steps + " --run-dir " + gpu.string()).exit_code == 0);
  REQUIRE(train(kCuda + steps + " --run-dir " + g2c.string() + " --stop-at 8").exit_code == 0);
  REQUIRE(train(kCpu + steps + " --resume " + g2c.string()).exit_code == 0);
  REQUIRE(train(kCpu + steps + " --run-dir " + c2g.string() + " --stop-at 8").exit_code == 0);
  REQUIRE(train(kCuda + steps + " --resume " + c2g.string()).exit_code == 0);
  const auto ref = metrics(gpu), a = metrics(g2c), b = metrics(c2g);
  REQUIRE(a.size() == ref.size());
  REQUIRE(b.size() == ref.size());
  for (std::size_t i = 0; i < 8; ++i) CHECK(a[i]["loss"].get<double>() == ref[i]["loss"].get<double>());
  for (std::size_t i = 8; i < ref.size(); ++i) {
    INFO("step " << ref[i]["step"]);
    // Continued on the other device: the tolerance of the cpu/cuda comparison above.
    CHECK(rel(a[i]["loss"].get<double>(), ref[i]["loss"].get<double>()) < 2e-3);
    CHECK(rel(b[i]["loss"].get<double>(), ref[i]["loss"].get<double>()) < 2e-3);
  }
}

TEST_CASE("a run whose memory plan exceeds the device is refused before training, exit 2, with both numbers") {
  TempDir tmp;
  // About 1.2e11 parameters: 450 GiB of fp32 weights alone.
  const auto r = run_ablate("train " + config() + kCuda +
                            " --set model.d_model=16384 --set model.n_layers=36 --set model.n_heads=128"
                            " --set run.steps=1 --run-dir " +
                            (tmp.path() / "big").string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("MiB") != std::string::npos);
  CHECK(!fs::exists(tmp.path() / "big" / "metrics.jsonl"));
}

TEST_CASE("a cuda run's peak memory counts the optimizer's state, which the optimizer allocates itself") {
  // adamw_fused keeps two f32 moments per parameter, adamw8bit about two bytes: the same model and
  // batches otherwise, so the two runs' peaks differ by the difference of their states.
  TempDir tmp;
  std::map<std::string, nlohmann::json> summary;
  for (const std::string opt : {"adamw_fused", "adamw8bit"}) {
    REQUIRE(train(kCuda + " --set optimizer.name=" + opt + " --set run.steps=1 --set run.eval_every=0 --run-dir " +
                  (tmp.path() / opt).string())
                .exit_code == 0);
    summary[opt] = read_json(tmp.path() / opt / "summary.json");
  }
  const int64_t peak_fused = summary["adamw_fused"]["mem_peak_bytes"], peak_8bit = summary["adamw8bit"]["mem_peak_bytes"];
  const int64_t state_fused = summary["adamw_fused"]["optimizer_state_bytes"];
  const int64_t state_8bit = summary["adamw8bit"]["optimizer_state_bytes"];
  INFO("peaks " << peak_fused << " and " << peak_8bit << ", states " << state_fused << " and " << state_8bit);
  REQUIRE(state_fused > state_8bit);
  CHECK(peak_fused >= state_fused);
  CHECK(peak_8bit >= state_8bit);
  // The emulated device allocates exactly what is asked (a GPU rounds allocations up to its pages):
  // the peaks differ by the states' difference less adamw8bit's larger bookkeeping beside its state
  // (its block table, 24 bytes a block of 256; the code maps' threshold tables, 2 x 260 floats, and
  // bucket tables, 2 x 1536 bytes; adamw_fused has only its decay runs): 12 KB here, under 16 KB.
  if (emulated()) {
    CHECK(peak_fused - peak_8bit <= state_fused - state_8bit);
    CHECK(peak_fused - peak_8bit >= state_fused - state_8bit - 16384);
  }
}

int main(int argc, char** argv) {
  if (!ablate::cuda::device_available()) {
    std::puts("no CUDA device: skipped");
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
