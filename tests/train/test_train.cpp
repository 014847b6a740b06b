// End to end through the `ablate` program: a small model trains and its loss falls; a run stopped
// and resumed gives the uninterrupted run's losses bit for bit; checkpoints that do not match are
// refused (exit 2) and nothing already saved is lost; eval, sample and export work on the result.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "run_files.hpp"
#include "test_support.hpp"

using namespace ablate::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// A tiny quickstart: trains in a second or two.
const std::string kTiny = " --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.max_seq_len=64"
                          " --set batching.batch_size=4 --set batching.seq_len=64 --set run.threads=2 --set run.eval_batches=2"
                          " --set data.synthetic_probes.documents=2000 --set data.synthetic_probes.validation_documents=50";

std::string config() { return std::string(ABLATE_SOURCE_DIR) + "/configs/quickstart.toml"; }

}  // namespace

TEST_CASE("a small model trains: the loss falls, the run directory holds config, metrics, summary, checkpoints") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const auto r = run_ablate("train " + config() + kTiny +
                            " --set run.steps=40 --set run.eval_every=20 --set checkpoint.every=20 --run-dir " + run.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  for (const char* f : {"config.toml", "run.json", "metrics.jsonl", "summary.json", "checkpoints/latest"}) CHECK(fs::exists(run / f));
  CHECK(fs::exists(run / "checkpoints/step_00000020/model.safetensors"));
  CHECK(fs::exists(run / "checkpoints/step_00000040/optimizer.safetensors"));
  const auto m = metrics(run);
  REQUIRE(m.size() == 40);
  for (const char* key :
       {"step", "loss", "lr", "grad_norm", "step_ms", "tokens", "real_tokens", "padding_fraction", "tokens_per_s", "real_tokens_per_s",
        "tflops", "mfu", "effective_mfu", "data_wait_pct", "mem_peak_bytes", "optimizer_state_bytes"}) {
    CHECK_MESSAGE(m.back().contains(key), key);
  }
  CHECK(m[19].contains("val_loss"));
  CHECK(m.back()["tokens"].get<int64_t>() == 4 * 64);
  CHECK(m.back()["optimizer_state_bytes"].get<int64_t>() == 8 * read_json(run / "run.json")["parameters"].get<int64_t>());
  const double first = m.front()["loss"], last = m.back()["loss"];
  CHECK(first == doctest::Approx(std::log(80.0)).epsilon(0.1));  // uniform over the vocabulary at the start
  CHECK(last < first - 1.0);
  const json s = read_json(run / "summary.json");
  CHECK(s["status"] == "completed");
  CHECK(s["final_loss"].get<double>() == doctest::Approx(last));
  CHECK(s["val_loss"].get<double>() < first);

  // A second train into the same directory without --resume would overwrite it: refused.
  const auto again = run_ablate("train " + config() + kTiny + " --set run.steps=40 --run-dir " + run.string());
  CHECK(again.exit_code == 2);
  CHECK(again.output.find("--resume") != std::string::npos);

  // Sample from it.
  const auto smp = run_ablate("sample --checkpoint " + run.string() + " --prompt \"#h3 \" --tokens 30 --seed 1");
  INFO(smp.output);
  CHECK(smp.exit_code == 0);
  CHECK(smp.output.find("#h3 ") != std::string::npos);
  const auto bad = run_ablate("sample --checkpoint " + run.string() + " --prompt \"hello\"");
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("alphabet") != std::string::npos);
}

TEST_CASE("stop and resume gives the uninterrupted run's losses bit for bit (fixed threads, with accumulation and dropout)") {
  TempDir tmp;
  const std::string common = "train " + config() + kTiny +
                             " --set run.steps=24 --set run.grad_accum_steps=2 --set model.dropout=0.1 --set run.eval_every=8"
                             " --set checkpoint.every=100";
  const fs::path full = tmp.path() / "full", parts = tmp.path() / "parts";
  REQUIRE(run_ablate(common + " --run-dir " + full.string()).exit_code == 0);
  const auto stop = run_ablate(common + " --run-dir " + parts.string() + " --stop-at 10");
  INFO(stop.output);
  REQUIRE(stop.exit_code == 0);
  CHECK(read_json(parts / "summary.json")["status"] == "stopped");
  CHECK(slurp(parts / "checkpoints/latest") == "step_00000010\n");
  const auto resumed = run_ablate(common + " --resume " + parts.string());
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const auto a = metrics(full), b = metrics(parts);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(a[i]["step"] == b[i]["step"]);
    CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());  // bit for bit
    CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
    if (a[i].contains("val_loss")) CHECK(a[i]["val_loss"].get<double>() == b[i]["val_loss"].get<double>());
  }
  // The final parameters are the same bytes.
  CHECK(slurp(full / "checkpoints/step_00000024/model.safetensors") == slurp(parts / "checkpoints/step_00000024/model.safetensors"));
}

