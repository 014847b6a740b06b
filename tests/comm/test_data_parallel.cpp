// Data-parallel training end to end: `ablate train` under mpiexec with 2 ranks against one process
// with the same global batch (2 micro-batches of accumulation), ZeRO-1 against plain data
// parallel, LoRA on an NF4 base (only the adapters reduced and sharded), a 2-rank run stopped and
// resumed against the uninterrupted one, checkpoints resumed on another world size (1, 2 and 3
// ranks, ZeRO-1 on, off and switched) against one process with the same global batches, and the
// refusals (optimizer state that cannot be re-cut, communicator "single" under a launcher).
//
// The data makes the global batches identical: the padded batcher puts one document per row
// (truncated to the row), and the samplers deal position p of the epoch's order to rank p % world,
// so rank r's micro-batch holds rows r, r + 2, ... of what one process reads in two micro-batches.
// What differs is the order of summation (per rank, then across ranks), so the losses agree within
// a floating-point tolerance, stated below, rather than bit for bit.
#include <doctest/doctest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "data_parallel_support.hpp"
#include "run_files.hpp"
#include "test_support.hpp"

using namespace ablate::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr double kLossTolerance = kDpLossTolerance;
constexpr double kGradNormRelTolerance = kDpGradNormRelTolerance;
const std::string& kEnv = kMpiTestEnv;

std::string config(int threads) {
  return std::string(ABLATE_SOURCE_DIR) + "/configs/quickstart.toml" +
         " --set model.d_model=32 --set model.n_layers=2 --set model.n_heads=2 --set model.max_seq_len=64"
         " --set batching.name=padded --set batching.long_documents=truncate --set batching.batch_size=4"
         " --set batching.seq_len=64 --set run.eval_batches=2 --set run.eval_every=10 --set run.steps=20"
         " --set data.synthetic_probes.documents=2000 --set data.synthetic_probes.validation_documents=50"
         " --set run.threads=" +
         std::to_string(threads) + " --set logging.sinks=[\\\"jsonl\\\"]";
}

CommandResult one_process(const std::string& args) { return run_ablate("train " + config(2) + " " + args); }

// `n` ranks of `ablate train ...`, as mpiexec's argument text.
std::string ranks_of(int n, const std::string& args) {
  return std::string(ABLATE_MPIEXEC_NP) + " " + std::to_string(n) + " " + ABLATE_BINARY + " train " + config(1) + " " + args;
}

CommandResult n_ranks(int n, const std::string& args) {
  return run_command(kEnv + " " + ABLATE_MPIEXEC_BIN + " " + ABLATE_MPIEXEC_FLAGS + " " + ranks_of(n, args));
}

CommandResult two_ranks(const std::string& args) { return n_ranks(2, args); }

// One job of two ranks started with different arguments (mpiexec's MPMD form: A : B).
CommandResult two_different_ranks(const std::string& args0, const std::string& args1) {
  return run_command(kEnv + " " + ABLATE_MPIEXEC_BIN + " " + ABLATE_MPIEXEC_FLAGS + " " + ranks_of(1, args0) + " : " +
                     ranks_of(1, args1));
}

void require_same_losses(const fs::path& a, const fs::path& b, double tolerance) {
  const auto ma = metrics(a), mb = metrics(b);
  REQUIRE(ma.size() == 20);
  REQUIRE(mb.size() == ma.size());
  for (std::size_t i = 0; i < ma.size(); ++i) {
    INFO("step " << ma[i]["step"]);
    CHECK(ma[i]["step"] == mb[i]["step"]);
    CHECK(ma[i]["tokens"] == mb[i]["tokens"]);
    CHECK(ma[i]["real_tokens"] == mb[i]["real_tokens"]);
    CHECK(std::abs(ma[i]["loss"].get<double>() - mb[i]["loss"].get<double>()) <= tolerance);
    CHECK(std::abs(ma[i]["grad_norm"].get<double>() - mb[i]["grad_norm"].get<double>()) <=
          std::max(tolerance, kGradNormRelTolerance * ma[i]["grad_norm"].get<double>()));
    if (ma[i].contains("val_loss")) {
      REQUIRE(mb[i].contains("val_loss"));
      CHECK(std::abs(ma[i]["val_loss"].get<double>() - mb[i]["val_loss"].get<double>()) <= tolerance);
    }
  }
}

}  // namespace

