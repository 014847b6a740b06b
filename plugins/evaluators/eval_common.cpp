// The shipped evaluators' shared reading and scoring (eval_common.hpp).
#include "eval_common.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ablate/batch.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"

namespace ablate::evaluators {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string where_line(const fs::path& path, std::size_t line) { return path.string() + ":" + std::to_string(line); }

std::vector<TaskLine> read_jsonl(const fs::path& path) {
  const std::string text = read_regular_file(path, "evaluation task file", kMaxTaskBytes);
  std::vector<TaskLine> out;
  std::size_t begin = 0, line = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    ++line;
    std::string_view l(text.data() + begin, end - begin);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    begin = end + 1;
    if (l.find_first_not_of(" \t") == std::string_view::npos) {
      throw_input_error(where_line(path, line), "an empty line; expected one JSON object per line");
    }
    if (json_too_deep_at(l) != std::string_view::npos) {
      throw_input_error(where_line(path, line), "the JSON is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    json j;
    try {
      j = json::parse(l);
    } catch (const json::exception& e) {
      throw_input_error(where_line(path, line), "not valid JSON (" + std::string(e.what()) + "): '" + echo_value(l) + "'");
    }
    if (!j.is_object()) throw_input_error(where_line(path, line), "expected a JSON object, got '" + echo_value(l) + "'");
    out.push_back({line, std::move(j)});
  }
  if (out.empty()) throw_input_error(path.string(), "holds no item (one JSON object per line expected)");
  return out;
}

const json& field(const fs::path& path, const TaskLine& l, const char* name) {
  const auto it = l.object.find(name);
  if (it == l.object.end()) throw_input_error(where_line(path, l.line), "missing field '" + std::string(name) + "'");
  return *it;
}

std::string string_field(const fs::path& path, const TaskLine& l, const char* name, bool may_be_empty) {
  const json& v = field(path, l, name);
  if (!v.is_string()) {
    throw_input_error(where_line(path, l.line),
                      "field '" + std::string(name) + "' is " + echo_value(v.dump()) + ", expected a string");
  }
  if (!may_be_empty && v.get_ref<const std::string&>().empty()) {
    throw_input_error(where_line(path, l.line), "field '" + std::string(name) + "' is empty; expected text");
  }
  return v.get<std::string>();
}

std::string optional_id(const fs::path& path, const TaskLine& l) {
  const auto it = l.object.find("id");
  if (it == l.object.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_number_integer()) return std::to_string(it->get<int64_t>());
  throw_input_error(where_line(path, l.line), "field 'id' is " + echo_value(it->dump()) + ", expected a string or an integer");
}

std::vector<int32_t> encode_field(EvalModel& model, const std::string& text, const fs::path& path, std::size_t line,
                                  const std::string& what) {
  std::vector<int32_t> tokens;
  try {
    tokens = model.encode(text);
  } catch (const Error& e) {
    throw_input_error(where_line(path, line), "field '" + what + "' cannot be tokenized by the run's data source: " + e.what());
  }
  if (tokens.empty()) throw_input_error(where_line(path, line), "field '" + what + "' holds no token");
  for (int32_t t : tokens) {
    if (t < 0 || t >= model.vocab_size()) {
      throw_input_error(where_line(path, line), "field '" + what + "' gives token " + std::to_string(t) +
                                                    ", outside the model's vocabulary of " + std::to_string(model.vocab_size()));
    }
  }
  return tokens;
}

Interval wilson(double k, double n) {
  if (n <= 0) return {};
  const double z = 1.959963984540054, p = k / n, z2 = z * z;
  const double centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const double half = z / (1 + z2 / n) * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

std::vector<double> score_sequences(EvalModel& model, const std::vector<Scored>& sequences) {
  std::vector<double> out(sequences.size(), 0.0);
  std::vector<std::size_t> order(sequences.size());
  std::iota(order.begin(), order.end(), std::size_t(0));
  // Longest first, so each batch's T is its first sequence's and padding stays small.
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return sequences[a].tokens.size() > sequences[b].tokens.size(); });
  Batch batch;
  std::vector<float> losses;
  for (std::size_t first = 0; first < order.size();) {
    const int32_t T = int32_t(sequences[order[first]].tokens.size()) - 1;  // inputs: every token but the last
    const std::size_t rows = std::min<std::size_t>(std::size_t(model.max_rows(T)), order.size() - first);
    batch.reset(int32_t(rows), T);
    for (std::size_t r = 0; r < rows; ++r) {
      const Scored& s = sequences[order[first + r]];
      const int32_t n = int32_t(s.tokens.size()) - 1;
      for (int32_t p = 0; p < n; ++p) {
        const std::size_t at = r * std::size_t(T) + std::size_t(p);
        batch.tokens[at] = s.tokens[std::size_t(p)];
        batch.targets[at] = p + 1 >= s.score_from ? s.tokens[std::size_t(p) + 1] : -1;
        batch.positions[at] = p;
        batch.segment_ids[at] = 1;
      }
      batch.segments.push_back({0, n});
      batch.row_segments[r + 1] = int32_t(r + 1);
    }
    model.token_losses(batch, losses);
    for (std::size_t r = 0; r < rows; ++r) {
      const Scored& s = sequences[order[first + r]];
      double sum = 0;  // in the order of the positions: the same sum however the sequences are batched
      for (int32_t p = s.score_from - 1; p + 1 < int32_t(s.tokens.size()); ++p)
        sum += double(losses[r * std::size_t(T) + std::size_t(p)]);
      out[order[first + r]] = sum;
    }
    first += rows;
  }
  return out;
}

ParamSpec limit_key() {
  return param::integer("limit", 0, "score at most this many items, the file's first (0 = every item)").within(0, 1e12);
}

ParamSpec path_key(const std::string& what) { return param::string("path", "", what).path(); }

}  // namespace ablate::evaluators
