// The `ablate` program as a user meets it: exit codes (0 ok, 2 bad input), messages, --help for
// every subcommand, plugin listing from the build tree and from ABLATE_PLUGIN_PATH / [plugins] paths.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_support.hpp"

using ablate::test::run_ablate;
namespace fs = std::filesystem;

namespace {
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
const std::string kQuickstart = std::string(ABLATE_SOURCE_DIR) + "/configs/quickstart.toml";
}  // namespace

TEST_CASE("ablate with no command prints the commands and exits 2, --help exits 0") {
  const auto none = run_ablate("");
  CHECK(none.exit_code == 2);
  CHECK(contains(none.output, "plugins"));
  const auto help = run_ablate("--help");
  CHECK(help.exit_code == 0);
  CHECK(contains(help.output, "config"));
}

TEST_CASE("every subcommand has --help") {
  for (const char* cmd : {"plugins list", "plugins describe", "config show", "config reference", "data analyze"}) {
    CAPTURE(cmd);
    const auto r = run_ablate(std::string(cmd) + " --help");
    CHECK(r.exit_code == 0);
    CHECK(contains(r.output, "usage: ablate"));
  }
}

TEST_CASE("an unknown command exits 2 with a suggestion") {
  const auto r = run_ablate("confg show x.toml");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "did you mean 'config'?"));
}

TEST_CASE("an unknown subcommand exits 2 with a suggestion and the valid ones") {
  const auto r = run_ablate("plugins lst");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "did you mean 'list'?"));
  CHECK(contains(r.output, "plugins describe"));
}

TEST_CASE("an unknown option exits 2 naming the command") {
  const auto r = run_ablate("plugins list --jsn");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "plugins"));
}

TEST_CASE("plugins list shows every plugin built and no failures") {
  const auto r = run_ablate("plugins list");
  REQUIRE(r.exit_code == 0);
  int plugins = 0;
  for (const auto& entry : fs::directory_iterator(ablate::test::plugin_dir())) {
    // Plugin files only: emulated/ holds the CUDA plugins built for the emulated device, which
    // the loader takes only under ABLATE_EMULATE_CUDA=1 (tests/cuda_emulation/test_emulate_switch.py).
    if (!entry.is_regular_file()) continue;
    CAPTURE(entry.path());
    CHECK(contains(r.output, entry.path().filename().string()));
    ++plugins;
  }
  CHECK(plugins >= 1);
  CHECK_FALSE(contains(r.output, "not loaded"));
  CHECK_FALSE(contains(r.output, "test_"));
}

TEST_CASE("plugins list --json gives components and failures") {
  const auto r = run_ablate("plugins list --json", "ABLATE_PLUGIN_PATH=" + (ablate::test::test_plugin_dir() / "badapi").string());
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  bool single = false;
  for (const auto& c : j["components"]) single = single || (c["kind"] == "communicator" && c["name"] == "single");
  CHECK(single);
  REQUIRE(j["failed"].size() == 1);
  CHECK(contains(j["failed"][0]["reason"].get<std::string>(), "API version 999"));
}

TEST_CASE("plugins found through ABLATE_PLUGIN_PATH are listed") {
  const auto r = run_ablate("plugins list", "ABLATE_PLUGIN_PATH=" + (ablate::test::test_plugin_dir() / "good").string());
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "recorder"));
}

TEST_CASE("plugins describe prints a component's parameters, an unknown name exits 2") {
  const auto r = run_ablate("plugins describe recorder", "ABLATE_PLUGIN_PATH=" + (ablate::test::test_plugin_dir() / "good").string());
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "width"));
  CHECK(contains(r.output, "in [1, 10]"));
  const auto bad = run_ablate("plugins describe singel");
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.output, "did you mean 'single'?"));
}

TEST_CASE("config show prints the resolved quickstart, which reads back to the same") {
  ablate::test::TempDir dir;
  const auto r = run_ablate("config show " + kQuickstart);
  REQUIRE(r.exit_code == 0);
  CHECK(contains(r.output, "[batching.packed]"));
  CHECK(contains(r.output, "grad_accum_steps = 1"));
  const fs::path resolved = dir.write("resolved.toml", r.output);
  const auto again = run_ablate("config show " + resolved.string());
  REQUIRE(again.exit_code == 0);
  CHECK(again.output.substr(again.output.find('\n')) == r.output.substr(r.output.find('\n')));
}

