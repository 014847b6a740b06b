// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// The composition root: every component an experiment chooses is made here, from its RunSpec, by
// one method per kind. The trainer, `ablate tune`, `ablate eval`/`generate`/`data`/`import`, the
// sweeps' peak measurement, checkpoint loading (load_model) and the benchmarks all build through a
// Session, so a component is made the same way wherever it is used and a new kind of component has
// one place to be made.
//
//   RunSpec spec = RunSpec::from(config);        // the config read once
//   Session session(spec, registry);             // this process's RunContext: spec.context()
//   auto source = session.data_source();
//   auto model = session.model(source->vocab_size());
//   auto optimizer = session.optimizer();
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ablate/component.hpp"
#include "ablate/data.hpp"
#include "ablate/runtime/evaluation.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/pipeline.hpp"
#include "ablate/runtime/run_spec.hpp"

namespace ablate {

class Communicator;
class Device;
class Logger;
class Optimizer;
class Registry;
class Schedule;
struct DeviceCapabilities;

class Session {
 public:
  // The experiment `spec` on this process: `run` is spec.context() until the communicator says
  // the rank and world (set_ranks); a caller may narrow it (load_model reads on the cpu).
  Session(const RunSpec& spec, const Registry& registry);
  Session(const RunSpec& spec, const Registry& registry, RunContext run);

  const RunSpec& spec() const noexcept { return spec_; }
  const Registry& registry() const noexcept { return registry_; }
  const RunContext& run() const noexcept { return run_; }
  // The rank and world the communicator reports, for every component made after it.
  void set_ranks(int rank, int world);
  // run.threads from now on (the cores each rank of a machine may use).
  void set_threads(int threads);

  // run.device's plugin. tf32 and bf16 are modes of tensor-core products: a device without them
  // is an input error naming run.dtype.
  std::unique_ptr<Device> device() const;

  // run.communicator with "auto" resolved against the device: its collective (mpi on the cpu,
  // nccl on cuda) when the launcher's environment (OMPI_COMM_WORLD_SIZE, or SLURM_NTASKS under
  // srun) says the job has several ranks, else the one-process communicator. An explicit
  // one-process communicator in a job of several ranks is an input error: every rank would train
  // alone into the same run directory.
  std::string communicator_name(const DeviceCapabilities& device) const;
  std::unique_ptr<Communicator> communicator(const std::string& name) const;
  // The one-process communicator (tools that step a model alone: tune, eval).
  std::unique_ptr<Communicator> one_process_communicator() const;

  // [data], [sampler], [batching]; a pipeline over `split` sharing `source` (made when null). The
  // validation split is read whole by every rank (a world of one) and shared out by the evaluation.
  std::shared_ptr<DataSource> data_source() const;
  std::unique_ptr<Sampler> sampler() const;
  std::unique_ptr<Batcher> batcher() const;
  std::unique_ptr<DataPipeline> pipeline(Split split = Split::train, std::shared_ptr<const DataSource> source = nullptr) const;

  // [model] for the data's vocabulary `data_vocab` (0: model.vocab_size alone), on `device` (made
  // by device() when null).
  ModelOptions model_options(int64_t data_vocab) const;
  std::unique_ptr<Model> model(const ModelOptions& options, std::unique_ptr<Device> device = nullptr) const;
  std::unique_ptr<Model> model(int64_t data_vocab, std::unique_ptr<Device> device = nullptr) const;
  // Input errors before training when the model cannot serve [batching]'s micro-batch: seq_len
  // past model.max_seq_len, or an attention backend that cannot serve batch_size x seq_len.
  void require_serves_batches(const Model& model) const;

  // [optimizer], [schedule] (planned for optimizer.lr and run.steps), the enabled [[eval]] tables
  // (`only` = ""), or the one labelled `only` (an unknown label is an input error naming `where`).
  std::unique_ptr<Optimizer> optimizer() const;
  std::unique_ptr<Schedule> schedule() const;
  std::vector<EvalTask> evals(const std::string& only = "", const std::string& where = "--eval") const;
  // [logging] sinks, made on rank 0 (which alone writes the logs; none elsewhere). On every rank an
  // unknown sink is an input error naming logging.sinks.
  std::vector<std::unique_ptr<Logger>> loggers() const;

 private:
  const RunSpec& spec_;
  const Registry& registry_;
  RunContext run_;
};

}  // namespace ablate
