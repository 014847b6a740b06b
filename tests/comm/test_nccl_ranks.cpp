// Data-parallel training on cuda over `nccl` at 2, 3 and 4 ranks, without GPUs: `ablate train`
// under mpiexec on the emulated CUDA device (ABLATE_EMULATE_CUDA=1), whose NCCL is the emulation
// in tests/cuda_emulation/nccl_emu.cpp. Each rank is a process with its own emulated device.
//
// What is checked, against an independent run each time:
// - N ranks give the losses of one process with N micro-batches of accumulation (the same global
//   batch), plain and ZeRO-1, with gradient buckets small enough to be many, and with accumulation
//   on each rank; the sums differ only in order, so the tolerances are test_data_parallel.cpp's;
// - dropout: each rank's masks are the cpu run's (2 ranks over nccl on cuda against 2 ranks over
//   mpi on the cpu, within test_cuda_train.cpp's cuda-against-cpu tolerance);
// - the buckets are issued during the backward pass, from the last parameters to the first, each
//   once per step, contiguous (the emulated NCCL's log of what each stream reached, with the count
//   of kernels launched by then);
// - a rank killed inside a collective, or one that stops answering, ends the job: every other rank
//   fails within [run.nccl] timeout_s, naming the collective;
// - a 2-rank run stopped and resumed gives the uninterrupted run's losses bit for bit;
// - FP8 delayed scaling on 2 ranks: every rank holds the same scales, so a stopped run resumes bit
//   for bit (the checkpoint holds rank 0's).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data_parallel_support.hpp"
#include "run_files.hpp"
#include "test_support.hpp"

using namespace ablate::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// data_parallel_support.hpp's bounds: the micro-batches here hold 2*32 = 64 positions, so the
// gradient norm's bound has a margin of 4.
constexpr double kLossTolerance = kDpLossTolerance;
constexpr double kGradNormRelTolerance = kDpGradNormRelTolerance;

const std::string kEnv = "ABLATE_EMULATE_CUDA=1 " + kMpiTestEnv;

// A tiny GPT-2 on cuda: one document per row (padded, truncated), so N ranks' global batch is one
// process's N micro-batches.
std::string config(const std::string& device = "cuda") {
  const std::string on = device == "cuda" ? " --set run.device=cuda --set attention.name=naive_cuda --set optimizer.name=adamw_fused"
                                          : " --set run.device=cpu --set attention.name=naive_cpu --set optimizer.name=adamw";
  return std::string(ABLATE_SOURCE_DIR) + "/configs/quickstart.toml" +
         " --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.max_seq_len=64"
         " --set batching.name=padded --set batching.long_documents=truncate --set batching.batch_size=2"
         " --set batching.seq_len=32 --set run.eval_every=0 --set run.steps=5 --set run.threads=1"
         " --set data.synthetic_probes.documents=2000 --set data.synthetic_probes.validation_documents=50"
         " --set logging.sinks=[\\\"jsonl\\\"]" +
         on;
}

CommandResult one_process(const std::string& args) { return run_ablate("train " + config() + " " + args, "ABLATE_EMULATE_CUDA=1"); }

// `env` comes last, so it may set TMPDIR (where the emulated NCCL's ranks meet) to a test's directory.
CommandResult n_ranks(int n, const std::string& args, const std::string& env = "") {
  return run_command(kEnv + " TMPDIR=" + fs::temp_directory_path().string() + " " + env + " " + ABLATE_MPIEXEC_BIN + " " +
                     ABLATE_MPIEXEC_FLAGS + " " + ABLATE_MPIEXEC_NP + " " + std::to_string(n) + " " + ABLATE_BINARY + " train " +
                     args + " 2>&1");
}

void require_same_losses(const fs::path& a, const fs::path& b) {
  const auto ma = metrics(a), mb = metrics(b);
  REQUIRE(ma.size() == 5);
  REQUIRE(mb.size() == ma.size());
  for (std::size_t i = 0; i < ma.size(); ++i) {
    INFO("step " << ma[i]["step"]);
    CHECK(ma[i]["tokens"] == mb[i]["tokens"]);
    CHECK(std::abs(ma[i]["loss"].get<double>() - mb[i]["loss"].get<double>()) <= kLossTolerance);
    CHECK(std::abs(ma[i]["grad_norm"].get<double>() - mb[i]["grad_norm"].get<double>()) <=
          kGradNormRelTolerance * ma[i]["grad_norm"].get<double>());
  }
}

struct Arrival {
  uint64_t seq;
  std::string kind, type;
  uint64_t count;
  uint64_t address;
  uint64_t launches;
};