TEST_CASE("a misspelled key under [optimizer] exits 2 with the position and the suggestion 'lr'") {
  ablate::test::TempDir dir;
  const fs::path cfg = dir.write("exp.toml", "[run]\nsteps = 3\n[optimizer]\nlrr = 3e-4\n");
  const auto r = run_ablate("config show " + cfg.string());
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, cfg.string() + ":4:1"));
  CHECK(contains(r.output, "optimizer.lrr"));
  CHECK(contains(r.output, "did you mean 'lr'?"));
}

TEST_CASE("a missing experiment file exits 2 naming it") {
  const auto r = run_ablate("config show /nonexistent/exp.toml");
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "/nonexistent/exp.toml"));
}

TEST_CASE("--set on the command line is typed and checked") {
  const auto ok = run_ablate("config show " + kQuickstart + " --set run.steps=11 --set batching.name=padded");
  REQUIRE(ok.exit_code == 0);
  CHECK(contains(ok.output, "steps = 11"));
  CHECK(contains(ok.output, "name = \"padded\""));
  const auto bad = run_ablate("config show " + kQuickstart + " --set run.steps=eleven");
  CHECK(bad.exit_code == 2);
  CHECK(contains(bad.output, "--set run.steps=eleven"));
}

TEST_CASE("[plugins] paths in the experiment file loads plugins relative to the file") {
  ablate::test::TempDir dir;
  fs::copy(ablate::test::test_plugin_dir() / "good", dir.path() / "myplugins");
  const fs::path cfg = dir.write("exp.toml", "[plugins]\npaths = [\"myplugins\"]\n[logging]\nsinks = [\"recorder\"]\n"
                                             "[logging.recorder]\nwidth = 4\n");
  const auto r = run_ablate("config show " + cfg.string());
  CHECK(r.exit_code == 0);
  CHECK(contains(r.output, "[logging.recorder]"));
  CHECK(contains(r.output, "width = 4"));
}

TEST_CASE("size keys are bounded and floats must be finite: exit 2 naming the key, before anything is allocated") {
  struct Bad {
    const char* set;
    const char* key;
  };
  const Bad cases[] = {
      {"model.vocab_size=9223372036854775807 --set model.vocab_multiple=128", "model.vocab_size"},
      {"run.threads=100000", "run.threads"},
      {"run.threads=2147483648", "run.threads"},
      {"optimizer.lr=inf", "optimizer.lr"},
      {"optimizer.lr=nan", "optimizer.lr"},
      {"model.d_model=65537", "model.d_model"},
      {"batching.batch_size=1099511627776", "batching.batch_size"},
      {"run.grad_accum_steps=100000000", "run.grad_accum_steps"},
  };
  for (const Bad& b : cases) {
    INFO(b.set);
    const auto r = run_ablate("config show " + kQuickstart + " --set " + b.set);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, b.key));
  }
  // The same bound read from a file names the file and line.
  ablate::test::TempDir tmp;
  const fs::path exp = tmp.path() / "huge.toml";
  {
    std::ofstream f(exp);
    f << "[model]\nvocab_size = 9223372036854775807\nvocab_multiple = 128\n";
  }
  const auto r = run_ablate("config show " + exp.string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "huge.toml:2"));
  // A subnormal learning rate is a valid float (it once failed in the formatter's round trip).
  CHECK(run_ablate("config show " + kQuickstart + " --set optimizer.lr=1e-320").exit_code == 0);
}

TEST_CASE("a model whose parameters alone exceed the device is refused by size, exit 2, before allocating") {
  ablate::test::TempDir tmp;
  // Every key within its bound, the product far beyond any machine: about 1.6e13 parameters.
  const auto r = run_ablate("train " + kQuickstart +
                            " --set model.d_model=65536 --set model.n_layers=1024 --set model.n_heads=64"
                            " --set run.steps=1 --run-dir " +
                            (tmp.path() / "run").string());
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, "parameters"));
  CHECK_FALSE(fs::exists(tmp.path() / "run" / "metrics.jsonl"));
}

