// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// The run's [[eval]] tables as evaluators (evaluator.hpp) with their schedule, the model seen
// through EvalModel, and what they report: log lines, the step's metrics eval/<label>/<metric>,
// summary.json's "evals". The trainer and `ablate eval --eval` share it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/evaluator.hpp"
#include "ablate/metrics.hpp"

namespace ablate {

struct RunSpec;
class Registry;
class Model;
class DataSource;
class Communicator;

// The model being trained as evaluators see it: its forward pass, the data source's text form,
// the ranks' sums. One forward pass holds at most `positions` positions (the training micro-batch's).
class ModelEvalView final : public EvalModel {
 public:
  ModelEvalView(Model& model, const DataSource& source, Communicator& comm, int64_t positions);
  int64_t vocab_size() const override;
  int64_t max_seq_len() const override;
  int32_t max_rows(int32_t seq_len) const override;
  double token_losses(const Batch& batch, std::vector<float>& losses) override;
  void logits(const Batch& batch, std::vector<float>& logits) override;
  int64_t vocab_stride() const override;
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& tokens) const override;
  int32_t eot_token() const override;
  int64_t text_bytes(const std::vector<int32_t>& tokens) const override;
  int rank() const override;
  int world() const override;
  void sum_over_ranks(std::vector<double>& values) override;

 private:
  Model& model_;
  const DataSource& source_;
  Communicator& comm_;
  int64_t positions_;
};

// One [[eval]] table: its evaluator, when it runs, and what it has reported.
struct EvalTask {
  std::string label, name;
  int64_t every = 0;  // 0: with the validation loss (run.eval_every) and at the last step
  bool enabled = true;
  std::unique_ptr<Evaluator> evaluator;
  std::string primary;
  bool higher_is_better = true;
  double seconds = 0;  // all its evaluations
  int64_t runs = 0;
  int64_t last_step = -1;
  EvalResult last;

  // Whether it evaluates after `step` of `steps` (eval_every: run.eval_every).
  bool due(int64_t step, int64_t steps, int64_t eval_every) const;
  // The metric names it logs: eval/<label>/<metric> for each metric, then eval/<label>/time_s.
  std::vector<std::string> logged_names() const;
};

// The experiment's [[eval]] tasks are made by Session::evals. An input error naming `where`: the
// experiment has no [[eval]] labelled `label` (`labels`: those it has).
[[noreturn]] void throw_unknown_eval_label(const std::string& label, const std::vector<std::string>& labels, const std::string& where);
// prepare() of each task against the model, with a log line describing it.
void prepare_eval_tasks(std::vector<EvalTask>& tasks, EvalModel& model);
// Runs one task after `step`: its result kept, a log line on rank 0, and its metrics appended to
// `extra` (eval/<label>/<metric>, then eval/<label>/time_s) when given.
const EvalResult& run_eval_task(EvalTask& task, EvalModel& model, int64_t step, std::vector<std::pair<std::string, double>>* extra,
                                bool details = false);
// summary.json's "evals": per label its evaluator, step, primary metric and direction, the last
// metrics and the seconds all its evaluations took.
nlohmann::json evals_summary(const std::vector<EvalTask>& tasks);

}  // namespace ablate