TEST_CASE("2 ranks give the losses of 1 process with the same global batch, and ZeRO-1 those of plain data parallel") {
  TempDir tmp;
  const fs::path one = tmp.path() / "one", dp = tmp.path() / "dp", zero = tmp.path() / "zero";
  const auto r1 = one_process("--set run.grad_accum_steps=2 --run-dir " + one.string());
  INFO(r1.output);
  REQUIRE(r1.exit_code == 0);
  const auto r2 = two_ranks("--run-dir " + dp.string());
  INFO(r2.output);
  REQUIRE(r2.exit_code == 0);
  CHECK(read_json(one / "run.json")["communicator"] == "single");  // "auto" with no launcher
  CHECK(read_json(dp / "run.json")["world"] == 2);
  CHECK(read_json(dp / "run.json")["communicator"] == "mpi");  // "auto" under mpiexec
  CHECK(metrics(dp).back()["tokens"] == 2 * 4 * 64);           // the global batch, both ranks counted
  require_same_losses(one, dp, kLossTolerance);
  // The share of each step spent in collectives is measured on every data-parallel step.
  for (const json& m : metrics(dp)) {
    REQUIRE(m.contains("comm_pct"));
    CHECK(m["comm_pct"].get<double>() >= 0.0);
    CHECK(m["comm_pct"].get<double>() <= 100.0);
  }
  CHECK(read_json(dp / "summary.json").contains("comm_pct"));
  CHECK_FALSE(metrics(one).front().contains("comm_pct"));
  // The losses fell: the comparison is of a run that learns.
  CHECK(metrics(dp).back()["loss"].get<double>() < metrics(dp).front()["loss"].get<double>() - 0.5);

  const auto rz = two_ranks("--set optimizer.shard_state=true --run-dir " + zero.string());
  INFO(rz.output);
  REQUIRE(rz.exit_code == 0);
  require_same_losses(dp, zero, kLossTolerance);
  // Each rank holds half the optimizer state: AdamW's 8 bytes per parameter, split over 2 ranks.
  const int64_t params = read_json(dp / "run.json")["parameters"];
  CHECK(metrics(dp).back()["optimizer_state_bytes"] == 8 * params);
  CHECK(metrics(zero).back()["optimizer_state_bytes"] == 8 * ((params + 1) / 2));
  const fs::path last = zero / "checkpoints/step_00000020";
  CHECK(fs::exists(last / "optimizer.rank_00000-of-00002.safetensors"));
  CHECK(fs::exists(last / "optimizer.rank_00001-of-00002.safetensors"));
  CHECK_FALSE(fs::exists(last / "optimizer.safetensors"));
  // One model file, written once by rank 0, that a single process loads.
  const auto smp = run_ablate("sample --checkpoint " + zero.string() + " --prompt \"#h3 \" --tokens 10 --seed 1");
  INFO(smp.output);
  CHECK(smp.exit_code == 0);
}