TEST_CASE("a checkpoint that does not match the config, or is truncated, is refused with exit 2 and nothing is lost") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  REQUIRE(run_ablate("train " + config() + kTiny + " --set run.steps=6 --run-dir " + run.string() + " --stop-at 3").exit_code == 0);
  const std::string before = slurp(run / "checkpoints/step_00000003/model.safetensors");

  const auto other = run_ablate("train " + config() + kTiny + " --set run.steps=6 --set model.d_model=48 --resume " + run.string());
  INFO(other.output);
  CHECK(other.exit_code == 2);
  CHECK(other.output.find("does not match") != std::string::npos);

  const auto opt = run_ablate("train " + config() + kTiny +
                              " --set run.steps=6 --set optimizer.name=adamw --set model.n_layers=3 --resume " + run.string());
  CHECK(opt.exit_code == 2);

  const auto none = run_ablate("train " + config() + kTiny + " --resume " + (tmp.path() / "nothing").string());
  CHECK(none.exit_code == 2);

  // Truncate the parameters: refused by name, and the checkpoint is not rewritten.
  const fs::path model = run / "checkpoints/step_00000003/model.safetensors";
  fs::resize_file(model, fs::file_size(model) / 2);
  const auto trunc = run_ablate("train " + config() + kTiny + " --set run.steps=6 --resume " + run.string());
  INFO(trunc.output);
  CHECK(trunc.exit_code == 2);
  CHECK(trunc.output.find("model.safetensors") != std::string::npos);
  CHECK(fs::file_size(model) == before.size() / 2);
  CHECK(fs::exists(run / "checkpoints/step_00000003/optimizer.safetensors"));
}