TEST_CASE("a directory, a FIFO, /dev/zero or an oversized file as the experiment: exit 2 at once, never a default run or a hang") {
  ablate::test::TempDir tmp;
  const fs::path fifo = tmp.path() / "fifo.toml", big = tmp.path() / "big.toml";
  REQUIRE(ablate::test::run_command("mkfifo " + fifo.string()).exit_code == 0);
  {
    std::ofstream f(big);
    f << "# " << std::string(5 << 20, 'x') << "\n";
  }
  for (const std::string& path : {tmp.path().string(), fifo.string(), std::string("/dev/zero"), big.string()}) {
    INFO(path);
    // `timeout` turns a hang into exit 124, which fails the check rather than the suite.
    const auto r = ablate::test::run_command("timeout 20 " + std::string(ABLATE_BINARY) + " train " + path + " --run-dir " +
                                             (tmp.path() / "run").string() + " 2>&1");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, path));
  }
  CHECK_FALSE(fs::exists(tmp.path() / "run" / "metrics.jsonl"));
}

TEST_CASE(
    "a resolved config writes the chosen implementations' sections and those the experiment gave, not every one \"auto\" might pick") {
  // A run's config.toml is read back by eval, sample and export, possibly by a build without the
  // CUDA plugins: an unchosen [run.nccl] there would be an unknown section.
  const auto plain = run_ablate("config show " + kQuickstart);
  REQUIRE(plain.exit_code == 0);
  CHECK_FALSE(contains(plain.output, "[run.nccl]"));
  CHECK_FALSE(contains(plain.output, "[run.mpi]"));
  CHECK(contains(plain.output, "[attention.naive_cpu]"));
  CHECK(contains(plain.output, "[logging.jsonl]"));  // a list selector: every listed sink
  const auto given = run_ablate("config show " + kQuickstart + " --set run.mpi.timeout_s=60");
  CHECK(contains(given.output, "[run.mpi]"));
  CHECK(contains(given.output, "timeout_s = 60"));
}