TEST_CASE("evaluations under 2 ranks deal the items out and sum them: 1 process's metrics, and ablate eval's on the checkpoint") {
  TempDir tmp;
  const fs::path one = tmp.path() / "one", dp = tmp.path() / "dp";
  const std::string evals = "--set eval.probe_rows.enabled=true --set eval.probe_rows.limit=41 --set eval.probe_rows.path=" +
                            std::string(ABLATE_SOURCE_DIR) + "/configs/evals/probe-rows.jsonl ";
  const auto r1 = one_process(evals + "--set run.grad_accum_steps=2 --run-dir " + one.string());
  INFO(r1.output);
  REQUIRE(r1.exit_code == 0);
  const auto r2 = two_ranks(evals + "--run-dir " + dp.string());
  INFO(r2.output);
  REQUIRE(r2.exit_code == 0);
  require_same_losses(one, dp, kLossTolerance);
  const json a = metrics(one).back(), b = metrics(dp).back();
  // 41 items over 2 ranks: 21 and 20, every one counted once. The weights agree to ~1e-8, so an
  // item flips only from an exact tie; one item either way is allowed.
  CHECK(b["eval/probe_rows/items"].get<double>() == 41);
  CHECK(std::abs(a["eval/probe_rows/acc"].get<double>() - b["eval/probe_rows/acc"].get<double>()) <= 1.0 / 41 + 1e-12);
  const auto ev = run_ablate("eval --checkpoint " + dp.string() + " --eval probe_rows --json");
  INFO(ev.output);
  REQUIRE(ev.exit_code == 0);
  const std::size_t open = ev.output.find("{\n"), close = ev.output.rfind('}');
  REQUIRE(open != std::string::npos);
  const json out = json::parse(ev.output.substr(open, close + 1 - open));
  CHECK(std::abs(out["metrics"]["acc"].get<double>() - b["eval/probe_rows/acc"].get<double>()) <= 1.0 / 41 + 1e-12);
  CHECK(read_json(dp / "summary.json")["evals"]["probe_rows"]["metrics"]["items"] == 41);
}

TEST_CASE("LoRA on an NF4 base: 2 ranks give 1 process's losses, plain and ZeRO-1, the adapters' state halved") {
  // Only the adapters train: the gradient buckets, the all-reduce, ZeRO-1's reduce-scatter and
  // all-gather and the optimizer's shards cover the trainable part of the table alone.
  const std::string lora = "--set adapter.name=lora --set adapter.lora.rank=4 --set adapter.base_dtype=nf4 ";
  TempDir tmp;
  const fs::path one = tmp.path() / "one", dp = tmp.path() / "dp", zero = tmp.path() / "zero";
  const auto r1 = one_process(lora + "--set run.grad_accum_steps=2 --run-dir " + one.string());
  INFO(r1.output);
  REQUIRE(r1.exit_code == 0);
  const auto r2 = two_ranks(lora + "--run-dir " + dp.string());
  INFO(r2.output);
  REQUIRE(r2.exit_code == 0);
  require_same_losses(one, dp, kLossTolerance);
  const auto rz = two_ranks(lora + "--set optimizer.shard_state=true --run-dir " + zero.string());
  INFO(rz.output);
  REQUIRE(rz.exit_code == 0);
  require_same_losses(dp, zero, kLossTolerance);
  const json run = read_json(dp / "run.json");
  const int64_t trainable = run["trainable_parameters"];
  CHECK(trainable > 0);
  CHECK(trainable < run["parameters"].get<int64_t>() / 10);
  CHECK(run["nf4_parameters"].get<int64_t>() > 0);
  CHECK(metrics(dp).back()["optimizer_state_bytes"] == 8 * trainable);
  CHECK(metrics(zero).back()["optimizer_state_bytes"] == 8 * ((trainable + 1) / 2));
  CHECK(metrics(dp).back()["loss"].get<double>() < metrics(dp).front()["loss"].get<double>());
}

TEST_CASE("3 ranks (uneven shards, slices cut mid-tensor) give 1 process's losses, with and without ZeRO-1") {
  TempDir tmp;
  const fs::path one = tmp.path() / "one", dp = tmp.path() / "dp", zero = tmp.path() / "zero";
  REQUIRE(one_process("--set run.grad_accum_steps=3 --run-dir " + one.string()).exit_code == 0);
  REQUIRE(n_ranks(3, "--run-dir " + dp.string()).exit_code == 0);
  const auto rz = n_ranks(3, "--set optimizer.shard_state=true --run-dir " + zero.string());
  INFO(rz.output);
  REQUIRE(rz.exit_code == 0);
  CHECK(metrics(dp).back()["tokens"] == 3 * 4 * 64);
  require_same_losses(one, dp, kLossTolerance);
  require_same_losses(dp, zero, kLossTolerance);
  // 30,080 parameters over 3 ranks: shards of 10,027, 10,027 and 10,026 elements.
  const int64_t params = read_json(dp / "run.json")["parameters"];
  CHECK(metrics(zero).back()["optimizer_state_bytes"] == 8 * ((params + 2) / 3));
  for (int r = 0; r < 3; ++r) {
    CHECK(fs::exists(zero / "checkpoints/step_00000020" / ("optimizer.rank_0000" + std::to_string(r) + "-of-00003.safetensors")));
  }
}

