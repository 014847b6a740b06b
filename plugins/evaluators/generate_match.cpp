// The `generate_match` evaluator: items {"prompt", "answer"} from a JSON Lines file; the model
// continues each prompt greedily (the most likely token each step, the lowest id on a tie) until
// the generated text holds the `stop` string, the end-of-document token comes, or max_new_tokens
// tokens; the generation, up to and including the stop string, matches when it equals the answer
// ("exact") or begins with it ("prefix"). Reported: match with its 95% Wilson interval, items.
#include <algorithm>
#include <cmath>

#include "ablate/error.hpp"
#include "ablate/plugin.hpp"
#include "eval_common.hpp"

namespace ablate::evaluators {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::size_t kMaxLogits = std::size_t(64) << 20;  // 256 MiB of f32

struct Item {
  std::size_t line = 0;
  std::string id, prompt, answer;
  std::vector<int32_t> tokens;  // the prompt's
};

// One generation in progress.
struct Generation {
  std::size_t item = 0;
  std::vector<int32_t> tokens;  // prompt and generated
  std::vector<int32_t> generated;
  std::string text;  // the generated tokens decoded (cut after the stop string)
  bool done = false;
};

class GenerateMatch final : public Evaluator {
 public:
  explicit GenerateMatch(const Params& own)
      : path_(own.get_string("path")),
        max_new_(own.get_int("max_new_tokens")),
        prefix_(own.get_string("match") == "prefix"),
        stop_(own.get_string("stop")),
        limit_(own.get_int("limit")) {
    if (path_.empty()) throw_input_error(own.path() + ".path", "is empty: name the JSON Lines file of the prompts");
  }

  std::string describe() const override {
    return "generate_match: " + std::to_string(items_.size()) + " prompts from " + path_.string() + ", greedy, up to " +
           std::to_string(max_new_) + " tokens, " + (prefix_ ? "prefix" : "exact") + " match";
  }
  std::vector<std::string> metric_names() const override { return {"match", "match_low", "match_high", "items"}; }
  std::string primary_metric() const override { return "match"; }
  bool higher_is_better() const override { return true; }

  void prepare(EvalModel& model) override {
    items_.clear();
    for (const TaskLine& l : read_jsonl(path_)) {
      if (limit_ > 0 && int64_t(items_.size()) >= limit_) break;
      Item item;
      item.line = l.line;
      item.id = optional_id(path_, l);
      item.prompt = string_field(path_, l, "prompt", false);
      item.answer = string_field(path_, l, "answer", false);
      item.tokens = encode_field(model, item.prompt, path_, l.line, "prompt");
      items_.push_back(std::move(item));
    }
  }

  EvalResult run(EvalModel& model, bool details) override {
    std::vector<Generation> gens;
    for (std::size_t i = std::size_t(model.rank()); i < items_.size(); i += std::size_t(model.world())) {
      gens.push_back({i, items_[i].tokens, {}, {}, false});
    }
    for (int64_t step = 0; step < max_new_; ++step) {
      std::vector<Generation*> open;
      for (Generation& g : gens) {
        if (!g.done) open.push_back(&g);
      }
      if (open.empty()) break;
      next_tokens(model, open);
    }
    std::vector<double> counts = {double(gens.size()), 0};
    EvalResult result;
    for (const Generation& g : gens) {
      const Item& item = items_[g.item];
      const bool hit = prefix_ ? g.text.compare(0, item.answer.size(), item.answer) == 0 && g.text.size() >= item.answer.size()
                               : g.text == item.answer;
      counts[1] += hit ? 1 : 0;
      if (details) {
        result.details.push_back(json{
            {"index", g.item},
            {"line", item.line},
            {"id", item.id},
            {"prompt", item.prompt},
            {"answer", item.answer},
            {"generated", g.text},
            {"generated_tokens", g.generated},
            {"match", hit}}.dump(-1, ' ', false, json::error_handler_t::replace));
      }
    }
    model.sum_over_ranks(counts);
    const Interval ci = wilson(counts[1], counts[0]);
    result.metrics = {
        {"match", counts[0] > 0 ? counts[1] / counts[0] : NAN}, {"match_low", ci.low}, {"match_high", ci.high}, {"items", counts[0]}};
    return result;
  }