TEST_CASE("a FIFO, a directory or a symlink to /dev/zero in place of any file ablate reads: exit 2 naming it, at once") {
  // One real run gives the files (config.toml, run.json, summary.json, metrics.jsonl, a
  // checkpoint); each case puts something that is not a regular file in place of one of them in a
  // copy, and runs the command that reads it. `timeout` turns a hang into exit 124.
  ablate::test::TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const auto trained =
      ablate::test::run_command(std::string(ABLATE_BINARY) + " train " + kQuickstart + " --set run.steps=2 --run-dir " + run.string());
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  // A token shard with GPT-2 tokenizer files beside it, and an experiment that reads them.
  fs::create_directories(tmp.path() / "data" / "tokenizer");
  {
    int32_t header[256] = {20240520, 1, 8};
    const uint16_t tokens[8] = {1, 2, 3, 50256, 4, 5, 6, 50256};
    std::ofstream shard(tmp.path() / "data" / "shard.bin", std::ios::binary);
    shard.write(reinterpret_cast<const char*>(header), sizeof header);
    shard.write(reinterpret_cast<const char*>(tokens), sizeof tokens);
  }
  tmp.write("data/tokenizer/encoder.json", "{\"!\": 0}");
  tmp.write("sweep.toml", "base = \"" + kQuickstart + "\"\n[sweep]\nname = \"s\"\n[sweep.grid]\n\"run.seed\" = [1, 2]\n");

  struct Case {
    std::string file;     // relative to the case's copy
    std::string command;  // DIR stands for the copy
  };
  const std::string ckpt = "run/checkpoints/step_00000002/";
  const std::string eval = "eval --checkpoint DIR/run --tokens DIR/data/shard.bin";
  const std::string resume = "train DIR/run/config.toml --run-dir DIR/run --resume --set run.steps=4";
  const std::vector<Case> cases = {
      {"sweep.toml", "config show DIR/sweep.toml"},  // as an experiment file
      {"sweep.toml", "sweep DIR/sweep.toml --out DIR/sweep --dry-run"},
      {ckpt + "state.json", eval},
      {ckpt + "config.toml", eval},
      {ckpt + "model.safetensors", eval},
      {"run/checkpoints/latest", eval},
      {"data/shard.bin", eval},
      {"data/tokenizer/encoder.json", "data analyze DIR/tokens.toml"},
      {"run/config.toml", "doctor DIR/run"},
      {"run/run.json", "doctor DIR/run"},
      {"run/summary.json", "doctor DIR/run"},
      {"run/metrics.jsonl", "doctor DIR/run"},
      {"run/summary.json", "report DIR/run"},
      {"run/metrics.jsonl", "report DIR/run"},
      {"run/summary.json", resume},
      {"run/metrics.jsonl", resume},  // read back to drop what came after the checkpoint
  };
  int n = 0;
  for (const Case& c : cases) {
    for (const std::string bad : {"fifo", "directory", "/dev/zero"}) {
      const fs::path dir = tmp.path() / ("case" + std::to_string(n++));
      fs::create_directories(dir);
      for (const char* part : {"run", "data", "sweep.toml"}) fs::copy(tmp.path() / part, dir / part, fs::copy_options::recursive);
      std::ofstream(dir / "tokens.toml") << "[data]\nname = \"token_shards\"\n[data.token_shards]\npaths = [\""
                                         << (dir / "data" / "shard.bin").string() << "\"]\n";
      const fs::path file = dir / c.file;
      if (c.file == "run/metrics.jsonl" && c.command == resume) fs::remove(dir / "run" / "summary.json");  // not finished
      fs::remove(file);
      if (bad == "fifo") REQUIRE(ablate::test::run_command("mkfifo " + file.string()).exit_code == 0);
      if (bad == "directory") fs::create_directory(file);
      if (bad == "/dev/zero") fs::create_symlink("/dev/zero", file);
      std::string command = c.command;
      for (std::size_t at; (at = command.find("DIR")) != std::string::npos;) command.replace(at, 3, dir.string());
      INFO(bad << " as " << c.file << ": ablate " << command);
      const auto r = ablate::test::run_command("timeout 20 " + std::string(ABLATE_BINARY) + " " + command);
      INFO(r.output);
      CHECK(r.exit_code == 2);
      CHECK(contains(r.output, file.string()));
      CHECK(contains(r.output, "not a regular file"));
    }
  }
  // What the run saved is untouched by the refused resumes.
  CHECK(fs::is_regular_file(run / "checkpoints" / "step_00000002" / "model.safetensors"));
}

// ---- numbers: every one has a range, checked before anything is read or allocated ----

TEST_CASE("every number option is range-checked when the command line is parsed: exit 2 naming the option") {
  struct Case {
    std::string args, option;
  };
  const std::vector<Case> cases = {
      {"sample --checkpoint /nonexistent --top-k -5", "--top-k"},
      {"sample --checkpoint /nonexistent --top-k=-5", "--top-k"},
      {"sample --checkpoint /nonexistent --temperature nan", "--temperature"},
      {"sample --checkpoint /nonexistent --temperature inf", "--temperature"},
      {"sample --checkpoint /nonexistent --temperature -1", "--temperature"},
      {"sample --checkpoint /nonexistent --seed -1", "--seed"},
      {"sample --checkpoint /nonexistent --tokens -1", "--tokens"},
      {"eval --checkpoint /nonexistent --tokens /nonexistent.bin --batch 0", "--batch"},
      {"eval --checkpoint /nonexistent --tokens /nonexistent.bin --batch -5", "--batch"},
      {"eval --checkpoint /nonexistent --tokens /nonexistent.bin --seq-len 0", "--seq-len"},
      {"data analyze " + kQuickstart + " --documents -1", "--documents"},
      {"data analyze " + kQuickstart + " --documents 0", "--documents"},
      {"tune batch-size " + kQuickstart + " --max-batch 0", "--max-batch"},
      {"tune batch-size " + kQuickstart + " --steps 0", "--steps"},
      {"sweep /nonexistent/sweep.toml --parallel 0", "--parallel"},
      {"train " + kQuickstart + " --stop-at 0", "--stop-at"},
      {"report /nonexistent --smooth inf", "--smooth"},
  };
  for (const Case& c : cases) {
    INFO("ablate " << c.args);
    const auto r = ablate::test::run_command("timeout 20 " + std::string(ABLATE_BINARY) + " " + c.args);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, c.option + ": "));
    CHECK(contains(r.output, "out of range"));
  }
  // The range is in --help.
  const auto help = run_ablate("sample --help");
  CHECK(contains(help.output, "--top-k N in [0, 2147483647]"));
}