TEST_CASE(
    "gradient buckets reduced during the backward pass give the flat reduction's losses (2 and 3 ranks, accumulation 1 and 3, ZeRO-1)") {
  // 1000-element buckets (0.004 MB) cut the 30,080 parameters into 31 pieces, most mid-tensor, and
  // under ZeRO-1 across shard boundaries. Only the grouping of the sums differs from one reduction
  // of the whole buffer, so the flat run's tolerance holds.
  TempDir tmp;
  const std::string small = " --set run.bucket_mb=0.004", flat = " --set run.bucket_mb=0";
  for (int ranks : {2, 3}) {
    for (int accum : {1, 3}) {
      INFO(ranks << " ranks, accumulation " << accum);
      const std::string tag = std::to_string(ranks) + "_" + std::to_string(accum);
      const std::string common = " --set run.grad_accum_steps=" + std::to_string(accum);
      const fs::path a = tmp.path() / ("flat" + tag), b = tmp.path() / ("buckets" + tag), z = tmp.path() / ("zero" + tag);
      REQUIRE(n_ranks(ranks, common + flat + " --run-dir " + a.string()).exit_code == 0);
      const auto rb = n_ranks(ranks, common + small + " --run-dir " + b.string());
      INFO(rb.output);
      REQUIRE(rb.exit_code == 0);
      CHECK(rb.output.find("gradients reduced in 31 buckets") != std::string::npos);
      require_same_losses(a, b, kLossTolerance);
      if (accum == 3) {  // ZeRO-1 with buckets: each bucket's shard pieces reduced to their owners
        const auto rz = n_ranks(ranks, common + small + " --set optimizer.shard_state=true --run-dir " + z.string());
        INFO(rz.output);
        REQUIRE(rz.exit_code == 0);
        require_same_losses(a, z, kLossTolerance);
      }
    }
  }
}

TEST_CASE("one mpi rank runs the gradient buckets and gives single's losses bit for bit") {
  // A world of one: every collective is the identity on the values, but the buckets, the hook in
  // the backward pass and join() run, as they do for a one-rank nccl job measured against single.
  TempDir tmp;
  const std::string args = " --set run.bucket_mb=0.004 --set run.threads=1";
  const fs::path a = tmp.path() / "single", b = tmp.path() / "mpi1";
  REQUIRE(one_process(args + " --run-dir " + a.string()).exit_code == 0);
  const auto rb = n_ranks(1, args + " --set run.communicator=mpi --run-dir " + b.string());
  INFO(rb.output);
  REQUIRE(rb.exit_code == 0);
  CHECK(rb.output.find("gradients reduced in 31 buckets") != std::string::npos);
  require_same_losses(a, b, 0.0);
  // The communicator's time is measured (and reported) whenever it moves data, not for single.
  CHECK(read_json(b / "summary.json").contains("comm_pct"));
  CHECK(!read_json(a / "summary.json").contains("comm_pct"));
}

TEST_CASE("ZeRO-1 with adamw8bit follows plain data parallel within the quantisation error") {
  // A slice cut by a shard boundary is quantized in blocks that start at the boundary, so the codes
  // differ from plain data parallel's and the runs agree only approximately (measured: at most
  // 7e-4 in the loss over 20 steps).
  TempDir tmp;
  const fs::path dp = tmp.path() / "dp", zero = tmp.path() / "zero";
  const std::string opt = "--set optimizer.name=adamw8bit --set optimizer.adamw8bit.min_8bit_size=512 ";
  REQUIRE(two_ranks(opt + "--run-dir " + dp.string()).exit_code == 0);
  const auto rz = two_ranks(opt + "--set optimizer.shard_state=true --run-dir " + zero.string());
  INFO(rz.output);
  REQUIRE(rz.exit_code == 0);
  const auto a = metrics(dp), b = metrics(zero);
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    CHECK(std::abs(a[i]["loss"].get<double>() - b[i]["loss"].get<double>()) < 5e-3);
  }
  CHECK(b.back()["optimizer_state_bytes"].get<int64_t>() < a.back()["optimizer_state_bytes"].get<int64_t>());
}