 private:
  // One greedy token for each open generation, in batches of the longest one's window.
  void next_tokens(EvalModel& model, const std::vector<Generation*>& open) const {
    const int32_t window = int32_t(model.max_seq_len());
    Batch batch;
    std::vector<float> logits;
    const int64_t V = model.vocab_size(), stride = model.vocab_stride();
    for (std::size_t first = 0; first < open.size();) {
      int32_t T = 0;
      for (std::size_t i = first; i < open.size(); ++i) T = std::max(T, std::min(window, int32_t(open[i]->tokens.size())));
      // The logits of every position come back: at most kMaxLogits of them per forward pass.
      const std::size_t by_logits = std::max<std::size_t>(1, kMaxLogits / (std::size_t(T) * std::size_t(stride)));
      const std::size_t rows = std::min({std::size_t(model.max_rows(T)), by_logits, open.size() - first});
      batch.reset(int32_t(rows), T);
      std::vector<int32_t> last(rows);
      for (std::size_t r = 0; r < rows; ++r) {
        const std::vector<int32_t>& t = open[first + r]->tokens;
        const int32_t n = std::min(window, int32_t(t.size()));  // the last `window` tokens
        for (int32_t p = 0; p < n; ++p) {
          const std::size_t at = r * std::size_t(T) + std::size_t(p);
          batch.tokens[at] = t[t.size() - std::size_t(n) + std::size_t(p)];
          batch.positions[at] = p;
          batch.segment_ids[at] = 1;
        }
        batch.segments.push_back({0, n});
        batch.row_segments[r + 1] = int32_t(r + 1);
        last[r] = n - 1;
      }
      model.logits(batch, logits);
      for (std::size_t r = 0; r < rows; ++r) {
        const float* row = logits.data() + (r * std::size_t(T) + std::size_t(last[r])) * std::size_t(stride);
        append(model, *open[first + r], int32_t(std::max_element(row, row + V) - row));
      }
      first += rows;
    }
  }

  void append(EvalModel& model, Generation& g, int32_t token) const {
    if (token == model.eot_token()) {
      g.done = true;
      return;
    }
    g.tokens.push_back(token);
    g.generated.push_back(token);
    g.text = model.decode(g.generated);
    if (!stop_.empty()) {
      if (const std::size_t at = g.text.find(stop_); at != std::string::npos) {
        g.text.resize(at + stop_.size());
        g.done = true;
      }
    }
  }

  fs::path path_;
  int64_t max_new_;
  bool prefix_;
  std::string stop_;
  int64_t limit_;
  std::vector<Item> items_;
};

}  // namespace

void register_generate_match(Registrar& r) {
  r.add({Kind::evaluator,
         "generate_match",
         "1.0.0",
         "greedy generation from the prompts of a JSON Lines file (prompt, answer), exact or prefix match against the answers",
         {path_key("the JSON Lines file of the prompts: {\"prompt\": str, \"answer\": str}"),
          param::integer("max_new_tokens", 32, "the longest generation in tokens").within(1, 4096),
          param::string("match", "exact", "exact: the generation equals the answer; prefix: it begins with the answer")
              .one_of({"exact", "prefix"}),
          param::string("stop", "\n",
                        "generation stops once its text holds this string, kept in the generation "
                        "(\"\" = only at max_new_tokens or the end-of-document token)"),
          limit_key()},
         [](const ComponentArgs& a) { return std::make_unique<GenerateMatch>(a.own); },
         "",
         {}});
}

}  // namespace ablate::evaluators