std::vector<Arrival> read_log(const fs::path& p) {
  std::ifstream in(p);
  std::vector<Arrival> out;
  Arrival a;
  std::string op;
  int root;
  while (in >> a.seq >> a.kind >> a.type >> a.count >> op >> root >> a.address >> a.launches) out.push_back(a);
  return out;
}

// A 2-rank run of `common` (6 steps) stopped at step 3 and resumed, in dir/parts, against the
// uninterrupted run in dir/full: the same losses and norms, and the same final weights, bit for bit.
void check_stop_resume(const fs::path& dir, const std::string& common) {
  const fs::path full = dir / "full", parts = dir / "parts";
  REQUIRE(n_ranks(2, common + " --run-dir " + full.string()).exit_code == 0);
  REQUIRE(n_ranks(2, common + " --run-dir " + parts.string() + " --stop-at 3").exit_code == 0);
  const auto resumed = n_ranks(2, common + " --resume " + parts.string());
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  const auto a = metrics(full), b = metrics(parts);
  REQUIRE(a.size() == 6);
  REQUIRE(b.size() == 6);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(a[i]["loss"].get<double>() == b[i]["loss"].get<double>());
    CHECK(a[i]["grad_norm"].get<double>() == b[i]["grad_norm"].get<double>());
  }
  CHECK(slurp(full / "checkpoints/step_00000006/model.safetensors") == slurp(parts / "checkpoints/step_00000006/model.safetensors"));
}

}  // namespace

TEST_CASE("2, 3 and 4 ranks over nccl give the losses of 1 process with the same global batch") {
  TempDir tmp;
  for (int n : {2, 3, 4}) {
    INFO(n << " ranks");
    const fs::path one = tmp.path() / ("one" + std::to_string(n)), dp = tmp.path() / ("dp" + std::to_string(n));
    const auto r1 = one_process("--set run.grad_accum_steps=" + std::to_string(n) + " --run-dir " + one.string());
    INFO(r1.output);
    REQUIRE(r1.exit_code == 0);
    const auto rn = n_ranks(n, config() + " --set run.communicator=nccl --run-dir " + dp.string());
    INFO(rn.output);
    REQUIRE(rn.exit_code == 0);
    CHECK(read_json(dp / "run.json")["world"] == n);
    CHECK(read_json(dp / "run.json")["communicator"] == "nccl");
    CHECK(metrics(dp).back()["tokens"] == n * 2 * 32);
    require_same_losses(one, dp);
  }
}

TEST_CASE("3 ranks over nccl: ZeRO-1 (uneven shards) and many small buckets give plain data parallel's losses") {
  TempDir tmp;
  const fs::path dp = tmp.path() / "dp", zero = tmp.path() / "zero";
  // 0.004 MB buckets: 1000 f32 each, so the 30,080 gradients go in ~31 buckets, several crossing
  // the ranks' shard boundaries (30,080 = 3 * 10,026 + 2: uneven).
  const std::string small = " --set run.bucket_mb=0.004 --set run.communicator=nccl";
  const auto a = n_ranks(3, config() + small + " --run-dir " + dp.string());
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  const auto b = n_ranks(3, config() + small + " --set optimizer.shard_state=true --run-dir " + zero.string());
  INFO(b.output);
  REQUIRE(b.exit_code == 0);
  CHECK(b.output.find("buckets") != std::string::npos);
  require_same_losses(dp, zero);
  const int64_t params = read_json(dp / "run.json")["parameters"];
  CHECK(params % 3 != 0);
  CHECK(metrics(zero).back()["optimizer_state_bytes"] == 8 * ((params + 2) / 3));
  CHECK(fs::exists(zero / "checkpoints/step_00000005/optimizer.rank_00002-of-00003.safetensors"));
}

TEST_CASE("2 ranks with 2 micro-batches each over nccl give 1 process's 4 micro-batches") {
  TempDir tmp;
  const fs::path one = tmp.path() / "one", dp = tmp.path() / "dp";
  const auto r1 = one_process("--set run.grad_accum_steps=4 --run-dir " + one.string());
  INFO(r1.output);
  REQUIRE(r1.exit_code == 0);
  const auto r2 = n_ranks(2, config() + " --set run.grad_accum_steps=2 --set run.communicator=nccl --run-dir " + dp.string());
  INFO(r2.output);
  REQUIRE(r2.exit_code == 0);
  require_same_losses(one, dp);
}

