// The `heldout_loss` evaluator: the mean next-token loss on each named token shard set (a domain:
// web text, code, a language), read as `ablate eval --tokens` reads one shard: consecutive windows
// of seq_len + 1 tokens. Per domain its loss, its bits per byte where the data source has a text
// form (the loss in bits over the UTF-8 bytes the targets stand for) and its token count; and the
// loss over every domain's tokens together.
#include <cmath>
#include <set>

#include "ablate/data_util.hpp"
#include "ablate/error.hpp"
#include "ablate/plugin.hpp"
#include "eval_common.hpp"

namespace ablate::evaluators {
namespace {

namespace fs = std::filesystem;

struct Domain {
  std::string name;
  std::vector<int32_t> tokens;
  int64_t windows = 0;
  int64_t bytes = -1;  // of every window's targets; -1: no text form
};

class HeldoutLoss final : public Evaluator {
 public:
  explicit HeldoutLoss(const Params& own)
      : where_(own.path()),
        names_(own.get_string_list("names")),
        paths_(own.get_string_list("paths")),
        seq_len_(own.get_int("seq_len")),
        max_windows_(own.get_int("max_windows")) {
    if (names_.empty()) throw_input_error(where_ + ".names", "is empty: name each domain (one per entry of paths)");
    if (names_.size() != paths_.size()) {
      throw_input_error(where_ + ".paths", "has " + std::to_string(paths_.size()) + " entries but names has " +
                                               std::to_string(names_.size()) + ": one shard pattern per domain");
    }
    std::set<std::string> seen;
    for (const std::string& n : names_) {
      const bool ok =
          !n.empty() && n.size() <= 48 && n.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
      if (!ok)
        throw_input_error(where_ + ".names",
                          "'" + echo_value(n) + "' is not a domain name: expected lower-case letters, digits or '_'");
      if (!seen.insert(n).second) throw_input_error(where_ + ".names", "'" + n + "' is listed twice");
    }
  }

  std::string describe() const override {
    std::string out = "heldout_loss: windows of " + std::to_string(T_) + " tokens from";
    for (const Domain& d : domains_) out += " " + d.name + " (" + std::to_string(d.windows) + ")";
    return out;
  }
  std::vector<std::string> metric_names() const override {
    std::vector<std::string> out;
    for (const Domain& d : domains_) {
      out.push_back(d.name + "_loss");
      if (d.bytes > 0) out.push_back(d.name + "_bpb");
      out.push_back(d.name + "_tokens");
    }
    out.push_back("loss");
    return out;
  }
  std::string primary_metric() const override { return "loss"; }
  bool higher_is_better() const override { return false; }

  void prepare(EvalModel& model) override {
    T_ = seq_len_ > 0 ? seq_len_ : model.max_seq_len();
    if (T_ > model.max_seq_len()) {
      throw_input_error(where_ + ".seq_len",
                        std::to_string(T_) + " exceeds the model's max_seq_len " + std::to_string(model.max_seq_len()));
    }
    domains_.clear();
    for (std::size_t i = 0; i < names_.size(); ++i) {
      Domain d;
      d.name = names_[i];
      for (const fs::path& f : expand_paths({paths_[i]}, where_ + ".paths")) {
        const std::vector<int32_t> t = read_token_shard(f);
        for (int32_t x : t) {
          if (x >= model.vocab_size()) {
            throw_input_error(f.string(), "token " + std::to_string(x) + " is outside the model's vocabulary of " +
                                              std::to_string(model.vocab_size()));
          }
        }
        d.tokens.insert(d.tokens.end(), t.begin(), t.end());
      }
      d.windows = int64_t(d.tokens.size()) / (T_ + 1);
      if (max_windows_ > 0) d.windows = std::min(d.windows, max_windows_);
      if (d.windows == 0) {
        throw_input_error(where_ + ".paths", "'" + paths_[i] + "' holds " + std::to_string(d.tokens.size()) +
                                                 " tokens, fewer than one window of " + std::to_string(T_ + 1));
      }
      d.tokens.resize(std::size_t(d.windows * (T_ + 1)));
      int64_t bytes = 0;
      for (int64_t w = 0; w < d.windows && bytes >= 0; ++w) {
        const auto b = d.tokens.begin() + std::ptrdiff_t(w * (T_ + 1));
        const int64_t n = model.text_bytes(std::vector<int32_t>(b + 1, b + std::ptrdiff_t(T_ + 1)));
        bytes = n < 0 ? -1 : bytes + n;
      }
      d.bytes = bytes;
      domains_.push_back(std::move(d));
    }
  }

  EvalResult run(EvalModel& model, bool details) override {
    std::vector<double> sums;  // per domain: loss sum, targets
    for (const Domain& d : domains_) {
      std::vector<Scored> windows;
      for (int64_t w = model.rank(); w < d.windows; w += model.world()) {
        const auto b = d.tokens.begin() + std::ptrdiff_t(w * (T_ + 1));
        windows.push_back({std::vector<int32_t>(b, b + std::ptrdiff_t(T_ + 1)), 1});
      }
      double loss = 0;
      for (double x : score_sequences(model, windows)) loss += x;
      sums.push_back(loss);
      sums.push_back(double(windows.size()) * double(T_));
    }
    model.sum_over_ranks(sums);
    EvalResult result;
    double all = 0, count = 0;
    for (std::size_t i = 0; i < domains_.size(); ++i) {
      const Domain& d = domains_[i];
      const double loss = sums[2 * i] / sums[2 * i + 1];
      result.metrics.push_back({d.name + "_loss", loss});
      if (d.bytes > 0) result.metrics.push_back({d.name + "_bpb", sums[2 * i] / std::log(2.0) / double(d.bytes)});
      result.metrics.push_back({d.name + "_tokens", sums[2 * i + 1]});
      all += sums[2 * i];
      count += sums[2 * i + 1];
      if (details) {
        result.details.push_back(
            nlohmann::json{{"domain", d.name}, {"loss", loss}, {"tokens", sums[2 * i + 1]}, {"bytes", d.bytes}}.dump());
      }
    }
    result.metrics.push_back({"loss", all / count});
    return result;
  }

 private:
  std::string where_;
  std::vector<std::string> names_, paths_;
  int64_t seq_len_, max_windows_, T_ = 0;
  std::vector<Domain> domains_;
};

}  // namespace

void register_heldout_loss(Registrar& r) {
  r.add({Kind::evaluator,
         "heldout_loss",
         "1.0.0",
         "the next-token loss (and bits per byte) on named held-out token shards, one domain per shard pattern",
         {param::string_list("names", {}, "the domains' names (lower-case letters, digits, '_'), one per entry of paths"),
          param::string_list("paths", {}, "per domain an llm.c token shard or glob of shards").path(),
          param::integer("seq_len", 0, "window length (0 = the model's max_seq_len)").within(0, 16777216),
          param::integer("max_windows", 0, "at most this many windows per domain (0 = every whole window)").within(0, 1e12)},
         [](const ComponentArgs& a) { return std::make_unique<HeldoutLoss>(a.own); },
         "",
         {}});
}

}  // namespace ablate::evaluators
