// Experiment configuration: each error class names file:line:col (or the --set), the key path, what
// was expected and a suggestion; --set is typed by the schema; the resolved config round-trips.
// Components are registered in-process here, so these tests do not depend on any plugin library.
#include <doctest/doctest.h>

#include <cstdlib>
#include <optional>

#include "ablate/runtime/session.hpp"
#include "ablate/runtime/run_spec.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/trainer.hpp"
#include "test_support.hpp"

using namespace ablate;

namespace {

void add(Registry& r, Kind kind, const std::string& name, Schema schema = {}) {
  r.add(ComponentInfo{kind,
                      name,
                      "1.0",
                      "test component",
                      std::move(schema),
                      [](const ComponentArgs&) -> std::unique_ptr<Component> { return nullptr; },
                      "",
                      {}},
        "test");
}

struct Fixture {
  Registry registry;
  Fixture() {
    using namespace param;
    add(registry, Kind::data_source, "synthetic_probes", {integer("documents", 1000, "docs").at_least(1)});
    add(registry, Kind::sampler, "shuffled", {integer("buffer", 0, "window").at_least(0)});
    add(registry, Kind::batcher, "padded");
    add(registry, Kind::batcher, "packed",
        {string("strategy", "best_fit", "how").one_of({"first_fit", "best_fit"}),
         integer("max_segments_per_row", 8, "segments").at_least(1)});
    add(registry, Kind::batcher, "bucketed", {int_list("boundaries", {256, 512, 1024}, "bounds").at_least(1)});
    add(registry, Kind::communicator, "single");
    add(registry, Kind::optimizer, "adamw");
    add(registry, Kind::optimizer, "sgd");
    for (const char* shape : {"constant", "cosine", "linear"}) add(registry, Kind::schedule, shape);
    add(registry, Kind::attention, "naive_cpu");
    add(registry, Kind::logger, "console");
    add(registry, Kind::logger, "jsonl", {string("file", "metrics.jsonl", "name")});
    add(registry, Kind::evaluator, "multiple_choice",
        {string("path", "", "items"), string("normalization", "mean", "score").one_of({"mean", "sum"})});
  }
  Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
    return Config::parse(text, "exp.toml", overrides, registry);
  }
  // The message of the input error `text` (with `overrides`) raises.
  std::string error(const std::string& text, const std::vector<std::string>& overrides = {}) {
    try {
      parse(text, overrides);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::input);
      CHECK(e.exit_code() == 2);
      return e.what();
    }
    FAIL("expected an input error");
    return "";
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE_FIXTURE(Fixture, "an empty experiment resolves with every default filled in") {
  const Config c = parse("");
  CHECK(c.section("run").get_int("steps") == 100);
  CHECK(c.section("run").get_string("device") == "cpu");
  CHECK(c.selected("batching") == "packed");
  CHECK(c.implementation("batching", "packed").get_string("strategy") == "best_fit");
  CHECK(c.selected("data") == "synthetic_probes");
  CHECK(c.implementation("data", "synthetic_probes").get_int("documents") == 1000);
  CHECK(c.selected("run") == "auto");
  CHECK(c.selected_list("logging") == std::vector<std::string>{"console", "jsonl"});
  CHECK(c.selected("optimizer") == "adamw");
  CHECK(c.selected("attention") == "naive_cpu");
}

TEST_CASE_FIXTURE(Fixture, "a misspelled key is refused with file:line:col, the key path and a suggestion") {
  const std::string msg = error("[run]\nsteps = 5\n\n[optimizer]\nname = \"adamw\"\nlrr = 3e-4\n");
  CHECK(contains(msg, "exp.toml:6:1"));
  CHECK(contains(msg, "optimizer.lrr"));
  CHECK(contains(msg, "did you mean 'lr'?"));
}

TEST_CASE_FIXTURE(Fixture, "run.device names a loaded device registration: the list is the registry's, not the schema's") {
  CHECK(parse("[run]\ndevice = \"cpu\"\n").section("run").get_string("device") == "cpu");
  const std::string msg = error("[run]\ndevice = \"cpy\"\n");
  CHECK(contains(msg, "exp.toml:2:"));
  CHECK(contains(msg, "run.device"));
  CHECK(contains(msg, "unknown device 'cpy'; did you mean 'cpu'?"));
  // A plugin's device is served as soon as it is registered: nothing in the schema names it.
  CHECK(contains(error("[run]\ndevice = \"rocm\"\n"), "unknown device 'rocm'"));
  add(registry, Kind::device, "rocm");
  CHECK(parse("[run]\ndevice = \"rocm\"\n").section("run").get_string("device") == "rocm");
}

TEST_CASE("a family's keys live in one table its members share; the old [optimizer] spelling is moved there") {
  using namespace param;
  Registry registry;
  add(registry, Kind::optimizer, "adamw", {floating("beta2", 0.95, "b2"), floating("weight_decay", 0.1, "wd")});
  add(registry, Kind::optimizer, "adamw8bit", {integer("block_size", 256, "block")});
  add(registry, Kind::optimizer, "sgd", {floating("momentum", 0.0, "m")});
  registry.share_keys(Kind::optimizer, "adamw8bit", "adamw");
  add(registry, Kind::data_source, "synthetic_probes");  // the other sections' defaults
  add(registry, Kind::sampler, "shuffled");
  add(registry, Kind::batcher, "packed");
  add(registry, Kind::attention, "naive_cpu");
  add(registry, Kind::schedule, "cosine");
  const auto parse = [&](const std::string& text, const std::vector<std::string>& sets = {}) {
    return Config::parse(text, "exp.toml", sets, registry);
  };
  const auto error = [&](const std::string& text, const std::vector<std::string>& sets = {}) -> std::string {
    try {
      parse(text, sets);
    } catch (const Error& e) {
      CHECK(e.exit_code() == 2);
      return e.what();
    }
    FAIL("expected an input error");
    return "";
  };
  // A member reads the family's table with its own: its defaults, or what the experiment gives.
  Config c = parse("[optimizer]\nname = \"adamw8bit\"\n[optimizer.adamw]\nbeta2 = 0.99\n");
  Params own = c.implementation("optimizer", "adamw8bit");
  CHECK(own.get_float("beta2") == 0.99);
  CHECK(own.get_float("weight_decay") == 0.1);
  CHECK(own.get_int("block_size") == 256);
  CHECK(parse("[optimizer]\nname = \"adamw8bit\"\n").implementation("optimizer", "adamw8bit").get_float("beta2") == 0.95);
  // The same experiment moved to the family's head keeps its values.
  CHECK(parse("[optimizer]\nname = \"adamw\"\n[optimizer.adamw]\nbeta2 = 0.99\n")
            .implementation("optimizer", "adamw")
            .get_float("beta2") == 0.99);
  // Written where it used to be, in the file or by --set: moved into the family's table.
  c = parse("[optimizer]\nname = \"adamw8bit\"\nweight_decay = 0.0\n", {"optimizer.beta2=0.9"});
  own = c.implementation("optimizer", "adamw8bit");
  CHECK(own.get_float("weight_decay") == 0.0);
  CHECK(own.get_float("beta2") == 0.9);
  CHECK(contains(c.to_toml(), "[optimizer.adamw]"));
  // Refused: a family key in the member's own table, a key given twice, and the old spelling for
  // an optimizer that has no such key.
  CHECK(contains(error("[optimizer]\nname = \"adamw8bit\"\n[optimizer.adamw8bit]\nbeta2 = 0.9\n"),
                 "'adamw8bit' reads 'beta2' from [optimizer.adamw]"));
  CHECK(contains(error("[optimizer]\nbeta2 = 0.9\n[optimizer.adamw]\nbeta2 = 0.8\n"), "given twice"));
  const std::string msg = error("[optimizer]\nname = \"sgd\"\nweight_decay = 0.1\n");
  CHECK(contains(msg, "exp.toml:3:"));
  CHECK(contains(msg, "'sgd' has no key 'weight_decay'"));
}

TEST_CASE("a layer's own keys live in its table: [model] rope_theta and [adapter] rank, alpha, dropout are moved there") {
  using namespace param;
  Registry registry;
  add(registry, Kind::layer, "rope", {floating("theta", 10000.0, "base")});
  add(registry, Kind::layer, "learned");
  add(registry, Kind::layer, "lora", {integer("rank", 8, "r"), floating("alpha", 16.0, "a"), floating("dropout", 0.0, "p")});
  add(registry, Kind::data_source, "synthetic_probes");  // the other sections' defaults
  add(registry, Kind::sampler, "shuffled");
  add(registry, Kind::batcher, "packed");
  add(registry, Kind::attention, "naive_cpu");
  add(registry, Kind::optimizer, "adamw");
  add(registry, Kind::schedule, "cosine");
  const auto parse = [&](const std::string& text, const std::vector<std::string>& sets = {}) {
    return Config::parse(text, "exp.toml", sets, registry);
  };
  const auto error = [&](const std::string& text) -> std::string {
    try {
      parse(text);
    } catch (const Error& e) {
      CHECK(e.exit_code() == 2);
      return e.what();
    }
    FAIL("expected an input error");
    return "";
  };
  // The new spelling, and the chosen layer's default where the experiment gives none.
  CHECK(parse("[model]\nposition = \"rope\"\n[model.rope]\ntheta = 500.0\n").implementation("model", "rope").get_float("theta") ==
        500.0);
  CHECK(parse("[model]\nposition = \"rope\"\n").implementation("model", "rope").get_float("theta") == 10000.0);
  // The old one, in the file or by --set: moved (and renamed) into the position layer's table.
  Config c = parse("[model]\nposition = \"rope\"\nrope_theta = 500000.0\n");
  CHECK(c.implementation("model", "rope").get_float("theta") == 500000.0);
  CHECK(contains(c.to_toml(), "[model.rope]"));
  CHECK_FALSE(contains(c.to_toml(), "rope_theta"));
  c = parse("[adapter]\nname = \"lora\"\nrank = 4\n", {"adapter.alpha=8", "adapter.dropout=0.1"});
  const Params lora = c.implementation("adapter", "lora");
  CHECK(lora.get_int("rank") == 4);
  CHECK(lora.get_float("alpha") == 8.0);
  CHECK(lora.get_float("dropout") == 0.1);
  // The old key beside a position layer without it (older resolved configs wrote it for every
  // model, learned positions included, which never read it): dropped, as it had no effect.
  c = parse("[model]\nposition = \"learned\"\nrope_theta = 10000.0\n");
  CHECK_FALSE(contains(c.to_toml(), "theta"));
  // Refused: the old key for an adapter without it, and a key given in both places.
  add(registry, Kind::layer, "dora", {integer("rank", 8, "r")});
  const std::string msg = error("[adapter]\nname = \"dora\"\nalpha = 2.0\n");
  CHECK(contains(msg, "exp.toml:3:"));
  CHECK(contains(msg, "'dora' has no key 'alpha': adapter.alpha is now [adapter.<name>] alpha"));
  CHECK(contains(error("[adapter]\nname = \"lora\"\nrank = 4\n[adapter.lora]\nrank = 8\n"), "given twice"));
}

TEST_CASE_FIXTURE(Fixture, "a wrong type names what was expected and what was given") {
  const std::string msg = error("[run]\nsteps = \"ten\"\n");
  CHECK(contains(msg, "exp.toml:2:9"));
  CHECK(contains(msg, "run.steps"));
  CHECK(contains(msg, "expected an int in [1, 1000000000000]"));
  CHECK(contains(msg, "got a string"));
}

TEST_CASE_FIXTURE(Fixture, "an out-of-range value names the range") {
  const std::string msg = error("[batching]\nbatch_size = 0\n");
  CHECK(contains(msg, "exp.toml:2:14"));
  CHECK(contains(msg, "batching.batch_size"));
  CHECK(contains(msg, "out of range"));
  CHECK(contains(msg, "in [1, 1048576]"));
}

TEST_CASE_FIXTURE(Fixture, "a float where an int is expected is a type error, an int where a float is expected is fine") {
  CHECK(contains(error("[run]\nsteps = 1.5\n"), "expected an int"));
  CHECK(parse("[optimizer]\nname = \"adamw\"\nlr = 1\n").section("optimizer").get_float("lr") == 1.0);
}

TEST_CASE_FIXTURE(Fixture, "an unknown plugin name lists the valid names of its kind") {
  const std::string msg = error("[batching]\nname = \"pakced\"\n");
  CHECK(contains(msg, "exp.toml:2:8"));
  CHECK(contains(msg, "batching.name"));
  CHECK(contains(msg, "unknown batcher 'pakced'"));
  CHECK(contains(msg, "did you mean 'packed'?"));
  CHECK(contains(msg, "valid: bucketed, packed, padded"));
}

TEST_CASE_FIXTURE(Fixture, "an unknown section is refused with a suggestion") {
  const std::string msg = error("[optimiser]\nlr = 1\n");
  CHECK(contains(msg, "exp.toml:1:2"));
  CHECK(contains(msg, "did you mean 'optimizer'?"));
}

TEST_CASE_FIXTURE(Fixture, "a typo in the sub-table of an implementation not chosen is still caught") {
  const std::string msg = error("[batching]\nname = \"padded\"\n[batching.packed]\nstrategy = \"best_fti\"\n");
  CHECK(contains(msg, "exp.toml:4:12"));
  CHECK(contains(msg, "batching.packed.strategy"));
  CHECK(contains(msg, "did you mean 'best_fit'?"));
}

TEST_CASE_FIXTURE(Fixture, "a sub-table named after no implementation is refused") {
  const std::string msg = error("[batching.pakced]\nstrategy = \"best_fit\"\n");
  CHECK(contains(msg, "no batcher named 'pakced'"));
  CHECK(contains(msg, "did you mean 'packed'?"));
}

TEST_CASE_FIXTURE(Fixture, "an implementation's key put at the section level says where it belongs") {
  const std::string msg = error("[batching]\nname = \"packed\"\nstrategy = \"first_fit\"\n");
  CHECK(contains(msg, "belongs in [batching.packed]"));
}

TEST_CASE_FIXTURE(Fixture, "a component section that names no implementation gets its default") {
  const Config c = parse("[optimizer]\nlr = 1e-3\n");
  CHECK(c.selected("optimizer") == "adamw");
  CHECK(c.selected("attention") == "naive_cpu");
  CHECK(c.section("optimizer").get_float("lr") == 1e-3);
}

TEST_CASE_FIXTURE(Fixture, "a TOML syntax error names file, line and column") {
  const std::string msg = error("[run]\nsteps = = 3\n");
  CHECK(contains(msg, "exp.toml:2:"));
  CHECK(contains(msg, "TOML syntax error"));
}

TEST_CASE_FIXTURE(Fixture, "--set values are typed by the schema") {
  const Config c = parse("", {"run.steps=7", "optimizer.name=adamw", "optimizer.lr=3", "model.bias=false", "batching.name=bucketed",
                              "batching.bucketed.boundaries=[128, 384]", "logging.sinks=console,jsonl",
                              "data.synthetic_probes.documents=5", "model.norm=rmsnorm"});
  CHECK(c.section("run").get_int("steps") == 7);
  CHECK(c.section("optimizer").get_float("lr") == 3.0);
  CHECK(c.section("model").get_bool("bias") == false);
  CHECK(c.section("model").get_string("norm") == "rmsnorm");
  CHECK(c.selected("batching") == "bucketed");
  CHECK(c.implementation("batching", "bucketed").get_int_list("boundaries") == std::vector<int64_t>{128, 384});
  CHECK(c.selected_list("logging") == std::vector<std::string>{"console", "jsonl"});
  CHECK(c.implementation("logging", "jsonl").get_string("file") == "metrics.jsonl");
  CHECK(c.implementation("data", "synthetic_probes").get_int("documents") == 5);
}

TEST_CASE_FIXTURE(Fixture, "RunSpec::from reads every key the runtime uses once, typed, with each choice and its own keys") {
  const RunSpec s = RunSpec::from(
      parse("[run]\nsteps = 12\n[batching]\nname = \"bucketed\"\n",
            {"run.seed=41", "run.grad_accum_steps=3", "run.memory_budget_gib=1.5", "run.eval_every=4", "batching.batch_size=6",
             "batching.seq_len=96", "batching.bucketed.boundaries=[32, 96]", "optimizer.name=sgd", "optimizer.lr=0.25",
             "optimizer.grad_clip=2", "logging.sinks=console,jsonl", "logging.jsonl.file=m.jsonl", "data.workers=3", "data.prefetch=5",
             "checkpoint.keep=2", "metrics.peak_tflops=7", "schedule.name=linear"}));
  CHECK(s.run.steps == 12);
  CHECK(s.run.seed == 41);
  CHECK(s.run.grad_accum_steps == 3);
  CHECK(s.run.eval_every == 4);
  CHECK(s.memory_budget_configured());
  CHECK(s.memory_budget_bytes() == int64_t(1.5 * double(1ll << 30)));
  CHECK(s.batch_size == 6);
  CHECK(s.seq_len == 96);
  CHECK(s.batching.name == "bucketed");
  CHECK(s.batching.own.get_int_list("boundaries") == std::vector<int64_t>{32, 96});
  CHECK(s.batching_own.count("bucketed") == 1);
  CHECK(s.optimizer.name == "sgd");
  CHECK(s.lr == 0.25);
  CHECK(s.grad_clip == 2.0);
  CHECK(s.schedule.name == "linear");
  REQUIRE(s.loggers.size() == 2);
  CHECK(s.loggers[0].name == "console");
  CHECK(s.loggers[1].name == "jsonl");
  CHECK(s.loggers[1].own.get_string("file") == "m.jsonl");
  CHECK(s.data.name == "synthetic_probes");
  CHECK(s.data_workers == 3);
  CHECK(s.data_prefetch == 5);
  CHECK(s.checkpoint_keep == 2);
  CHECK(s.peak_tflops == 7.0);
  CHECK(s.communicator("single").name == "single");
  CHECK(s.config_hash ==
        parse("[run]\nsteps = 12\n[batching]\nname = \"bucketed\"\n",
              {"run.seed=41", "run.grad_accum_steps=3", "run.memory_budget_gib=1.5", "run.eval_every=4", "batching.batch_size=6",
               "batching.seq_len=96", "batching.bucketed.boundaries=[32, 96]", "optimizer.name=sgd", "optimizer.lr=0.25",
               "optimizer.grad_clip=2", "logging.sinks=console,jsonl", "logging.jsonl.file=m.jsonl", "data.workers=3",
               "data.prefetch=5", "checkpoint.keep=2", "metrics.peak_tflops=7", "schedule.name=linear"})
            .hash());
  CHECK(s.config_source == "exp.toml");
  CHECK(!RunSpec::from(parse("")).memory_budget_configured());
}

TEST_CASE_FIXTURE(Fixture, "--set overrides what the file says") {
  const Config c = parse("[run]\nsteps = 5\n", {"run.steps=9"});
  CHECK(c.section("run").get_int("steps") == 9);
}

TEST_CASE_FIXTURE(Fixture, "a bad --set names the assignment, the expectation and a suggestion") {
  std::string msg = error("", {"run.steps=abc"});
  CHECK(contains(msg, "--set run.steps=abc"));
  CHECK(contains(msg, "not an int"));
  msg = error("", {"optimizer.lrr=1"});
  CHECK(contains(msg, "--set optimizer.lrr=1"));
  CHECK(contains(msg, "did you mean 'lr'?"));
  msg = error("", {"model.bias=maybe"});
  CHECK(contains(msg, "not a bool"));
  msg = error("", {"batching.batch_size=-3"});
  CHECK(contains(msg, "--set batching.batch_size=-3"));
  CHECK(contains(msg, "out of range"));
  msg = error("", {"batching.name=pakced"});
  CHECK(contains(msg, "--set batching.name=pakced"));
  CHECK(contains(msg, "did you mean 'packed'?"));
}

TEST_CASE_FIXTURE(Fixture, "the resolved config round-trips through its TOML") {
  const Config first = parse("[batching]\nname = \"bucketed\"\n[batching.packed]\nstrategy = \"first_fit\"\n"
                             "[optimizer]\nname = \"adamw\"\nlr = 0.00025\n[logging]\nsinks = [\"jsonl\"]\n",
                             {"data.synthetic_probes.documents=12"});
  const std::string text = first.to_toml();
  const Config second = Config::parse(text, "resolved.toml", {}, registry);
  const auto body = [](const std::string& t) { return t.substr(t.find('\n') + 1); };
  CHECK(body(second.to_toml()) == body(text));
  CHECK(second.hash() == first.hash());
  CHECK(second.section("optimizer").get_float("lr") == 0.00025);
  CHECK(second.implementation("batching", "packed").get_string("strategy") == "first_fit");
}

TEST_CASE_FIXTURE(Fixture, "strings with newlines and quotes survive the round trip") {
  add(registry, Kind::data_source, "text_files", {param::string("separator", "\n\n", "split on this")});
  const Config first = parse("[data]\nname = \"text_files\"\n[data.text_files]\nseparator = \"a\\\"b\\n\\tc\"\n");
  const Config second = Config::parse(first.to_toml(), "resolved.toml", {}, registry);
  CHECK(second.implementation("data", "text_files").get_string("separator") == "a\"b\n\tc");
}

namespace {

// Sets (or, with nullptr, unsets) an environment variable for one scope, then puts it back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

const DeviceCapabilities kCpu = [] {  // the cpu device's answers: mpi for several ranks
  DeviceCapabilities c;
  c.collective = "mpi";
  return c;
}();

std::string resolve_communicator_of(const Config& config, const DeviceCapabilities& device) {
  static const Registry none;
  const RunSpec spec = RunSpec::from(config);
  return Session(spec, none, RunContext{}).communicator_name(device);
}

TEST_CASE_FIXTURE(Fixture, "communicator auto follows the launcher's environment, and single under a launcher is refused") {
  ScopedEnv ompi_rank("OMPI_COMM_WORLD_RANK", nullptr), ompi("OMPI_COMM_WORLD_SIZE", nullptr),
      ompi_local("OMPI_COMM_WORLD_LOCAL_RANK", nullptr), procid("SLURM_PROCID", nullptr), ntasks("SLURM_NTASKS", nullptr),
      localid("SLURM_LOCALID", nullptr);
  CHECK(resolve_communicator_of(parse(""), kCpu) == "single");
  {
    ScopedEnv rank("OMPI_COMM_WORLD_RANK", "2"), four("OMPI_COMM_WORLD_SIZE", "4");
    CHECK(resolve_communicator_of(parse(""), kCpu) == "mpi");
    DeviceCapabilities gpu;
    gpu.collective = "nccl";
    CHECK(resolve_communicator_of(parse(""), gpu) == "nccl");
    try {  // a device that names no collective: the job must name its communicator
      resolve_communicator_of(parse(""), DeviceCapabilities{});
      FAIL("expected an input error");
    } catch (const Error& e) {
      CHECK(e.exit_code() == 2);
      CHECK(contains(e.what(), "names no collective; set run.communicator"));
    }
    try {
      resolve_communicator_of(parse("[run]\ncommunicator = \"single\"\n"), kCpu);
      FAIL("expected an input error");
    } catch (const Error& e) {
      CHECK(e.exit_code() == 2);
      CHECK(contains(e.what(), "run.communicator"));
      CHECK(contains(e.what(), "started 4 ranks"));
    }
  }
  {
    ScopedEnv rank("OMPI_COMM_WORLD_RANK", "0"), one("OMPI_COMM_WORLD_SIZE", "1");
    CHECK(resolve_communicator_of(parse(""), kCpu) == "single");
  }
  {
    ScopedEnv rank("OMPI_COMM_WORLD_RANK", "5"), two("OMPI_COMM_WORLD_SIZE", "2");  // malformed: an input error
    try {
      resolve_communicator_of(parse(""), kCpu);
      FAIL("expected an input error");
    } catch (const Error& e) {
      CHECK(e.exit_code() == 2);
      CHECK(contains(e.what(), "OMPI_COMM_WORLD_RANK=5 is not below OMPI_COMM_WORLD_SIZE=2"));
    }
  }
  {
    ScopedEnv r("SLURM_PROCID", "0"), n("SLURM_NTASKS", "3");
    CHECK(resolve_communicator_of(parse(""), kCpu) == "mpi");
  }
  {
    ScopedEnv n("SLURM_NTASKS", "3");  // without SLURM_PROCID this process is no Slurm task
    CHECK(resolve_communicator_of(parse(""), kCpu) == "single");
  }
}

TEST_CASE_FIXTURE(Fixture, "a chosen layer's own keys live in [model.<layer>], checked against its schema") {
  using namespace param;
  add(registry, Kind::layer, "layernorm");
  add(registry, Kind::layer, "gelu_mlp");
  add(registry, Kind::layer, "learned");
  add(registry, Kind::layer, "scaled", {floating("init", 1.0, "first value").within(0.0, 10.0)});
  // Defaults for the chosen layer; a layer without keys writes no table (the text and hash of a
  // config naming only such layers stay what they were).
  const Config plain = parse("");
  CHECK_FALSE(contains(plain.to_toml(), "[model."));
  const Config chosen = parse("[model]\nnorm = \"scaled\"\n");
  CHECK(chosen.implementation("model", "scaled").get_float("init") == 1.0);
  CHECK(contains(chosen.to_toml(), "[model.scaled]\ninit = 1"));
  CHECK(parse("[model]\nnorm = \"scaled\"\n[model.scaled]\ninit = 2.5\n").implementation("model", "scaled").get_float("init") == 2.5);
  CHECK(parse("[model]\nnorm = \"scaled\"\n", {"model.scaled.init=3"}).implementation("model", "scaled").get_float("init") == 3.0);
  CHECK(chosen.has_implementation("model", "scaled"));
  CHECK_FALSE(chosen.has_implementation("model", "layernorm"));
  // Refused: a key the layer does not declare, a value out of its range, a table for no layer.
  const std::string unknown = error("[model]\nnorm = \"scaled\"\n[model.scaled]\ninital = 2\n");
  CHECK(contains(unknown, "model.scaled.inital"));
  CHECK(contains(unknown, "did you mean 'init'"));
  CHECK(contains(error("[model.scaled]\ninit = 20.0\n"), "model.scaled.init"));
  const std::string none = error("[model.scald]\ninit = 2\n");
  CHECK(contains(none, "no layer named 'scald'"));
  CHECK(contains(none, "did you mean 'scaled'"));
}

// ---- [[eval]] tables ---------------------------------------------------------------------

const char* kTwoEvals = "[[eval]]\nname = \"multiple_choice\"\nlabel = \"rows\"\npath = \"a.jsonl\"\n\n"
                        "[[eval]]\nname = \"multiple_choice\"\nevery = 50\nnormalization = \"sum\"\n";

TEST_CASE_FIXTURE(Fixture, "[[eval]] tables resolve in order with their labels, common keys and evaluator keys") {
  const Config c = parse(kTwoEvals);
  const std::vector<Config::EvalEntry> evals = c.evals();
  REQUIRE(evals.size() == 2);
  CHECK(evals[0].common.get_string("label") == "rows");
  CHECK(evals[0].common.get_int("every") == 0);
  CHECK(evals[0].common.get_bool("enabled"));
  CHECK(evals[0].own.get_string("normalization") == "mean");
  CHECK(evals[1].common.get_string("label") == "multiple_choice");  // the name, by default
  CHECK(evals[1].common.get_int("every") == 50);
  CHECK(evals[1].own.get_string("normalization") == "sum");
  CHECK(evals[1].own.path() == "eval.multiple_choice");
  const RunSpec spec = RunSpec::from(c);
  REQUIRE(spec.evals.size() == 2);
  CHECK(spec.evals[0].name == "multiple_choice");
}

TEST_CASE_FIXTURE(Fixture, "[[eval]] tables round-trip through the resolved TOML and change the hash") {
  const Config first = parse(kTwoEvals);
  const Config second = Config::parse(first.to_toml(), "resolved.toml", {}, registry);
  CHECK(second.to_toml().substr(second.to_toml().find('\n')) == first.to_toml().substr(first.to_toml().find('\n')));
  CHECK(first.hash() != parse("").hash());
  CHECK(parse(kTwoEvals, {"eval.rows.enabled=false"}).hash() != first.hash());
}

TEST_CASE_FIXTURE(Fixture, "--set eval.LABEL.KEY is typed by the common keys or the evaluator's schema") {
  const Config c = parse(kTwoEvals, {"eval.rows.every=7", "eval.rows.normalization=sum", "eval.multiple_choice.enabled=false"});
  CHECK(c.evals()[0].common.get_int("every") == 7);
  CHECK(c.evals()[0].own.get_string("normalization") == "sum");
  CHECK_FALSE(c.evals()[1].common.get_bool("enabled"));
  CHECK(contains(error(kTwoEvals, {"eval.rows.every=soon"}), "'soon' is not"));
  const std::string unknown = error(kTwoEvals, {"eval.rws.every=7"});
  CHECK(contains(unknown, "--set eval.rws.every=7"));
  CHECK(contains(unknown, "did you mean 'rows'?"));
  CHECK(contains(error(kTwoEvals, {"eval.rows.normalisation=sum"}), "did you mean 'normalization'?"));
  CHECK(contains(error("", {"eval.rows.every=1"}), "no [[eval]] table"));
}

TEST_CASE_FIXTURE(Fixture, "bad [[eval]] tables name the file, line and what was expected") {
  CHECK(contains(error("[[eval]]\nlabel = \"x\"\n"), "missing key 'name'"));
  const std::string unknown = error("[[eval]]\nname = \"multiple_chioce\"\n");
  CHECK(contains(unknown, "exp.toml:2:8"));
  CHECK(contains(unknown, "did you mean 'multiple_choice'?"));
  CHECK(contains(error("[[eval]]\nname = \"multiple_choice\"\nlabel = \"Rows!\"\n"), "is not a label"));
  const std::string twice = error(std::string(kTwoEvals) + "label = \"rows\"\n");
  CHECK(contains(twice, "exp.toml:"));
  CHECK(contains(twice, "the label of another [[eval]]"));
  CHECK(contains(error("[[eval]]\nname = \"multiple_choice\"\nevery = -1\n"), "eval.multiple_choice.every"));
  CHECK(contains(error("eval = 3\n"), "expected [[eval]] tables"));
  CHECK(contains(error("[eval]\nname = \"multiple_choice\"\n"), "expected [[eval]] tables"));
}
