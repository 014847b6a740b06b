// A data cursor as state.json holds it (core/src/checkpointer.hpp): positions only, consecutive
// pieces of one document cut at one length written as a run, read back to the same pieces; a run
// that would expand past any batcher's holding, or a malformed entry, is an input error naming it.
// The record of a job resumed on another world size ("reshard") reads back, and its absence (every
// cursor written before it existed) is the sampler's standard deal.
#include <doctest/doctest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "ablate/error.hpp"
#include "checkpointer.hpp"

using namespace ablate;
using json = nlohmann::json;

namespace {

bool same(const DataCursor& a, const DataCursor& b) {
  if (a.draw != b.draw || a.pending.size() != b.pending.size()) return false;
  if (a.reshard.has_value() != b.reshard.has_value()) return false;
  if (a.reshard && (a.reshard->from_world != b.reshard->from_world || a.reshard->first != b.reshard->first ||
                    a.reshard->end != b.reshard->end || a.reshard->drawn != b.reshard->drawn)) {
    return false;
  }
  for (std::size_t i = 0; i < a.pending.size(); ++i) {
    const PendingPiece &x = a.pending[i], &y = b.pending[i];
    if (x.document != y.document || x.begin != y.begin || x.end != y.end) return false;
  }
  return true;
}

std::string refusal(const json& j) {
  try {
    cursor_from(j, "data_cursor", "state.json");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a long document's pieces are one run, other pieces stay single, and the pieces read back exactly") {
  DataCursor c;
  c.draw = 17;
  // Document 5 cut into rows of 32 from token 64 (its last piece shorter), then document 9 whole,
  // then two pieces of document 5 that do not continue each other, then document 5 again from 0.
  for (int32_t b = 64; b < 64 + 32 * 1000; b += 32) c.pending.push_back({5, b, b + 32});
  c.pending.push_back({5, 64 + 32 * 1000, 64 + 32 * 1000 + 7});
  c.pending.push_back({9, 0, 11});
  c.pending.push_back({5, 0, 10});
  c.pending.push_back({5, 10, 30});  // longer than the first: not the same cut
  c.pending.push_back({5, 40, 50});  // not contiguous
  c.pending.push_back({7, 0, 32});
  c.pending.push_back({7, 32, 40});
  c.pending.push_back({7, 40, 72});  // after a shorter piece: a new run
  const json j = cursor_json(c);
  CHECK(j.at("draw") == 17);
  CHECK(j.at("pending") == json::parse("[[5, 64, 32071, 32], [9, 0, 11], [5, 0, 10], [5, 10, 30], [5, 40, 50], [7, 0, 40, 32],"
                                       " [7, 40, 72]]"));
  CHECK(same(cursor_from(j, "data_cursor", "state.json"), c));
  // A cursor written before runs existed (single pieces only) reads as it did.
  CHECK(same(cursor_from(json::parse(R"({"draw": 3, "pending": [[1, 0, 5], [2, 5, 9]]})"), "data_cursor", "state.json"),
             DataCursor{3, {{1, 0, 5}, {2, 5, 9}}, std::nullopt}));
  CHECK(same(cursor_from(cursor_json(DataCursor{}), "data_cursor", "state.json"), DataCursor{}));
}

TEST_CASE("malformed cursor entries and runs that expand past any batcher's holding are refused, naming the entry") {
  CHECK(refusal(json::parse(R"({"draw": 1, "pending": [[1, 0, 5, 0]]})")).find("data_cursor.pending[0][3] (length)") !=
        std::string::npos);
  CHECK(refusal(json::parse(R"({"draw": 1, "pending": [[1, 0, 5, 2, 9]]})")).find("a run [document, begin, end, length]") !=
        std::string::npos);
  CHECK(refusal(json::parse(R"({"draw": 1, "pending": [[1, 5, 5, 2]]})")).find("an empty piece") != std::string::npos);
  CHECK(refusal(json::parse(R"({"draw": 1, "pending": [[1, 0, 2147483647, 1]]})")).find("more than 67108864 pieces") !=
        std::string::npos);
  CHECK(refusal(json::parse(R"({"draw": 18446744073709551615, "pending": []})")).find("data_cursor.draw") != std::string::npos);
}

TEST_CASE("a cursor's reshard record reads back; without one the cursor is the standard deal; a malformed one is refused") {
  DataCursor c;
  c.draw = 4;
  c.pending.push_back({3, 0, 9});
  c.reshard = Reshard{2, 40, 47, {41, 43, 46}};
  const json j = cursor_json(c);
  CHECK(j.at("reshard") == json::parse(R"({"from_world": 2, "first": 40, "end": 47, "drawn": [41, 43, 46]})"));
  CHECK(same(cursor_from(j, "data_cursor", "state.json"), c));
  CHECK_FALSE(cursor_json(DataCursor{}).contains("reshard"));
  CHECK_FALSE(cursor_from(json::parse(R"({"draw": 3, "pending": []})"), "data_cursor", "state.json").reshard.has_value());
  const auto with = [](const char* reshard) {
    return refusal(json::parse(std::string(R"({"draw": 1, "pending": [], "reshard": )") + reshard + "}"));
  };
  CHECK(with("[1, 2]").find("'data_cursor.reshard' is [1,2]") != std::string::npos);
  CHECK(with(R"({"first": 1, "end": 2, "drawn": []})").find("no 'data_cursor.reshard.from_world'") != std::string::npos);
  CHECK(with(R"({"from_world": 0, "first": 1, "end": 2, "drawn": []})").find("'data_cursor.reshard.from_world' is 0") !=
        std::string::npos);
  CHECK(with(R"({"from_world": 2, "first": 5, "end": 4, "drawn": []})").find("'data_cursor.reshard.end' is 4") != std::string::npos);
  CHECK(with(R"({"from_world": 2, "first": 5, "end": 9, "drawn": [7, 6]})").find("'data_cursor.reshard.drawn[1]' is 6") !=
        std::string::npos);
  CHECK(with(R"({"from_world": 2, "first": 5, "end": 9, "drawn": [9]})").find("'data_cursor.reshard.drawn[0]' is 9") !=
        std::string::npos);
  CHECK(with(R"({"from_world": 2, "first": 5, "end": 9, "drawn": {}})").find("'data_cursor.reshard.drawn' is not an array") !=
        std::string::npos);
  CHECK(with(R"({"from_world": 2, "first": 5, "end": 9, "drawn": ["x"]})").find("'data_cursor.reshard.drawn[0]' is \"x\"") !=
        std::string::npos);
}