TEST_CASE("a 2-rank run stopped at step 10 resumes to the uninterrupted run's losses, with and without ZeRO-1") {
  for (const std::string shard : {"false", "true"}) {
    CAPTURE(shard);
    TempDir tmp;
    const fs::path full = tmp.path() / "full", parts = tmp.path() / "parts";
    // The packed batcher carries pieces of documents across batches: each rank's cursor is its own.
    const std::string opts = "--set batching.name=packed --set checkpoint.every=100 --set optimizer.shard_state=" + shard;
    REQUIRE(two_ranks(opts + " --run-dir " + full.string()).exit_code == 0);
    const auto stop = two_ranks(opts + " --run-dir " + parts.string() + " --stop-at 10");
    INFO(stop.output);
    REQUIRE(stop.exit_code == 0);
    const json state = read_json(parts / "checkpoints/step_00000010/state.json");
    CHECK(state["world"] == 2);
    CHECK(state["data_cursors"].size() == 2);
    CHECK(state["data_cursors"][0] != state["data_cursors"][1]);  // each rank's own place in the data
    CHECK(state["data_cursor"] == state["data_cursors"][0]);

    CHECK_FALSE(state["data_cursors"][0].contains("reshard"));  // the standard deal: no record

    const auto resumed = two_ranks(opts + " --run-dir " + parts.string() + " --resume");
    INFO(resumed.output);
    REQUIRE(resumed.exit_code == 0);
    const auto mf = metrics(full), mp = metrics(parts);
    REQUIRE(mp.size() == mf.size());
    for (std::size_t i = 0; i < mf.size(); ++i) {
      INFO("step " << mf[i]["step"]);
      CHECK(mp[i]["step"] == mf[i]["step"]);
      CHECK(mp[i]["loss"].get<double>() == mf[i]["loss"].get<double>());  // same ranks, same threads: exact
    }
    CHECK(read_json(parts / "summary.json")["resumed_from"] == 10);
  }
}