TEST_CASE("a run whose memory plan exceeds the budget is refused before training, with both numbers") {
  TempDir dir;
  const fs::path run = dir.path() / "run";
  // The quickstart model: ~3.3 MiB of parameters, as much of gradients, twice that of AdamW state,
  // and activations for 64 rows of 256 positions far beyond 8 MiB.
  const auto r = run_ablate("train " + config() +
                            " --set run.steps=2 --set batching.batch_size=64"
                            " --set run.memory_budget_gib=0.0078125 --run-dir " +
                            run.string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("batching.batch_size") != std::string::npos);
  CHECK(r.output.find("needs") != std::string::npos);
  CHECK(r.output.find("8.0 MiB (run.memory_budget_gib)") != std::string::npos);
  CHECK_FALSE(fs::exists(run / "summary.json"));
  // The same run fits a budget of a gigabyte.
  const auto ok = run_ablate("train " + config() + kTiny + " --set run.steps=1 --set run.memory_budget_gib=1 --run-dir " +
                             (dir.path() / "fits").string());
  INFO(ok.output);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("eval: mean next-token loss over windows of an llm.c shard") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  REQUIRE(run_ablate("train " + config() + kTiny + " --set run.steps=5 --run-dir " + run.string()).exit_code == 0);
  // A shard of 1000 tokens below the vocabulary of 80.
  const fs::path shard = tmp.path() / "val.bin";
  {
    std::ofstream out(shard, std::ios::binary);
    int32_t header[256] = {20240520, 1, 1000};
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    for (int i = 0; i < 1000; ++i) {
      const uint16_t t = uint16_t((i * 7) % 80);
      out.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  const auto r = run_ablate("eval --checkpoint " + run.string() + " --tokens " + shard.string() + " --seq-len 32 --json");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const json j = json::parse(r.output.substr(r.output.find('{')));
  CHECK(j["tokens"].get<int64_t>() == (1000 / 33) * 32);
  CHECK(j["loss"].get<double>() > 0.5);
  CHECK(j["loss"].get<double>() < 20.0);
  // A window longer than the model's positions, and a file that is not a shard, are input errors.
  CHECK(run_ablate("eval --checkpoint " + run.string() + " --tokens " + shard.string() + " --seq-len 65").exit_code == 2);
  CHECK(run_ablate("eval --checkpoint " + run.string() + " --tokens " + (run / "config.toml").string()).exit_code == 2);
  // A header that promises 2^31-1 tokens in a 2 KB file, one with a negative count, trailing bytes,
  // and a directory: refused by size before any buffer is made (exit 2, naming the file).
  const auto shard_with = [&](const char* name, int32_t count, int extra_bytes) {
    const fs::path p = tmp.path() / name;
    std::ofstream out(p, std::ios::binary);
    int32_t header[256] = {20240520, 1, count};
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    const std::string body(std::size_t(2000 + extra_bytes), '\0');
    out.write(body.data(), std::streamsize(body.size()));
    return p;
  };
  for (const fs::path& bad :
       {shard_with("huge.bin", 2147483647, 0), shard_with("neg.bin", -5, 0), shard_with("tail.bin", 1000, 3), tmp.path()}) {
    const auto e = run_ablate("eval --checkpoint " + run.string() + " --tokens " + bad.string());
    INFO(e.output);
    CHECK(e.exit_code == 2);
    CHECK(e.output.find(bad.string()) != std::string::npos);
  }
}

TEST_CASE("run.device = cuda where no GPU is visible exits 2 naming run.device, before anything is written") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  // CUDA_VISIBLE_DEVICES="" hides every GPU, so this holds on a GPU machine too. The device is
  // resolved before the attention and optimizer that must serve it, so the quickstart's CPU
  // choices do not come first; and a build or machine without the CUDA plugins says the same.
  const auto r = run_ablate("train " + config() + kTiny + " --set run.device=cuda --run-dir " + run.string(), "CUDA_VISIBLE_DEVICES=");
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("run.device") != std::string::npos);
  CHECK(!fs::exists(run / "metrics.jsonl"));
  // The same with the nccl communicator, which is made before the model: the device comes first.
  const auto n =
      run_ablate("train " + config() + kTiny + " --set run.device=cuda --set run.communicator=nccl --run-dir " + run.string(),
                 "CUDA_VISIBLE_DEVICES=");
  INFO(n.output);
  CHECK(n.exit_code == 2);
  // (A build without the CUDA plugins has no nccl to name: it refuses run.communicator instead.)
  CHECK((n.output.find("run.device") != std::string::npos || n.output.find("run.communicator") != std::string::npos));
}

TEST_CASE("run.dtype = bf16, tf32 and fp8 on the cpu (tensor-core modes) are refused with exit 2") {
  TempDir tmp;
  // Rather than trained in fp32 and reported against a bf16 or tf32 peak.
  for (const char* dtype : {"bf16", "tf32", "fp8", "fp8_e4m3"}) {
    const auto r =
        run_ablate("train " + config() + kTiny + " --set run.dtype=" + dtype + " --run-dir " + (tmp.path() / dtype).string());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("run.dtype") != std::string::npos);
    CHECK(r.output.find("needs run.device = \"cuda\"") != std::string::npos);
    if (std::string(dtype).starts_with("fp8")) CHECK(r.output.find("FP8 products") != std::string::npos);  // the capability named
    CHECK(!fs::exists(tmp.path() / dtype / "metrics.jsonl"));
  }
}

TEST_CASE("[model.cross_entropy] fp8 = true outside an FP8 run.dtype is refused with exit 2, naming the key") {
  TempDir tmp;
  // A key that would silently do nothing: refused before training, on every device.
  const auto r =
      run_ablate("train " + config() + kTiny + " --set model.cross_entropy.fp8=true --run-dir " + (tmp.path() / "r").string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("model.cross_entropy.fp8") != std::string::npos);
  CHECK(r.output.find("run.dtype = \"fp8\"") != std::string::npos);
  CHECK(!fs::exists(tmp.path() / "r" / "metrics.jsonl"));
  // fp8 = false is the default, and accepted anywhere.
  const auto ok = run_ablate("train " + config() + kTiny + " --set model.cross_entropy.fp8=false --set run.steps=1 --run-dir " +
                             (tmp.path() / "ok").string());
  CHECK(ok.exit_code == 0);
}

