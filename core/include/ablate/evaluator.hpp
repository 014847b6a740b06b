// The evaluator interface: a downstream task scored with the model as it trains (`[[eval]]` tables
// of the experiment; plugins/evaluators ships multiple_choice, heldout_loss and generate_match).
//
// The trainer makes each enabled evaluator once, calls prepare() before the first step (files are
// read and checked there: a bad item is an input error naming its file, line and field before
// anything trains) and run() on its schedule, on every rank. An evaluator deals its items out by
// rank (item i on rank i % world) and adds its counts with EvalModel::sum_over_ranks, so every rank
// returns the same result. Evaluations never change training: they read the weights through the
// model's forward pass (no copy), use no random draws and no data pipeline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ablate/batch.hpp"
#include "ablate/component.hpp"

namespace ablate {

// What an evaluator sees of the model being trained: its forward pass, the data source's text
// form, and the ranks it shares the work with.
class EvalModel {
 public:
  virtual ~EvalModel();
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;
  // The most rows of `seq_len` positions one forward pass may hold (the training micro-batch's
  // positions, so an evaluation fits wherever training does); at least 1.
  virtual int32_t max_rows(int32_t seq_len) const = 0;
  // One forward pass without dropout: -log p(target) of every position into `losses` (rows * T
  // values, 0 where the target is -1); returns their sum.
  virtual double token_losses(const Batch& batch, std::vector<float>& losses) = 0;
  // One forward pass keeping the logits: (rows * T) x vocab_stride() values, of which the first
  // vocab_size() of each position are the vocabulary's.
  virtual void logits(const Batch& batch, std::vector<float>& logits) = 0;
  virtual int64_t vocab_stride() const = 0;
  // The data source's text form (DataSource::encode / decode); encode throws an input error on
  // text the tokenizer cannot express.
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& tokens) const = 0;
  virtual int32_t eot_token() const = 0;  // -1: none
  // The UTF-8 bytes of the text `tokens` stand for; -1 when the data source has no text form.
  virtual int64_t text_bytes(const std::vector<int32_t>& tokens) const = 0;
  virtual int rank() const = 0;
  virtual int world() const = 0;
  // Element-wise sums over the ranks (each rank passes the same number of values).
  virtual void sum_over_ranks(std::vector<double>& values) = 0;
};

struct EvalMetric {
  std::string name;  // [a-z0-9_]; logged as eval/<label>/<name>
  double value = 0;
};

struct EvalResult {
  std::vector<EvalMetric> metrics;  // in the order they are logged
  // Per-item records (one JSON object per line) of this rank's items, when run() was asked for them.
  std::vector<std::string> details;
};

class Evaluator : public Component {
 public:
  ~Evaluator() override;
  // One line for logs: "multiple_choice: 200 items of 4 endings from configs/evals/probe-rows.jsonl".
  virtual std::string describe() const = 0;
  // The names of the metrics run() returns, in order (the metrics files' columns are known before
  // the first evaluation).
  virtual std::vector<std::string> metric_names() const = 0;
  // The metric a sweep ranks arms by and `ablate doctor` watches, and its direction.
  virtual std::string primary_metric() const = 0;
  virtual bool higher_is_better() const = 0;
  // Reads and checks the task against the model (its vocabulary, its longest sequence).
  virtual void prepare(EvalModel& model) = 0;
  // Scores the model as it is now. `details`: fill EvalResult::details.
  virtual EvalResult run(EvalModel& model, bool details) = 0;
};

}  // namespace ablate