namespace {

// A copy of a run directory (its checkpoints and logs) to resume in another way.
fs::path copy_run(const fs::path& from, const fs::path& to) {
  fs::copy(from, to, fs::copy_options::recursive);
  return to;
}

void require_ok(const CommandResult& r) {
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

}  // namespace

// With the padded batcher (one truncated document a row) every rank draws as many documents as it
// has rows, so at the checkpoint the old ranks have drawn every global position below
// F = steps x (global batch) and nothing above it: the new ranks deal the sequence on from F, and
// each step's global batch holds the documents one process reads with the new global batch by
// accumulation, from the same place. The reference is that process: accumulation a to step 10,
// resumed (same world, no merge) with accumulation b. Only the order of the sums differs.
TEST_CASE("a 2-rank checkpoint resumes on 1 and 3 ranks, ZeRO-1 on, off and switched, as one process with the new global batch") {
  TempDir tmp;
  const std::string stop = " --set checkpoint.every=100 --stop-at 10";
  const fs::path ref2 = tmp.path() / "ref2", ref3 = tmp.path() / "ref3";
  require_ok(one_process("--set run.grad_accum_steps=2 --run-dir " + ref2.string()));  // 8 documents a step throughout
  require_ok(one_process("--set run.grad_accum_steps=2 --run-dir " + ref3.string() + stop));
  require_ok(one_process("--set run.grad_accum_steps=3 --run-dir " + ref3.string() + " --resume"));  // then 12
  for (const std::string from : {"false", "true"}) {
    CAPTURE(from);
    const fs::path base = tmp.path() / ("base_" + from);
    require_ok(two_ranks("--set optimizer.shard_state=" + from + " --run-dir " + base.string() + stop));
    // On 1 process: 2 micro-batches keep the global batch of 8 documents.
    const fs::path one = copy_run(base, tmp.path() / ("one_" + from));
    const auto r1 =
        one_process("--set optimizer.shard_state=" + from + " --set run.grad_accum_steps=2 --run-dir " + one.string() + " --resume");
    require_ok(r1);
    CHECK(r1.output.find("the data cursors of 2 rank(s) dealt to 1: every global position below 80 was drawn and 0 above it") !=
          std::string::npos);
    require_same_losses(ref2, one, kLossTolerance);
    CHECK(read_json(one / "checkpoints/step_00000020/state.json")["data_cursors"][0]["reshard"]["from_world"] == 2);
    for (const std::string to : {"false", "true"}) {
      CAPTURE(to);
      const fs::path three = copy_run(base, tmp.path() / ("three_" + from + "_" + to));
      const auto r3 = n_ranks(3, "--set optimizer.shard_state=" + to + " --run-dir " + three.string() + " --resume");
      require_ok(r3);
      require_same_losses(ref3, three, kLossTolerance);
      const json state = read_json(three / "checkpoints/step_00000020/state.json");
      CHECK(state["world"] == 3);
      CHECK(state["optimizer_files"].size() == (to == "true" ? 3 : 1));
      // ZeRO-1 after the switch holds a third of the state per rank.
      const int64_t params = read_json(three / "run.json")["parameters"];
      CHECK(metrics(three).back()["optimizer_state_bytes"] == (to == "true" ? 8 * ((params + 2) / 3) : 8 * params));
    }
  }
}

// 2 ranks to step 7, 3 ranks to step 14, 2 ranks to step 20 (ZeRO-1 throughout): the second switch
// merges cursors that carry the first one's record. One process does the same with accumulation
// 2, 3, 2.
TEST_CASE("a chain of world sizes, 2 -> 3 -> 2 ranks with ZeRO-1, gives one process's losses with the same global batches") {
  TempDir tmp;
  const fs::path ref = tmp.path() / "ref", dp = tmp.path() / "dp";
  const std::string every = " --set checkpoint.every=100 --set optimizer.shard_state=true";
  require_ok(one_process("--set run.grad_accum_steps=2 --run-dir " + ref.string() + every + " --stop-at 7"));
  require_ok(one_process("--set run.grad_accum_steps=3 --run-dir " + ref.string() + every + " --resume --stop-at 14"));
  require_ok(one_process("--set run.grad_accum_steps=2 --run-dir " + ref.string() + every + " --resume"));
  require_ok(two_ranks("--run-dir " + dp.string() + every + " --stop-at 7"));
  require_ok(n_ranks(3, "--run-dir " + dp.string() + every + " --resume --stop-at 14"));
  const json mid = read_json(dp / "checkpoints/step_00000014/state.json");
  CHECK(mid["world"] == 3);
  CHECK(mid["data_cursors"][0]["reshard"]["from_world"] == 2);
  CHECK(mid["data_cursors"][0]["reshard"]["first"] == 7 * 8);
  const auto last = two_ranks("--run-dir " + dp.string() + every + " --resume");
  require_ok(last);
  CHECK(last.output.find("dealt to 2: every global position below " + std::to_string(7 * 8 + 7 * 12)) != std::string::npos);
  require_same_losses(ref, dp, kLossTolerance);
}

// The packed batcher takes documents at uneven rates on each rank, and holds pieces of them across
// batches: the merge deals leftovers and pending pieces. A job resumed on 3 ranks, stopped and
// resumed again on 3 ranks (its cursors carry the record) ends bit for bit where it would have
// without the stop, and its checkpoint resumes on 1 process too.
TEST_CASE("packed: a 2-rank checkpoint resumed on 3 ranks, stopped and resumed again, ends bit for bit as without the stop") {
  TempDir tmp;
  // Documents split into rows (pieces of many lengths) in a window of 16 pieces: the ranks' draws
  // differ by a few documents at step 10 (12 and 14 here).
  const std::string opts = "--set batching.name=packed --set batching.long_documents=split --set batching.packed.window=16 "
                           "--set checkpoint.every=100";
  const fs::path base = tmp.path() / "base";
  require_ok(two_ranks(opts + " --run-dir " + base.string() + " --stop-at 10"));
  const json at10 = read_json(base / "checkpoints/step_00000010/state.json");
  CHECK(at10["data_cursors"][0]["draw"] != at10["data_cursors"][1]["draw"]);  // uneven: what the merge is for
  const fs::path straight = copy_run(base, tmp.path() / "straight"), stopped = copy_run(base, tmp.path() / "stopped");
  require_ok(n_ranks(3, opts + " --run-dir " + straight.string() + " --resume"));
  require_ok(n_ranks(3, opts + " --run-dir " + stopped.string() + " --resume --stop-at 15"));
  const json at15 = read_json(stopped / "checkpoints/step_00000015/state.json");
  CHECK(at15["data_cursors"].size() == 3);
  CHECK(at15["data_cursors"][2]["reshard"]["from_world"] == 2);
  CHECK_FALSE(at15["data_cursors"][2]["reshard"]["drawn"].empty());  // some rank had drawn ahead: leftovers were dealt
  const fs::path single = copy_run(stopped, tmp.path() / "single");
  require_ok(n_ranks(3, opts + " --run-dir " + stopped.string() + " --resume"));
  const auto a = metrics(straight), b = metrics(stopped);
  REQUIRE(a.size() == 20);
  REQUIRE(b.size() == a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << a[i]["step"]);
    CHECK(b[i]["loss"].get<double>() == a[i]["loss"].get<double>());
    CHECK(b[i]["real_tokens"] == a[i]["real_tokens"]);
  }
  const auto r1 = one_process(opts + " --set run.grad_accum_steps=3 --run-dir " + single.string() + " --resume");
  require_ok(r1);
  CHECK(metrics(single).size() == 20);
  CHECK(metrics(single).back()["loss"].get<double>() < metrics(single).front()["loss"].get<double>() - 0.5);
}