// chunk_rows on the cpu: the same losses in chunks of 7 rows as in the default 256 (each row's loss
// is its own; the gradients sum the same terms), within f32's rounding; a negative value is refused
// as the config is read.
TEST_CASE("[model.cross_entropy] chunk_rows: a run in chunks of 7 rows trains as the default's; -1 is exit 2") {
  TempDir tmp;
  const std::string steps = " --set run.steps=3 --run-dir ";
  const auto base = run_ablate("train " + config() + kTiny + steps + (tmp.path() / "base").string());
  const auto small =
      run_ablate("train " + config() + kTiny + " --set model.cross_entropy.chunk_rows=7" + steps + (tmp.path() / "small").string());
  REQUIRE(base.exit_code == 0);
  REQUIRE(small.exit_code == 0);
  const auto a = metrics(tmp.path() / "base"), b = metrics(tmp.path() / "small");
  REQUIRE(a.size() == 3);
  REQUIRE(b.size() == 3);
  // f32 sums of 32 products whose order OpenBLAS picks by the chunk's shape: ~32 x 2^-24 relative
  for (std::size_t i = 0; i < a.size(); ++i)
    CHECK(b[i]["loss"].get<double>() == doctest::Approx(a[i]["loss"].get<double>()).epsilon(1e-5));
  const auto bad =
      run_ablate("train " + config() + kTiny + " --set model.cross_entropy.chunk_rows=-1 --run-dir " + (tmp.path() / "bad").string());
  INFO(bad.output);
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("model.cross_entropy.chunk_rows") != std::string::npos);
}

TEST_CASE("run.residual_dtype = bf16 without bf16 products is refused with exit 2, naming the key and what it needs") {
  TempDir tmp;
  // fp32 products on the cpu: there is no bf16 plan for the stream to join, so the key would do nothing.
  const auto r = run_ablate("train " + config() + kTiny + " --set run.residual_dtype=bf16 --run-dir " + (tmp.path() / "r").string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("run.residual_dtype") != std::string::npos);
  CHECK(r.output.find("run.dtype must be \"bf16\"") != std::string::npos);
  CHECK(!fs::exists(tmp.path() / "r" / "metrics.jsonl"));
  // Any other value is refused as the config is read.
  const auto bad =
      run_ablate("train " + config() + kTiny + " --set run.residual_dtype=fp16 --run-dir " + (tmp.path() / "bad").string());
  INFO(bad.output);
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("residual_dtype") != std::string::npos);
  // fp32, the default, is accepted anywhere.
  const auto ok = run_ablate("train " + config() + kTiny + " --set run.residual_dtype=fp32 --set run.steps=1 --run-dir " +
                             (tmp.path() / "ok").string());
  CHECK(ok.exit_code == 0);
}

TEST_CASE("run.profile_steps times every op of the last steps: profile.json holds each op, and they add up to the step") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const auto r = run_ablate("train " + config() + kTiny +
                            " --set run.steps=6 --set run.profile_steps=2 --set checkpoint.every=100 --run-dir " + run.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("op profile over the last 2 step(s)") != std::string::npos);
  const json p = read_json(run / "profile.json");
  CHECK(p["steps"] == 2);
  std::map<std::string, double> ms;
  double sum = 0;
  for (const json& op : p["ops"]) {
    ms[op["op"].get<std::string>()] = op["ms_per_step"].get<double>();
    sum += op["ms_per_step"].get<double>();
  }
  for (const char* op :
       {"embedding fwd", "position fwd", "norm fwd", "linear fwd", "attention fwd", "mlp fwd", "classifier", "mlp bwd",
        "attention bwd", "linear bwd", "norm bwd", "embedding bwd", "gradient norm", "optimizer", "batch upload"}) {
    CHECK_MESSAGE(ms.count(op) == 1, op);
  }
  // The ops are timed one after another inside the step: their sum cannot exceed it, and the
  // untimed rest (the data hand-over, the loop) is small beside the model's work.
  const double step_ms = p["step_ms"].get<double>();
  CHECK(sum <= step_ms * 1.001);
  CHECK(sum + p["untimed_ms_per_step"].get<double>() == doctest::Approx(step_ms).epsilon(1e-6));
  // Calls per step: each of the 2 blocks runs its mlp once forward.
  for (const json& op : p["ops"]) {
    if (op["op"] == "mlp fwd") CHECK(op["calls_per_step"].get<double>() == 2.0);
  }
}

