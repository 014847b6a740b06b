// What the shipped evaluators share: their JSON Lines task files read with errors naming the file,
// line and field; the binomial interval of an accuracy; and scoring token sequences with the
// model's forward pass in batches of similar lengths.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ablate/evaluator.hpp"
#include "ablate/schema.hpp"

namespace ablate::evaluators {

// One object per line of a JSON Lines file; a line that is empty, not JSON or not an object is an
// input error naming "<path>:<line>". Task files hold at most kMaxTaskBytes.
struct TaskLine {
  std::size_t line = 0;  // 1-based
  nlohmann::json object;
};
inline constexpr std::uintmax_t kMaxTaskBytes = std::uintmax_t(1) << 30;
std::vector<TaskLine> read_jsonl(const std::filesystem::path& path);

// Fields of a task line: missing, or of another type, is an input error naming the line and field.
std::string where_line(const std::filesystem::path& path, std::size_t line);
const nlohmann::json& field(const std::filesystem::path& path, const TaskLine& l, const char* name);
std::string string_field(const std::filesystem::path& path, const TaskLine& l, const char* name, bool may_be_empty);
std::string optional_id(const std::filesystem::path& path, const TaskLine& l);

// The data source's tokens for `text` (field `what` of the line), an input error naming them when
// its tokenizer cannot express it or it holds no token.
std::vector<int32_t> encode_field(EvalModel& model, const std::string& text, const std::filesystem::path& path, std::size_t line,
                                  const std::string& what);

// 95% Wilson score interval of k successes in n trials ([0, 1] for n = 0).
struct Interval {
  double low = 0, high = 1;
};
Interval wilson(double k, double n);

// A token sequence whose tokens from `score_from` on are scored given the ones before.
struct Scored {
  std::vector<int32_t> tokens;
  int32_t score_from = 1;  // >= 1: the first token is never predicted
};
// -log p of each sequence's scored tokens, summed per sequence; sequences are sorted by length and
// forwarded in batches of at most model.max_rows(T) rows of the batch's longest sequence.
std::vector<double> score_sequences(EvalModel& model, const std::vector<Scored>& sequences);

// The `limit` key: at most this many items (0 = every item).
ParamSpec limit_key();
ParamSpec path_key(const std::string& what);

}  // namespace ablate::evaluators