TEST_CASE("optimizer state that is not one value per parameter is re-cut for no other world size: exit 2, naming the file") {
  // adamw8bit keeps block-quantized state whose blocks start at the shard boundary. Its whole state
  // (ZeRO-1 off) is taken as it is by any world size; its shards are refused on another world size
  // or another optimizer.shard_state, before anything is written.
  TempDir tmp;
  const std::string opt = "--set optimizer.name=adamw8bit --set optimizer.adamw8bit.min_8bit_size=512 --set checkpoint.every=100 ";
  const fs::path zero = tmp.path() / "zero", whole = tmp.path() / "whole";
  require_ok(two_ranks(opt + "--set optimizer.shard_state=true --run-dir " + zero.string() + " --stop-at 10"));
  for (const auto& [world, shard] : {std::pair<int, std::string>{1, "true"}, {3, "true"}, {2, "false"}}) {
    CAPTURE(world);
    CAPTURE(shard);
    const auto r = n_ranks(world, opt + "--set optimizer.shard_state=" + shard + " --run-dir " + zero.string() + " --resume");
    CHECK(r.exit_code == 2);
    CHECK(r.output.find("optimizer.rank_0000") != std::string::npos);
    CHECK(r.output.find("-of-00002.safetensors: optimizer state tensor '") != std::string::npos);
    CHECK(r.output.find("optimizer 'adamw8bit' keeps state that cannot be cut at other shard boundaries") != std::string::npos);
    CHECK(r.output.find("resume with 2 rank(s) and optimizer.shard_state = true") != std::string::npos);
    CHECK(fs::exists(zero / "checkpoints/step_00000010/model.safetensors"));
    CHECK_FALSE(fs::exists(zero / "checkpoints/step_00000011"));
  }
  require_ok(two_ranks(opt + "--run-dir " + whole.string() + " --stop-at 10"));
  require_ok(one_process(opt + "--set run.grad_accum_steps=2 --run-dir " + whole.string() + " --resume"));
  CHECK(metrics(whole).size() == 20);
}

TEST_CASE("ranks started with different experiments or data are refused with exit 2, naming the rank") {
  TempDir tmp;
  const std::string dir = " --run-dir " + (tmp.path() / "run").string();
  const auto lr = two_different_ranks("--set optimizer.lr=1e-3" + dir, "--set optimizer.lr=2e-3" + dir);
  INFO(lr.output);
  CHECK(lr.exit_code == 2);
  CHECK(lr.output.find("rank(s) 1 resolved another experiment than rank 0") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path() / "run" / "checkpoints" / "latest"));
}