TEST_CASE("one run per directory: a second train on a directory in use is refused with the holder's pid, and the first is unharmed") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const std::string train =
      std::string(ABLATE_BINARY) + " train " + config() + kTiny + " --set checkpoint.every=1000 --run-dir " + run.string();
  // The first run holds the directory while the second starts; then both exit codes are printed.
  const auto r = run_command("(" + train + " --set run.steps=400 > " + (tmp.path() / "first.log").string() +
                             " 2>&1 & first=$!; for i in $(seq 200); do [ -s " + (run / ".lock").string() +
                             " ] && break; sleep 0.05; done; " + train +
                             " --set run.steps=5; echo \"second=$?\"; wait $first; "
                             "echo \"first=$?\"; echo \"holder=$first\")");
  INFO(r.output);
  CHECK(r.output.find("second=2") != std::string::npos);
  CHECK(r.output.find("first=0") != std::string::npos);
  CHECK(r.output.find("in use by another ablate process (pid ") != std::string::npos);
  const std::string holder = r.output.substr(r.output.find("holder=") + 7);
  CHECK(r.output.find("(pid " + holder.substr(0, holder.find('\n'))) != std::string::npos);
  CHECK(metrics(run).size() == 400);  // the first run's records are its own, whole
  CHECK(read_json(run / "summary.json")["steps"] == 400);
}

TEST_CASE("--resume of a finished run is refused with exit 2 and its summary stays as it was") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const std::string common = "train " + config() + kTiny + " --set run.steps=6 --set checkpoint.every=3";
  REQUIRE(run_ablate(common + " --run-dir " + run.string()).exit_code == 0);
  const std::string before = slurp(run / "summary.json");
  const auto r = run_ablate(common + " --resume " + run.string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("finished at step 6") != std::string::npos);
  CHECK(slurp(run / "summary.json") == before);
  // Raising run.steps continues it.
  const auto more = run_ablate("train " + config() + kTiny + " --set run.steps=9 --set checkpoint.every=3 --resume " + run.string());
  INFO(more.output);
  CHECK(more.exit_code == 0);
  CHECK(read_json(run / "summary.json")["steps"] == 9);
}

TEST_CASE("a checkpoint resumes with another optimizer only when it takes every state tensor (adamw8bit refuses adamw's)") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const std::string common = "train " + config() + kTiny + " --set run.steps=6 --set checkpoint.every=3";
  REQUIRE(run_ablate(common + " --run-dir " + run.string() + " --stop-at 3").exit_code == 0);
  const auto r = run_ablate(common + " --set optimizer.name=adamw8bit --resume " + run.string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("written by optimizer 'adamw', the config selects 'adamw8bit', whose state differs") != std::string::npos);
  CHECK(!fs::exists(run / "checkpoints/step_00000006"));
  // The same optimizer continues it.
  const auto same = run_ablate(common + " --resume " + run.string());
  INFO(same.output);
  CHECK(same.exit_code == 0);
}

TEST_CASE(
    "a state.json with wrong types, impossible values or an optimizer file outside the checkpoint is refused naming it (exit 2)") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  REQUIRE(run_ablate("train " + config() + kTiny + " --set run.steps=4 --run-dir " + run.string() + " --stop-at 2").exit_code == 0);
  const fs::path state = run / "checkpoints/step_00000002/state.json";
  const json good = read_json(state);
  const auto refused = [&](const json& bad, const std::string& words) {
    std::ofstream(state) << bad.dump();
    const auto r = run_ablate("train " + config() + kTiny + " --set run.steps=4 --resume " + run.string());
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("state.json") != std::string::npos);
    CHECK(r.output.find(words) != std::string::npos);
  };
  json typed = good;
  typed["step"] = "two";
  refused(typed, "not a valid checkpoint state");
  json negative = good;
  negative["step"] = -5;
  refused(negative, "'step' is -5");
  json escape = good;
  escape["optimizer_files"] = json::array({"../../elsewhere.safetensors"});
  refused(escape, "not a plain file name");
  std::ofstream(state) << good.dump();  // and restored, it resumes
  CHECK(run_ablate("train " + config() + kTiny + " --set run.steps=4 --resume " + run.string()).exit_code == 0);
}