TEST_CASE("dropout under nccl: each rank's masks are those of the same rank on the cpu (2 ranks over mpi)") {
  TempDir tmp;
  const fs::path gpu = tmp.path() / "gpu", cpu = tmp.path() / "cpu";
  const std::string drop = " --set model.dropout=0.1 --set run.steps=5";
  const auto g = n_ranks(2, config("cuda") + drop + " --set run.communicator=nccl --run-dir " + gpu.string());
  INFO(g.output);
  REQUIRE(g.exit_code == 0);
  const auto c = n_ranks(2, config("cpu") + drop + " --set run.communicator=mpi --run-dir " + cpu.string());
  INFO(c.output);
  REQUIRE(c.exit_code == 0);
  const auto a = metrics(cpu), b = metrics(gpu);
  REQUIRE(a.size() == 5);
  REQUIRE(b.size() == 5);
  // test_cuda_train.cpp's cuda-against-cpu bounds: 1e-5 relative at step 1 (the same weights, sums
  // in another order), 2e-3 after AdamW's steps. A mask drawn with another key changes a tenth of
  // the activations: the step-1 loss moves by ~1e-2, far outside.
  const auto rel = [](double x, double y) { return std::abs(x - y) / std::abs(y); };
  CHECK(rel(b[0]["loss"].get<double>(), a[0]["loss"].get<double>()) < 1e-5);
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(rel(b[i]["loss"].get<double>(), a[i]["loss"].get<double>()) < 2e-3);
  // And the masks matter: without dropout step 1's loss is another.
  const fs::path plain = tmp.path() / "plain";
  const auto p = n_ranks(2, config("cuda") + " --set run.steps=5 --set run.communicator=nccl --run-dir " + plain.string());
  REQUIRE(p.exit_code == 0);
  CHECK(rel(metrics(plain)[0]["loss"].get<double>(), b[0]["loss"].get<double>()) > 1e-4);
}