TEST_CASE("ranks whose identical config reads other data are refused with exit 2") {
  // text_files paths are relative to the working directory: two ranks started in two directories
  // resolve the same config to other files (3 documents here, 4 there).
  TempDir tmp;
  const fs::path cfg = tmp.write("exp.toml", "[run]\nsteps = 2\nthreads = 1\n"
                                             "[model]\nd_model = 32\nn_layers = 1\nn_heads = 2\nmax_seq_len = 32\n"
                                             "[data]\nname = \"text_files\"\n"
                                             "[data.text_files]\npaths = [\"corpus.txt\"]\nseparator = \"|\"\n"
                                             "[batching]\nname = \"padded\"\nbatch_size = 2\nseq_len = 32\n"
                                             "[logging]\nsinks = [\"jsonl\"]\n");
  tmp.write("a/corpus.txt", "one|two|three");
  tmp.write("b/corpus.txt", "one|two|three|four");
  auto rank = [&](const char* wdir) {
    return std::string(ABLATE_MPIEXEC_NP) + " 1 -wdir " + (tmp.path() / wdir).string() + " " + ABLATE_BINARY + " train " +
           cfg.string() + " --run-dir " + (tmp.path() / "run").string();
  };
  const auto r = run_command(kEnv + " " + ABLATE_MPIEXEC_BIN + " " + ABLATE_MPIEXEC_FLAGS + " " + rank("a") + " : " + rank("b"));
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("rank(s) 1 read other data or built another model than rank 0") != std::string::npos);
  CHECK(r.output.find("3 train") != std::string::npos);  // rank 0 says what it read
}

TEST_CASE("communicator single under a launcher of 2 ranks is refused with exit 2") {
  TempDir tmp;
  const auto r = two_ranks("--set run.communicator=single --run-dir " + (tmp.path() / "run").string());
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("run.communicator") != std::string::npos);
  CHECK(r.output.find("started 2 ranks") != std::string::npos);
  CHECK_FALSE(fs::exists(tmp.path() / "run" / "checkpoints"));
}

TEST_CASE("doctor names communication when collectives take much of a data-parallel step, and the accumulation that fixes it") {
  TempDir tmp;
  const fs::path dp = tmp.path() / "dp";
  const auto r = two_ranks("--run-dir " + dp.string());
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  REQUIRE(run_ablate("doctor " + dp.string() + " --json").exit_code == 0);
  // The same run with every step at 100 ms of which 40% in collectives: c = 40, w = 60, so the
  // accumulation that brings c / (c + k w) to 10% is k = ceil(9 c / w) = 6, for k (c + w) / (c + k w)
  // = 600 / 400 = 1.5x the tokens per second.
  std::string lines;
  for (json m : metrics(dp)) {
    m["step_ms"] = 100.0;
    m["comm_pct"] = 40.0;
    lines += m.dump() + "\n";
  }
  tmp.write("dp/metrics.jsonl", lines);
  // Steady timings on a quiet machine, as planted: the doctor trusts them (no noisy_timings).
  json summary = read_json(dp / "summary.json");
  summary["step_time_cv"] = 0.0;
  summary["machine_load"] = 0.0;
  tmp.write("dp/summary.json", summary.dump());
  const auto d = run_ablate("doctor " + dp.string() + " --json");
  INFO(d.output);
  REQUIRE(d.exit_code == 0);
  const json* found = nullptr;
  const json findings = json::parse(d.output);
  for (const json& f : findings) {
    if (f["id"] == "communication") found = &f;
  }
  REQUIRE(found != nullptr);
  CHECK((*found)["severity"] == "high");
  CHECK((*found)["evidence"]["world"] == 2);
  CHECK((*found)["evidence"]["accumulation_factor"] == 6);
  CHECK((*found)["expected_speedup"].get<double>() == doctest::Approx(1.5));
  CHECK((*found)["change"].get<std::string>().find("run.grad_accum_steps=6") != std::string::npos);
}
