// The `multiple_choice` evaluator: items {"context", "endings", "label"} from a JSON Lines file;
// each ending is scored by the log-likelihood of its tokens given the context's (the two encoded
// apart and concatenated), as a sum and as a mean per token. The item is right under a score when
// its label's ending scores highest (ties go to the first ending). Reported: acc (under the
// configured normalization) with its 95% Wilson interval, acc_sum, acc_mean and the item count.
#include <algorithm>
#include <cmath>

#include "ablate/error.hpp"
#include "ablate/plugin.hpp"
#include "eval_common.hpp"

namespace ablate::evaluators {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr std::size_t kMaxEndings = 16;

struct Item {
  std::size_t line = 0;
  std::string id;
  int32_t label = 0;
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> endings;
};

class MultipleChoice final : public Evaluator {
 public:
  explicit MultipleChoice(const Params& own)
      : path_(own.get_string("path")), mean_(own.get_string("normalization") == "mean"), limit_(own.get_int("limit")) {
    if (path_.empty()) throw_input_error(own.path() + ".path", "is empty: name the JSON Lines file of the items");
  }

  std::string describe() const override {
    return "multiple_choice: " + std::to_string(items_.size()) + " items from " + path_.string() + ", accuracy by the " +
           (mean_ ? "mean" : "summed") + " log-likelihood of each ending";
  }
  std::vector<std::string> metric_names() const override { return {"acc", "acc_low", "acc_high", "acc_sum", "acc_mean", "items"}; }
  std::string primary_metric() const override { return "acc"; }
  bool higher_is_better() const override { return true; }

  void prepare(EvalModel& model) override {
    items_.clear();
    for (const TaskLine& l : read_jsonl(path_)) {
      if (limit_ > 0 && int64_t(items_.size()) >= limit_) break;
      items_.push_back(read_item(model, l));
    }
  }

  EvalResult run(EvalModel& model, bool details) override {
    // This rank's items (i % world == rank), every ending of each one sequence.
    std::vector<Scored> sequences;
    std::vector<std::size_t> mine;
    for (std::size_t i = std::size_t(model.rank()); i < items_.size(); i += std::size_t(model.world())) {
      mine.push_back(i);
      for (const std::vector<int32_t>& e : items_[i].endings) sequences.push_back(sequence(model, items_[i].context, e));
    }
    const std::vector<double> nll = score_sequences(model, sequences);
    std::vector<double> counts = {0, 0, 0};  // items, right by sum, right by mean
    EvalResult result;
    std::size_t at = 0;
    for (std::size_t i : mine) {
      const Item& item = items_[i];
      std::vector<double> sum, mean;
      for (const std::vector<int32_t>& e : item.endings) {
        sum.push_back(-nll[at++]);
        mean.push_back(sum.back() / double(e.size()));
      }
      const auto best = [](const std::vector<double>& v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); };
      const int32_t by_sum = best(sum), by_mean = best(mean);
      counts[0] += 1;
      counts[1] += by_sum == item.label ? 1 : 0;
      counts[2] += by_mean == item.label ? 1 : 0;
      if (details) {
        json endings = json::array();
        for (const std::vector<int32_t>& e : item.endings) endings.push_back(e);
        result.details.push_back(json{
            {"index", i},
            {"line", item.line},
            {"id", item.id},
            {"label", item.label},
            {"loglik_sum", sum},
            {"loglik_mean", mean},
            {"choice_sum", by_sum},
            {"choice_mean", by_mean},
            {"context_tokens", item.context},
            {"ending_tokens",
             endings}}.dump());
      }
    }
    model.sum_over_ranks(counts);
    const double n = counts[0], right = mean_ ? counts[2] : counts[1];
    const Interval ci = wilson(right, n);
    result.metrics = {{"acc", n > 0 ? right / n : NAN},
                      {"acc_low", ci.low},
                      {"acc_high", ci.high},
                      {"acc_sum", n > 0 ? counts[1] / n : NAN},
                      {"acc_mean", n > 0 ? counts[2] / n : NAN},
                      {"items", n}};
    return result;
  }

 private:
  Item read_item(EvalModel& model, const TaskLine& l) const {
    Item item;
    item.line = l.line;
    item.id = optional_id(path_, l);
    item.context = encode_field(model, string_field(path_, l, "context", false), path_, l.line, "context");
    const json& endings = field(path_, l, "endings");
    if (!endings.is_array() || endings.size() < 2 || endings.size() > kMaxEndings) {
      throw_input_error(where_line(path_, l.line), "field 'endings' is " + echo_value(endings.dump()) + ", expected a list of 2 to " +
                                                       std::to_string(kMaxEndings) + " strings");
    }
    for (std::size_t e = 0; e < endings.size(); ++e) {
      const std::string what = "endings[" + std::to_string(e) + "]";
      if (!endings[e].is_string() || endings[e].get_ref<const std::string&>().empty()) {
        throw_input_error(where_line(path_, l.line), "field '" + what + "' is " + echo_value(endings[e].dump()) + ", expected text");
      }
      item.endings.push_back(encode_field(model, endings[e].get<std::string>(), path_, l.line, what));
      if (int64_t(item.endings.back().size()) > model.max_seq_len()) {
        throw_input_error(where_line(path_, l.line), "field '" + what + "' is " + std::to_string(item.endings.back().size()) +
                                                         " tokens, more than the model's max_seq_len " +
                                                         std::to_string(model.max_seq_len()) + " can score");
      }
    }
    const json& label = field(path_, l, "label");
    if (!label.is_number_integer() || label.get<int64_t>() < 0 || label.get<int64_t>() >= int64_t(endings.size())) {
      throw_input_error(where_line(path_, l.line), "field 'label' is " + echo_value(label.dump()) + ", expected an integer 0.." +
                                                       std::to_string(endings.size() - 1) + " (the right ending's index)");
    }
    item.label = int32_t(label.get<int64_t>());
    return item;
  }

  // Context then ending, the context cut from the left to what the model's window holds.
  static Scored sequence(const EvalModel& model, const std::vector<int32_t>& context, const std::vector<int32_t>& ending) {
    const std::size_t room = std::size_t(model.max_seq_len()) + 1 - ending.size();  // tokens of context kept (>= 1)
    const std::size_t keep = std::min(context.size(), room);
    Scored s;
    s.tokens.assign(context.end() - std::ptrdiff_t(keep), context.end());
    s.score_from = int32_t(s.tokens.size());
    s.tokens.insert(s.tokens.end(), ending.begin(), ending.end());
    return s;
  }

  fs::path path_;
  bool mean_;
  int64_t limit_;
  std::vector<Item> items_;
};

}  // namespace

void register_multiple_choice(Registrar& r) {
  r.add({Kind::evaluator,
         "multiple_choice",
         "1.0.0",
         "accuracy on multiple-choice items from a JSON Lines file (context, endings, label), each ending scored by its "
         "log-likelihood given the context",
         {path_key("the JSON Lines file of the items: {\"context\": str, \"endings\": [str, ...], \"label\": int}"),
          param::string("normalization", "mean",
                        "which score decides acc: the mean log-likelihood per ending token, or "
                        "the sum (both are reported as acc_mean and acc_sum)")
              .one_of({"mean", "sum"}),
          limit_key()},
         [](const ComponentArgs& a) { return std::make_unique<MultipleChoice>(a.own); },
         "",
         {}});
}

}  // namespace ablate::evaluators
