// The composition root (session.hpp): every component of an experiment made from its RunSpec.
#include "ablate/runtime/session.hpp"

#include "ablate/communicator.hpp"
#include "ablate/device.hpp"
#include "ablate/error.hpp"
#include "ablate/evaluator.hpp"
#include "ablate/launch_env.hpp"
#include "ablate/logger.hpp"
#include "ablate/optimizer.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/schedule.hpp"
#include "ablate/runtime/defaults.hpp"

#include <spdlog/spdlog.h>

namespace ablate {

Session::Session(const RunSpec& spec, const Registry& registry) : Session(spec, registry, spec.context()) {}

Session::Session(const RunSpec& spec, const Registry& registry, RunContext run)
    : spec_(spec), registry_(registry), run_(std::move(run)) {}

void Session::set_ranks(int rank, int world) {
  run_.rank = rank;
  run_.world = world;
}

void Session::set_threads(int threads) { run_.threads = threads; }

std::unique_ptr<Device> Session::device() const {
  static const Params empty{"run", {}};
  auto device = registry_.create<Device>(Kind::device, run_.device, {empty, empty, run_}, "run.device");
  // A device computing in fp32 would train in fp32 and report itself against a bf16 or tf32 peak.
  const DeviceCapabilities can = device->capabilities();
  if (run_.dtype != "fp32" && !can.reduced_precision_products) {
    const std::string what = run_.dtype == "bf16"    ? "bf16 products with fp32 master weights"
                             : fp8_dtype(run_.dtype) ? "FP8 products of a GPU of compute capability 8.9 or later"
                                                     : "fp32 values, TF32 products";
    throw_input_error("run.dtype", "\"" + run_.dtype + "\" is a mode of tensor-core products (" + what +
                                       "): it needs run.device = \"cuda\"; " + device->describe() + " computes in fp32");
  }
  if (!fp8_dtype(run_.dtype) && run_.fp8_scaling == "delayed") {
    spdlog::warn("run.fp8_scaling = \"delayed\" sets the scales of FP8 products; run.dtype = \"{}\" has none, so it does nothing",
                 run_.dtype);
  }
  if (fp8_dtype(run_.dtype) && !can.fp8_products) {
    throw_input_error("run.dtype", "\"" + run_.dtype +
                                       "\" needs FP8 matrix products (compute capability 8.9 or later: L4, L40, "
                                       "H100, H200); " +
                                       device->describe() + " has none: use run.dtype = \"bf16\"");
  }
  return device;
}

std::string Session::communicator_name(const DeviceCapabilities& device) const {
  const std::string& chosen = spec_.run.communicator;
  const std::string one = defaults::one_process_communicator;
  launch::LaunchEnv env;
  try {
    env = launch::read_launch_env();
  } catch (const std::invalid_argument& e) {
    throw_input_error("launcher environment", e.what());
  }
  if (chosen == kAutoCommunicator) {
    if (env.world <= 1) return one;
    if (device.collective.empty()) {
      throw_input_error("run.communicator", "is \"auto\" but the " + env.launcher + " launcher started " + std::to_string(env.world) +
                                                " ranks and run.device \"" + run_.device +
                                                "\" names no collective; set run.communicator");
    }
    return device.collective;
  }
  if (chosen == one && env.world > 1) {
    throw_input_error("run.communicator", "is \"" + one + "\" but the " + env.launcher + " launcher started " +
                                              std::to_string(env.world) +
                                              " ranks: each would train alone into the same "
                                              "run directory; set communicator = \"mpi\" (CPU), \"nccl\" (GPU) or \"auto\"");
  }
  return chosen;
}

std::unique_ptr<Communicator> Session::communicator(const std::string& name) const {
  const Choice chosen = spec_.communicator(name);
  return registry_.create<Communicator>(Kind::communicator, name, {chosen.common, chosen.own, run_}, "run.communicator");
}

std::unique_ptr<Communicator> Session::one_process_communicator() const { return communicator(defaults::one_process_communicator); }

std::shared_ptr<DataSource> Session::data_source() const {
  const Choice& c = spec_.require(spec_.data);
  return registry_.create<DataSource>(Kind::data_source, c.name, {c.common, c.own, run_});
}

std::unique_ptr<Sampler> Session::sampler() const {
  const Choice& c = spec_.require(spec_.sampler);
  return registry_.create<Sampler>(Kind::sampler, c.name, {c.common, c.own, run_});
}

std::unique_ptr<Batcher> Session::batcher() const {
  const Choice& c = spec_.require(spec_.batching);
  return registry_.create<Batcher>(Kind::batcher, c.name, {c.common, c.own, run_});
}

std::unique_ptr<DataPipeline> Session::pipeline(Split split, std::shared_ptr<const DataSource> source) const {
  RunContext at = run_;
  if (split == Split::validation) {  // every rank reads the whole split; the evaluation shares it out
    at.rank = 0;
    at.world = 1;
  }
  const Session reader(spec_, registry_, at);
  if (!source) source = reader.data_source();
  return std::make_unique<DataPipeline>(std::move(source), reader.sampler(), reader.batcher(),
                                        PipelineOptions::from(spec_, at, split));
}

ModelOptions Session::model_options(int64_t data_vocab) const { return ModelOptions::from(spec_, data_vocab); }

std::unique_ptr<Model> Session::model(const ModelOptions& options, std::unique_ptr<Device> device) const {
  if (!device) device = this->device();
  return std::make_unique<Model>(options, registry_, run_, std::move(device));
}

std::unique_ptr<Model> Session::model(int64_t data_vocab, std::unique_ptr<Device> device) const {
  return model(model_options(data_vocab), std::move(device));
}

void Session::require_serves_batches(const Model& model) const {
  const ModelOptions& mo = model.options();
  if (spec_.seq_len > mo.max_seq_len) {
    throw_input_error("batching.seq_len",
                      std::to_string(spec_.seq_len) + " exceeds model.max_seq_len " + std::to_string(mo.max_seq_len));
  }
  if (const std::string why = model.attention_supports(spec_.batch_size, spec_.seq_len); !why.empty()) {
    throw_input_error("attention.name", "'" + mo.attention + "' cannot serve this model: " + why);
  }
}

std::unique_ptr<Optimizer> Session::optimizer() const {
  const Choice& c = spec_.require(spec_.optimizer);
  return registry_.create<Optimizer>(Kind::optimizer, c.name, {c.common, c.own, run_}, "optimizer.name");
}

std::unique_ptr<Schedule> Session::schedule() const {
  const Choice& c = spec_.require(spec_.schedule);
  auto schedule = registry_.create<Schedule>(Kind::schedule, c.name, {c.common, c.own, run_}, "schedule.name");
  schedule->plan(spec_.lr, spec_.run.steps);
  return schedule;
}

std::vector<EvalTask> Session::evals(const std::string& only, const std::string& where) const {
  std::vector<EvalTask> tasks;
  std::vector<std::string> labels;
  for (const Choice& c : spec_.evals) {
    const std::string label = c.common.get_string("label");
    labels.push_back(label);
    if (!only.empty() && label != only) continue;
    // A disabled table is not made during training: its evaluator's keys (an empty path, say) are
    // checked only where it runs, by `ablate eval --eval LABEL`.
    if (only.empty() && !c.common.get_bool("enabled")) continue;
    EvalTask t;
    t.label = label;
    t.name = c.name;
    t.every = c.common.get_int("every");
    t.enabled = c.common.get_bool("enabled");
    t.evaluator = registry_.create<Evaluator>(Kind::evaluator, c.name, {c.common, c.own, run_}, "eval." + label + ".name");
    t.primary = t.evaluator->primary_metric();
    t.higher_is_better = t.evaluator->higher_is_better();
    tasks.push_back(std::move(t));
  }
  if (!only.empty() && tasks.empty()) throw_unknown_eval_label(only, labels, where);
  return tasks;
}

std::vector<std::unique_ptr<Logger>> Session::loggers() const {
  for (const Choice& sink : spec_.loggers) {
    if (registry_.find(Kind::logger, sink.name) == nullptr) {
      const std::vector<std::string> valid = registry_.names(Kind::logger);
      throw_input_error("logging.sinks",
                        "unknown logger '" + sink.name + "' (loaded: " + (valid.empty() ? "none" : join(valid)) + ")");
    }
  }
  std::vector<std::unique_ptr<Logger>> sinks;
  if (run_.rank != 0) return sinks;
  for (const Choice& sink : spec_.loggers)
    sinks.push_back(registry_.create<Logger>(Kind::logger, sink.name, {sink.common, sink.own, run_}));
  return sinks;
}

}  // namespace ablate