TEST_CASE("retention keeps the newest checkpoints by step, never the one latest names, and leaves an abandoned later one alone") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const fs::path ck = run / "checkpoints";
  const std::string base = "train " + config() + kTiny + " --set checkpoint.every=2";
  REQUIRE(run_ablate(base + " --set run.steps=4 --set checkpoint.keep=5 --run-dir " + run.string()).exit_code == 0);
  REQUIRE(fs::exists(ck / "step_00000002"));
  REQUIRE(fs::exists(ck / "step_00000004"));
  // A complete checkpoint after the one `latest` names: left by a longer run that was abandoned
  // (or killed between writing step 10 and naming it latest). By name it is the newest.
  fs::copy(ck / "step_00000004", ck / "step_00000010", fs::copy_options::recursive);
  const auto r = run_ablate(base + " --set run.steps=6 --set checkpoint.keep=1 --resume " + run.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(slurp(ck / "latest") == "step_00000006\n");
  CHECK(fs::exists(ck / "step_00000006" / "model.safetensors"));  // sorting by name would delete it
  CHECK_FALSE(fs::exists(ck / "step_00000002"));
  CHECK_FALSE(fs::exists(ck / "step_00000004"));
  CHECK(fs::exists(ck / "step_00000010" / "model.safetensors"));  // data, not clutter
}

TEST_CASE("sample on token shards prints prompt and continuation as separate ids, or as text through the shards' tokenizer") {
  TempDir tmp;
  const fs::path shard = tmp.path() / "data" / "train.bin";
  fs::create_directories(shard.parent_path());
  {
    std::ofstream out(shard, std::ios::binary);
    int32_t header[256] = {20240520, 1, 4000};
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    for (int i = 0; i < 4000; ++i) {
      const uint16_t t = uint16_t(i % 40 == 39 ? 0 : 1 + (i * 7) % 60);  // documents of 39 tokens, eot 0
      out.write(reinterpret_cast<const char*>(&t), 2);
    }
  }
  const fs::path run = tmp.path() / "run";
  const std::string data = " --set data.name=token_shards --set 'data.token_shards.paths=[\"" + shard.string() +
                           "\"]' --set data.token_shards.eot=0 --set data.token_shards.vocab_size=64 --set model.vocab_size=64";
  const auto r =
      run_ablate("train " + config() + kTiny + data + " --set run.steps=3 --set run.eval_every=0 --run-dir " + run.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const auto s = run_ablate("sample --checkpoint " + run.string() + " --prompt \"13 21\" --tokens 5 --seed 3 --stop-at-eot false");
  INFO(s.output);
  REQUIRE(s.exit_code == 0);
  // The last line: seven ids below 64, the prompt's two first, each separated.
  const std::string text = s.output.substr(s.output.rfind('\n', s.output.size() - 2) + 1);
  std::istringstream ids(text);
  std::vector<int> got;
  for (int id; ids >> id;) got.push_back(id);
  REQUIRE(got.size() == 7);
  CHECK(got[0] == 13);
  CHECK(got[1] == 21);
  for (int id : got) CHECK(id < 64);
  // With GPT-2-style tokenizer files beside the shard, the same ids decode to text.
  fs::create_directories(shard.parent_path() / "tokenizer");
  {
    json enc = json::object();
    for (int i = 0; i < 64; ++i) enc["t" + std::to_string(i) + "\xC4\xA0"] = i;  // "t<i>" then GPT-2's space (U+0120)
    std::ofstream(shard.parent_path() / "tokenizer" / "encoder.json") << enc.dump();
  }
  const auto d = run_ablate("sample --checkpoint " + run.string() + " --prompt \"13 21\" --tokens 5 --seed 3 --stop-at-eot false");
  INFO(d.output);
  REQUIRE(d.exit_code == 0);
  std::string expect;
  for (int id : got) expect += "t" + std::to_string(id) + " ";
  CHECK(d.output.find(expect) != std::string::npos);
}

// A shard of `count` tokens below `vocab`: documents of 39 tokens ending in `eot`.
static void write_token_shard(const fs::path& path, int count, int vocab, int eot) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  int32_t header[256] = {20240520, 1, count};
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  for (int i = 0; i < count; ++i) {
    const uint16_t t = uint16_t(i % 40 == 39 ? eot : (i * 7) % vocab == eot ? 1 : (i * 7) % vocab);
    out.write(reinterpret_cast<const char*>(&t), 2);
  }
}