TEST_CASE("apps/ablate declares its number options only through int_option / float_option") {
  // A number parsed with a bare po::value<...> has no range (a negative wraps in an unsigned one,
  // nan passes a double one): the checked helpers are the one path.
  for (const auto& entry : fs::directory_iterator(fs::path(ABLATE_SOURCE_DIR) / "apps" / "ablate")) {
    if (entry.path().filename() == "main.cpp") continue;  // where the helpers are defined
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const char* bare : {"po::value<int", "po::value<uint", "po::value<double", "po::value<float", "po::value<long",
                             "po::value<unsigned", "po::value<std::size_t", "po::value<size_t"}) {
      INFO(entry.path().string() << " uses " << bare);
      CHECK(!contains(text, bare));
    }
  }
}

TEST_CASE("config keys without a usable range before are refused with the key and the range") {
  struct Case {
    std::string set, key, range;
  };
  const std::vector<Case> cases = {
      {"data.workers=100000000", "data.workers", "[0, 256]"},
      {"data.prefetch=100000000", "data.prefetch", "[1, 1024]"},
      {"batching.packed.window=1000000000000", "batching.packed.window", "[1, 1048576]"},
      {"batching.packed.max_segments_per_row=4294967296", "batching.packed.max_segments_per_row", "[0, 16777216]"},
      {"run.steps=0", "run.steps", "[1, 1000000000000]"},
      {"run.eval_batches=2000000", "run.eval_batches", "[0, 1000000]"},
      {"run.memory_budget_gib=1e300", "run.memory_budget_gib", "[0, 1048576]"},
      {"data.token_shards.eot=2147483648", "data.token_shards.eot", "[0, 65535]"},
      {"data.synthetic_probes.max_length=4294967296", "data.synthetic_probes.max_length", "[1, 16777216]"},
      {"batching.bucketed.token_budget=4294967296", "batching.bucketed.token_budget", "[0, 2147483647]"},
      {"batching.bucketed.growth=1e300", "batching.bucketed.growth", "[1.05, 1024]"},
  };
  for (const Case& c : cases) {
    INFO("--set " << c.set);
    const auto r = run_ablate("config show " + kQuickstart + " --set " + c.set);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, c.key + ": "));
    CHECK(contains(r.output, c.range));
  }
  // In a file, the error names file:line.
  ablate::test::TempDir dir;
  const fs::path cfg = dir.write("exp.toml", "[data]\nworkers = 100000000\n");
  const auto r = run_ablate("config show " + cfg.string());
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, cfg.string() + ":2:"));
  CHECK(contains(r.output, "data.workers"));
}

TEST_CASE("a batch_size x seq_len product no memory holds is exit 2 before anything is allocated") {
  ablate::test::TempDir dir;
  // Past 32-bit positions: refused by the config itself, at the key's line.
  const fs::path cfg =
      dir.write("exp.toml", "[model]\nmax_seq_len = 16777216\n[batching]\nbatch_size = 1048576\nseq_len = 16777216\n");
  const auto r = run_ablate("config show " + cfg.string());
  CHECK(r.exit_code == 2);
  CHECK(contains(r.output, cfg.string() + ":4:"));
  CHECK(contains(r.output, "batch_size x seq_len"));
  // Within 32 bits but past the memory budget: train and data analyze refuse it before building a
  // batch (a virtual-memory cap turns an attempt into a bad_alloc the test would see).
  const std::string sizes = " --set batching.batch_size=16384 --set batching.seq_len=16384 --set model.max_seq_len=16384"
                            " --set run.memory_budget_gib=1 --set run.threads=1";
  for (const std::string& command :
       {"train " + kQuickstart + sizes + " --run-dir " + (dir.path() / "run").string(), "data analyze " + kQuickstart + sizes}) {
    INFO("ablate " << command);
    const auto t = ablate::test::run_command("ulimit -v 4000000; timeout 20 " + std::string(ABLATE_BINARY) + " " + command);
    INFO(t.output);
    CHECK(t.exit_code == 2);
    CHECK(contains(t.output, "batching.batch_size"));
    CHECK(contains(t.output, "batch buffers"));
    CHECK(!contains(t.output, "bad_alloc"));
  }
}