TEST_CASE("gradient buckets are issued during the backward pass, last parameters first, each once per step") {
  TempDir tmp;
  const fs::path dp = tmp.path() / "dp", log = tmp.path() / "nccl.log";
  const auto r =
      n_ranks(2, config() + " --set run.steps=2 --set run.bucket_mb=0.01 --set run.communicator=nccl --run-dir " + dp.string(),
              "ABLATE_EMU_NCCL_LOG=" + log.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const int64_t params = read_json(dp / "run.json")["parameters"];
  for (int rank = 0; rank < 2; ++rank) {
    INFO("rank " << rank);
    const auto arrivals = read_log(log.string() + "." + std::to_string(rank));
    REQUIRE(!arrivals.empty());
    // The gradient buckets: the f32 all-reduces (the host scalars are f64 and i32), grouped into
    // steps by their coverage of the parameters.
    std::vector<std::vector<Arrival>> steps(1);
    int64_t covered = 0;
    for (const Arrival& a : arrivals) {
      if (a.kind != "ncclAllReduce" || a.type != "float32") continue;
      steps.back().push_back(a);
      covered += int64_t(a.count);
      if (covered == params) {
        steps.emplace_back();
        covered = 0;
      }
    }
    CHECK(covered == 0);  // each step's buckets cover the gradients exactly
    steps.pop_back();
    REQUIRE(steps.size() == 2);
    for (const auto& buckets : steps) {
      // 0.01 MB = 2,500 f32: 30,080 gradients make at least 12 buckets.
      CHECK(buckets.size() >= 12);
      for (std::size_t i = 1; i < buckets.size(); ++i) {
        // Contiguous and descending: the backward pass finishes the last parameters first.
        CHECK(buckets[i].address + 4 * buckets[i].count == buckets[i - 1].address);
      }
      // During the backward pass: kernels ran between the first bucket and the last (the earlier
      // layers' backward), not all after it.
      CHECK(buckets.back().launches > buckets.front().launches);
    }
  }
}

TEST_CASE("a rank killed inside a collective, or stopped in one, ends every rank within the collective timeout") {
  TempDir tmp;
  for (const std::string fault : {"exit", "stall"}) {
    INFO("fault " << fault);
    const fs::path dir = tmp.path() / fault;
    const auto start = std::chrono::steady_clock::now();
    // Rank 1 ends (SIGKILL) or stops answering when its stream reaches collective #9, step 2's
    // gradient all-reduce. What the failed collective leaves of the ranks' meeting place is in tmp.
    const auto r = n_ranks(2, config() + " --set run.communicator=nccl --set run.nccl.timeout_s=10 --run-dir " + dir.string(),
                           "ABLATE_EMU_NCCL_FAULT=1:9:" + fault + " TMPDIR=" + tmp.path().string());
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(r.output);
    CHECK(r.exit_code != 0);
    CHECK(r.output.find("rank 1 " + std::string(fault == "exit" ? "killed" : "stalls") + " at collective #9") != std::string::npos);
    // Rank 0 fails, naming itself and the collective, and exits 1; the job ends.
    CHECK(r.output.find("nccl communicator: rank 0 of 2") != std::string::npos);
    if (fault == "exit") {
      CHECK(r.output.find("ended without reaching collective #9") != std::string::npos);
    } else {
      CHECK(r.output.find("did not complete within 10 s") != std::string::npos);
    }
    CHECK(waited < 60.0);
    CHECK_FALSE(fs::exists(dir / "summary.json"));
  }
}

TEST_CASE("a 2-rank nccl run stopped at step 3 resumes to the uninterrupted run's losses bit for bit") {
  TempDir tmp;
  check_stop_resume(tmp.path(), config() + " --set run.steps=6 --set model.dropout=0.1 --set run.communicator=nccl");
}

TEST_CASE("FP8 delayed scaling over 2 ranks: every rank holds the same scales (the amaxes' max across ranks), so a run "
          "stopped at step 3 resumes bit for bit") {
  // Each rank quantises its own micro-batch and records its own amaxes; the engine takes their max
  // across the ranks before the histories step on (engine.cpp's end_step), so every rank holds
  // rank 0's scaling state, which is what the checkpoint saves and every rank resumes from. Had
  // rank 1 kept its own, it would resume with other scales and its products would round to other
  // FP8 values: the resumed losses would not be the uninterrupted run's.
  TempDir tmp;
  check_stop_resume(tmp.path(),
                    config() + " --set run.steps=6 --set run.communicator=nccl --set run.dtype=fp8 --set run.fp8_scaling=delayed" +
                        " --set run.fp8_amax_history=4");
  CHECK(fs::exists(tmp.path() / "parts/checkpoints/step_00000003/scaling.safetensors"));
  for (const json& m : metrics(tmp.path() / "parts")) CHECK(m.contains("fp8_saturated"));
}

// As test_data_parallel.cpp's world-size cases, on cuda over nccl: the padded batcher makes every
// rank draw as many documents as it has rows, so the new job deals the sequence on from where the
// old one stopped, and each of its global batches is what one process reads with that global batch
// by accumulation. The reference is that process (accumulation N to step 3, then M), on cuda too.
TEST_CASE("nccl checkpoints resume on another world size: 2 -> 3 and 4 -> 2 ranks (ZeRO-1 on, off, switched), 2 -> 1 process") {
  TempDir tmp;
  const std::string stop = " --set checkpoint.every=100 --stop-at 3";
  const auto reference = [&](int before, int after) {
    const fs::path ref = tmp.path() / ("ref" + std::to_string(before) + std::to_string(after));
    const auto a = one_process("--set run.grad_accum_steps=" + std::to_string(before) + " --run-dir " + ref.string() + stop);
    INFO(a.output);
    REQUIRE(a.exit_code == 0);
    const auto b = one_process("--set run.grad_accum_steps=" + std::to_string(after) + " --run-dir " + ref.string() + " --resume");
    INFO(b.output);
    REQUIRE(b.exit_code == 0);
    return ref;
  };
  const auto resumed_on = [&](int before, int after, const std::string& zero_before, const std::string& zero_after) {
    const fs::path dir = tmp.path() / ("dp" + std::to_string(before) + std::to_string(after) + zero_before + zero_after);
    const std::string nccl = " --set run.communicator=nccl";
    const auto a =
        n_ranks(before, config() + nccl + " --set optimizer.shard_state=" + zero_before + " --run-dir " + dir.string() + stop);
    INFO(a.output);
    REQUIRE(a.exit_code == 0);
    const std::string rest = " --set optimizer.shard_state=" + zero_after + " --run-dir " + dir.string() + " --resume";
    const auto b = after == 1 ? one_process("--set run.grad_accum_steps=" + std::to_string(before) + rest)
                              : n_ranks(after, config() + nccl + rest);
    INFO(b.output);
    REQUIRE(b.exit_code == 0);
    const json state = read_json(dir / "checkpoints/step_00000005/state.json");
    CHECK(state["world"] == after);
    CHECK(state["data_cursors"][0]["reshard"]["from_world"] == before);
    return dir;
  };
  const fs::path ref23 = reference(2, 3);
  require_same_losses(ref23, resumed_on(2, 3, "true", "true"));
  require_same_losses(ref23, resumed_on(2, 3, "false", "true"));
  require_same_losses(reference(4, 2), resumed_on(4, 2, "true", "false"));
  require_same_losses(reference(2, 2), resumed_on(2, 1, "true", "false"));
}