TEST_CASE("export writes the shards' GPT-2 tokenizer beside the weights, and refuses (exit 2) rather than leave it out") {
  // A byte-level tokenizer: every byte its own id (GPT-2's printable spelling), the merge "a b" ->
  // 256, <|endoftext|> 257.
  TempDir tmp;
  const fs::path shard = tmp.path() / "data" / "train.bin";
  write_token_shard(shard, 4000, 258, 257);
  const fs::path tok = shard.parent_path() / "tokenizer";
  fs::create_directories(tok);
  json enc = json::object();
  for (int b = 0; b < 256; ++b) enc[ablate::test::gpt2_spelling(std::string(1, char(b)))] = b;
  enc["ab"] = 256;
  enc["<|endoftext|>"] = 257;
  std::ofstream(tok / "encoder.json") << enc.dump();
  const fs::path run = tmp.path() / "run";
  const std::string data = " --set data.name=token_shards --set 'data.token_shards.paths=[\"" + shard.string() +
                           "\"]' --set data.token_shards.eot=257 --set data.token_shards.vocab_size=258";
  const auto r =
      run_ablate("train " + config() + kTiny + data + " --set run.steps=2 --set run.eval_every=0 --run-dir " + run.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // Without the merges the tokenizer cannot be exported: refused, nothing written, unless
  // --no-tokenizer asks for the weights alone.
  const fs::path hf = tmp.path() / "hf";
  const auto no_merges = run_ablate("export --checkpoint " + run.string() + " --out " + hf.string());
  INFO(no_merges.output);
  REQUIRE(no_merges.exit_code == 2);
  CHECK(no_merges.output.find("no encoder.json and vocab.bpe") != std::string::npos);
  CHECK(no_merges.output.find("--no-tokenizer") != std::string::npos);
  CHECK_FALSE(fs::exists(hf));
  const auto weights = run_ablate("export --checkpoint " + run.string() + " --out " + hf.string() + " --no-tokenizer");
  INFO(weights.output);
  REQUIRE(weights.exit_code == 0);
  CHECK(fs::exists(hf / "model.safetensors"));
  CHECK_FALSE(fs::exists(hf / "vocab.json"));
  // With the merges: config.json's bos/eos are the eot, and the tokenizer goes beside the weights
  // (Hugging Face's GPT2Tokenizer reads vocab.json and merges.txt).
  std::ofstream(tok / "vocab.bpe") << "#version: 0.2\na b\n";
  const auto e = run_ablate("export --checkpoint " + run.string() + " --out " + hf.string());
  INFO(e.output);
  REQUIRE(e.exit_code == 0);
  const json cfg = read_json(hf / "config.json");
  CHECK(cfg["bos_token_id"] == 257);
  CHECK(cfg["eos_token_id"] == 257);
  CHECK(slurp(hf / "vocab.json") == slurp(tok / "encoder.json"));
  CHECK(slurp(hf / "merges.txt") == "#version: 0.2\na b\n");
  const json tc = read_json(hf / "tokenizer_config.json");
  CHECK(tc["tokenizer_class"] == "GPT2Tokenizer");
  CHECK(tc["eos_token"] == "<|endoftext|>");
  CHECK(tc["model_max_length"] == 64);
  // A merges file cut short is refused, naming it, before anything is written.
  std::ofstream(tok / "vocab.bpe") << "#version: 0.2\n";
  const auto cut = run_ablate("export --checkpoint " + run.string() + " --out " + (tmp.path() / "hf2").string());
  CHECK(cut.exit_code == 2);
  CHECK(cut.output.find("vocab.bpe") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path() / "hf2"));
}