TEST_CASE("checkpoints are validated, not trusted: NaN weights, bad state.json, `latest` outside the run, run.steps below the step") {
  // One run stopped at step 2 of 4 (a checkpoint, no finished summary); each case damages a copy.
  ablate::test::TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const auto trained = ablate::test::run_command(std::string(ABLATE_BINARY) + " train " + kQuickstart +
                                                 " --set run.steps=4 --stop-at 2 --run-dir " + run.string());
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  const std::string step = "step_00000002";
  int n = 0;
  const auto copy = [&] {
    const fs::path dir = tmp.path() / ("case" + std::to_string(n++));
    fs::copy(run, dir, fs::copy_options::recursive);
    return dir;
  };
  const auto shard = tmp.path() / "shard.bin";
  {
    int32_t header[256] = {20240520, 1, 8};
    const uint16_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    std::ofstream out(shard, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header), sizeof header);
    out.write(reinterpret_cast<const char*>(tokens), sizeof tokens);
  }
  const auto eval = [&](const fs::path& dir, const std::string& extra = "") {
    return ablate::test::run_command("timeout 60 " + std::string(ABLATE_BINARY) + " eval --checkpoint " + dir.string() + " --tokens " +
                                     shard.string() + " --seq-len 4" + extra);
  };
  const auto sample = [&](const fs::path& dir, const std::string& extra = "") {
    return ablate::test::run_command("timeout 60 " + std::string(ABLATE_BINARY) + " sample --checkpoint " + dir.string() +
                                     " --tokens 4" + extra);
  };
  const auto resume = [&](const fs::path& dir, const std::string& steps = "4") {
    return ablate::test::run_command("timeout 60 " + std::string(ABLATE_BINARY) + " train " + (dir / "config.toml").string() +
                                     " --run-dir " + dir.string() + " --resume --set run.steps=" + steps);
  };
  // Writes `value` as the f32 at `index` of tensor `which` (the first one when empty) of a
  // safetensors file, by its header's offsets; returns the tensor's name.
  const auto plant = [](const fs::path& file, float value, std::string which = "") {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t len = 0;
    f.read(reinterpret_cast<char*>(&len), 8);
    std::string text(len, '\0');
    f.read(text.data(), std::streamsize(len));
    const auto header = nlohmann::json::parse(text);
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__" || !(which.empty() || which == it.key()) || it.value()["dtype"] != "F32") continue;
      which = it.key();
      f.seekp(std::streamoff(8 + len + it.value()["data_offsets"][0].get<uint64_t>() + 4));  // index 1
      f.write(reinterpret_cast<const char*>(&value), 4);
      return which;
    }
    return std::string();
  };

  {  // a NaN in a weight: eval, sample and --resume refuse naming the tensor and index; --allow-nonfinite reads it
    const fs::path dir = copy();
    const fs::path model = dir / "checkpoints" / step / "model.safetensors";
    const std::string name = plant(model, std::nanf(""));
    REQUIRE(!name.empty());
    for (const auto& r : {eval(dir), sample(dir), resume(dir)}) {
      INFO(r.output);
      CHECK(r.exit_code == 2);
      CHECK(contains(r.output, model.string()));
      CHECK(contains(r.output, "tensor '" + name + "' holds NaN at index 1"));
    }
    for (const auto& r : {eval(dir, " --allow-nonfinite"), sample(dir, " --allow-nonfinite")}) {
      INFO(r.output);
      CHECK(r.exit_code == 0);
      CHECK(contains(r.output, "--allow-nonfinite"));
    }
    CHECK(fs::exists(dir / "checkpoints" / step / "state.json"));  // nothing saved is lost
  }
  {  // an infinity in an optimizer moment: --resume refuses naming the file and tensor
    const fs::path dir = copy();
    const fs::path opt = dir / "checkpoints" / step / "optimizer.safetensors";
    const std::string name = plant(opt, INFINITY);
    REQUIRE(!name.empty());
    const auto r = resume(dir);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, opt.string()));
    CHECK(contains(r.output, "tensor '" + name + "' holds +inf at index 1"));
  }
  {  // state.json fields of the wrong type or out of range are refused naming the field
    struct Bad {
      std::string field, value, expect;
    };
    const std::vector<Bad> bads = {
        {"step", "\"two\"", "'step' is \"two\""},
        {"step", "-3", "'step' is -3"},
        {"step", "2.5", "'step' is 2.5"},
        {"seed", "-1", "'seed' is -1"},
        {"seed", "true", "'seed' is true"},
        {"draw", "-5", "'data_cursor.draw' is -5"},
        {"draw", "\"x\"", "'data_cursor.draw' is \"x\""},
        {"pending", "[[0, 5, 2]]", "an empty piece"},
        {"pending", "[[0, -1, 2]]", "'data_cursor.pending[0][1] (begin)' is -1"},
        {"pending", "[[\"a\", 0, 2]]", "'data_cursor.pending[0][0] (document)' is \"a\""},
    };
    for (const Bad& b : bads) {
      const fs::path dir = copy();
      const fs::path state = dir / "checkpoints" / step / "state.json";
      auto j = nlohmann::json::parse(std::ifstream(state));
      const auto value = nlohmann::json::parse(b.value);
      if (b.field == "draw" || b.field == "pending") {
        j["data_cursor"][b.field] = value;
        j["data_cursors"][0][b.field] = value;
      } else {
        j[b.field] = value;
      }
      std::ofstream(state) << j.dump();
      for (const auto& r : {eval(dir), resume(dir)}) {
        INFO(b.field << " = " << b.value << ": " << r.output);
        CHECK(r.exit_code == 2);
        CHECK(contains(r.output, state.string()));
        CHECK(contains(r.output, b.expect));
      }
    }
  }
  {  // pending document indices past the data are refused by --resume with the count
    const fs::path dir = copy();
    const fs::path state = dir / "checkpoints" / step / "state.json";
    auto j = nlohmann::json::parse(std::ifstream(state));
    j["data_cursor"]["pending"] = nlohmann::json::array({nlohmann::json::array({999999999999ULL, 0, 2})});
    j["data_cursors"][0]["pending"] = j["data_cursor"]["pending"];
    std::ofstream(state) << j.dump();
    const auto r = resume(dir);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, state.string()));
    CHECK(contains(r.output, "document 999999999999"));
    CHECK(contains(r.output, "training documents"));
  }
  {  // `latest` naming a path outside the run directory is refused
    for (const std::string& target :
         {std::string("../elsewhere"), std::string(".."), (tmp.path() / "run" / "checkpoints" / step).string()}) {
      const fs::path dir = copy();
      fs::create_directories(dir / "elsewhere");
      fs::copy(dir / "checkpoints" / step, dir / "elsewhere", fs::copy_options::recursive);
      std::ofstream(dir / "checkpoints" / "latest") << target << "\n";
      for (const auto& r : {eval(dir), resume(dir)}) {
        INFO(target << ": " << r.output);
        CHECK(r.exit_code == 2);
        CHECK(contains(r.output, (dir / "checkpoints" / "latest").string()));
        CHECK(contains(r.output, "expected the name of a checkpoint directory inside"));
      }
    }
    const fs::path dir = copy();  // a symlink under checkpoints/ that leads out
    fs::create_directory_symlink(tmp.path() / "run" / "checkpoints" / step, dir / "checkpoints" / "step_00000099");
    std::ofstream(dir / "checkpoints" / "latest") << "step_00000099\n";
    const auto r = eval(dir);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "outside"));
  }
  {  // --resume with run.steps below the checkpoint's step is refused with both numbers
    const fs::path dir = copy();
    const auto r = resume(dir, "1");
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(contains(r.output, "the checkpoint is at step 2 but run.steps is 1"));
    CHECK(fs::exists(dir / "checkpoints" / step / "model.safetensors"));
    const auto ok = resume(dir, "4");  // and the run still resumes
    INFO(ok.output);
    CHECK(ok.exit_code == 0);
  }
}
