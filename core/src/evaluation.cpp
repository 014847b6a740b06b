// The run's evaluations (see evaluation.hpp): [[eval]] tables made into evaluators, the model as
// they see it, their schedule and their reports.
#include "ablate/runtime/evaluation.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <spdlog/spdlog.h>

#include "ablate/communicator.hpp"
#include "ablate/data.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/model.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/run_spec.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

using json = nlohmann::json;

ModelEvalView::ModelEvalView(Model& model, const DataSource& source, Communicator& comm, int64_t positions)
    : model_(model), source_(source), comm_(comm), positions_(std::max<int64_t>(positions, 1)) {}

int64_t ModelEvalView::vocab_size() const { return model_.options().vocab_size; }
int64_t ModelEvalView::max_seq_len() const { return model_.options().max_seq_len; }
int32_t ModelEvalView::max_rows(int32_t seq_len) const {
  return int32_t(std::clamp<int64_t>(positions_ / std::max<int32_t>(seq_len, 1), 1, 65536));
}
double ModelEvalView::token_losses(const Batch& batch, std::vector<float>& losses) { return model_.forward(batch, &losses); }
void ModelEvalView::logits(const Batch& batch, std::vector<float>& logits) { model_.forward(batch, nullptr, &logits); }
int64_t ModelEvalView::vocab_stride() const { return model_.options().vocab_padded; }
std::vector<int32_t> ModelEvalView::encode(const std::string& text) const { return source_.encode(text); }
std::string ModelEvalView::decode(const std::vector<int32_t>& tokens) const { return source_.decode(tokens); }
int32_t ModelEvalView::eot_token() const { return source_.eot_token(); }
int64_t ModelEvalView::text_bytes(const std::vector<int32_t>& tokens) const {
  return source_.has_text() ? int64_t(source_.decode(tokens).size()) : -1;
}
int ModelEvalView::rank() const { return comm_.rank(); }
int ModelEvalView::world() const { return comm_.world(); }
void ModelEvalView::sum_over_ranks(std::vector<double>& values) {
  if (comm_.world() > 1 && !values.empty())
    comm_.all_reduce_host(flat_view(values.data(), DType::f64, int64_t(values.size())), ReduceOp::sum);
}

bool EvalTask::due(int64_t step, int64_t steps, int64_t eval_every) const {
  if (!enabled) return false;
  const int64_t period = every > 0 ? every : eval_every;
  return step == steps || (period > 0 && step % period == 0);
}

std::vector<std::string> EvalTask::logged_names() const {
  std::vector<std::string> out;
  for (const std::string& m : evaluator->metric_names()) out.push_back("eval/" + label + "/" + m);
  out.push_back("eval/" + label + "/time_s");
  return out;
}

void throw_unknown_eval_label(const std::string& label, const std::vector<std::string>& labels, const std::string& where) {
  throw_input_error(where, "the run's experiment has no [[eval]] labelled '" + label + "'" +
                               (labels.empty() ? std::string(" (it has no [[eval]] table)") : " (labels: " + join(labels) + ")"));
}

void prepare_eval_tasks(std::vector<EvalTask>& tasks, EvalModel& model) {
  for (EvalTask& t : tasks) {
    t.evaluator->prepare(model);
    spdlog::info("eval {}: {}{}", t.label, t.evaluator->describe(),
                 !t.enabled    ? " (disabled during training)"
                 : t.every > 0 ? " every " + std::to_string(t.every) + " steps"
                               : "");
  }
}

namespace {

std::string metric_text(double v) {
  char buf[48];
  if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

const EvalResult& run_eval_task(EvalTask& task, EvalModel& model, int64_t step, std::vector<std::pair<std::string, double>>* extra,
                                bool details) {
  const auto t0 = std::chrono::steady_clock::now();
  task.last = task.evaluator->run(model, details);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  task.seconds += s;
  ++task.runs;
  task.last_step = step;
  std::string line;
  for (const EvalMetric& m : task.last.metrics) {
    line += (line.empty() ? "" : ", ") + m.name + " " + metric_text(m.value);
    if (extra != nullptr) extra->push_back({"eval/" + task.label + "/" + m.name, m.value});
  }
  if (extra != nullptr) extra->push_back({"eval/" + task.label + "/time_s", s});
  spdlog::info("eval {} at step {}: {} ({:.2f} s)", task.label, step, line, s);
  return task.last;
}

json evals_summary(const std::vector<EvalTask>& tasks) {
  json out = json::object();
  for (const EvalTask& t : tasks) {
    if (t.runs == 0) continue;
    json metrics = json::object();
    for (const EvalMetric& m : t.last.metrics) {
      if (std::isfinite(m.value)) metrics[m.name] = m.value;  // a metric without a value (no item) is left out
    }
    out[t.label] = {{"evaluator", t.name}, {"step", t.last_step},   {"primary", t.primary}, {"higher_is_better", t.higher_is_better},
                    {"metrics", metrics},  {"evaluations", t.runs}, {"time_s", t.seconds}};
  }
  return out;
}

}  // namespace ablate