TEST_CASE("an MFU above 100% is warned about once, naming the peak used, and flagged in summary.json") {
  TempDir tmp;
  const std::string common = "train " + config() + kTiny + " --set run.steps=4 --set run.eval_every=0";
  const auto low = run_ablate(common + " --set metrics.peak_tflops=1e-9 --run-dir " + (tmp.path() / "low").string());
  INFO(low.output);
  REQUIRE(low.exit_code == 0);
  CHECK(low.output.find("exceeds 100% of the peak it is measured against (0.000 TFLOP/s per rank, configured)") != std::string::npos);
  CHECK(low.output.find("exceeds 100%") == low.output.rfind("exceeds 100%"));  // once
  const json s = read_json(tmp.path() / "low" / "summary.json");
  CHECK(s["mfu_above_peak"] == true);
  CHECK(s["peak_source"] == "configured");
  // The measured CPU peak: a real MFU, below 1.
  const auto measured = run_ablate(common + " --run-dir " + (tmp.path() / "measured").string());
  REQUIRE(measured.exit_code == 0);
  const json m = read_json(tmp.path() / "measured" / "summary.json");
  CHECK(m["peak_source"] == "measured");
  CHECK(m["mfu_above_peak"] == false);
  CHECK(m["mfu"].get<double>() < 1.0);
}

TEST_CASE("run.recompute = mlp and block give the same losses, gradients and weights bit for bit, in less activation memory") {
  TempDir tmp;
  // Dropout on (its masks must be drawn again identically), accumulation, and a Llama-shaped model
  // too (rope rotating q and k in place, qk-norm, GQA).
  const std::string common =
      "train " + config() + kTiny + " --set run.steps=5 --set run.grad_accum_steps=2 --set model.dropout=0.1 --set run.eval_every=5";
  const std::string llama = " --set model.n_heads=4 --set model.n_kv_heads=2 --set model.norm=rmsnorm --set model.mlp=swiglu_mlp"
                            " --set model.position=rope --set model.qk_norm=true --set model.bias=false";
  for (const std::string& shape : {std::string(), llama}) {
    INFO((shape.empty() ? "gpt2-shaped" : "llama-shaped"));
    std::map<std::string, fs::path> runs;
    for (const char* mode : {"none", "mlp", "block"}) {
      runs[mode] = tmp.path() / (std::string(mode) + (shape.empty() ? "_gpt2" : "_llama"));
      const auto r = run_ablate(common + shape + " --set run.recompute=" + mode + " --run-dir " + runs[mode].string());
      INFO(r.output);
      REQUIRE(r.exit_code == 0);
    }
    const auto ref = metrics(runs["none"]);
    const auto bytes = [&](const char* mode) { return read_json(runs[mode] / "run.json")["activation_bytes"].get<int64_t>(); };
    for (const char* mode : {"mlp", "block"}) {
      INFO(mode);
      const auto got = metrics(runs[mode]);
      REQUIRE(got.size() == ref.size());
      for (std::size_t i = 0; i < ref.size(); ++i) {
        CHECK(got[i]["loss"].get<double>() == ref[i]["loss"].get<double>());
        CHECK(got[i]["grad_norm"].get<double>() == ref[i]["grad_norm"].get<double>());
        if (ref[i].contains("val_loss")) CHECK(got[i]["val_loss"].get<double>() == ref[i]["val_loss"].get<double>());
      }
      CHECK(slurp(runs[mode] / "checkpoints/step_00000005/model.safetensors") ==
            slurp(runs["none"] / "checkpoints/step_00000005/model.safetensors"));
    }
    CHECK(bytes("mlp") < bytes("none"));
    CHECK(bytes("block") < bytes("mlp"));
    // By dtype: an f32 run holds no bf16, and the three parts add up to activation_bytes.
    const auto info = read_json(runs["none"] / "run.json");
    const auto& by = info["activation_bytes_by_dtype"];
    CHECK(by["bf16"].get<int64_t>() == 0);
    CHECK(by["f32"].get<int64_t>() > 0);
    CHECK(by["f32"].get<int64_t>() + by["bf16"].get<int64_t>() + by["workspace"].get<int64_t>() == bytes("none"));
  }
  // A value outside the three is refused naming the key.
  const auto bad = run_ablate(common + " --set run.recompute=all --run-dir " + (tmp.path() / "bad").string());
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("run.recompute") != std::string::npos);
}
