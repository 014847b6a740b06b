#include "gpt2_vocab.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string_view>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"

namespace ablate::token_shards {

namespace fs = std::filesystem;

namespace {

bool prints(int32_t b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

// GPT-2's files are 1-2 MB; a FIFO, a device or a file past kMaxTokenizerBytes is refused.
std::string read_bounded(const fs::path& p) { return read_regular_file(p, "GPT-2 tokenizer file", kMaxTokenizerBytes); }

// The code points GPT-2's pattern classes as letters, numbers and white space
// (tools/gen_unicode_classes.py writes the tables from Python's `regex` module).
struct CodePointRange {
  uint32_t first, last;
};
#include "unicode_classes.inc"

// The length of the UTF-8 character starting at s[i], or 0 when the bytes there are not one
// (Unicode's well-formed sequences: no overlong form, no surrogate, nothing past U+10FFFF).
std::size_t utf8_length(std::string_view s, std::size_t i, uint32_t& cp) {
  const auto byte = [&](std::size_t k) { return i + k < s.size() ? uint8_t(s[i + k]) : uint8_t(0); };
  const uint8_t c = byte(0);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  std::size_t n = 0;
  uint8_t low = 0x80, high = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) low = 0xA0;
    if (c == 0xED) high = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) low = 0x90;
    if (c == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  cp = c & (0x7Fu >> n);
  for (std::size_t k = 1; k < n; ++k) {
    const uint8_t b = byte(k);
    if (b < (k == 1 ? low : 0x80) || b > (k == 1 ? high : 0xBF)) return 0;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  return n;
}

int32_t base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

bool base64_decode(const std::string& text, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  std::size_t i = 0;
  for (; i < text.size() && text[i] != '='; ++i) {
    const int32_t v = base64_value(text[i]);
    if (v < 0) return false;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(char((acc >> bits) & 0xFFu));
    }
  }
  for (; i < text.size(); ++i) {
    if (text[i] != '=') return false;
  }
  return true;
}

}  // namespace

int32_t gpt2_byte_of(uint32_t code_point) {
  // The bytes that do not print, in increasing order: code points 256, 257, ... stand for them.
  static const std::array<int32_t, 68> hidden = [] {
    std::array<int32_t, 68> out{};
    std::size_t n = 0;
    for (int32_t b = 0; b < 256; ++b) {
      if (!prints(b)) out[n++] = b;
    }
    return out;
  }();
  if (code_point < 256) return prints(int32_t(code_point)) ? int32_t(code_point) : -1;
  return code_point - 256 < hidden.size() ? hidden[code_point - 256] : -1;
}

namespace {

// GPT-2's byte-level spelling of a token (each byte one code point of its table) as the bytes.
std::string spelled_bytes(const std::string& where, std::string_view text) {
  std::string bytes;
  uint32_t cp = 0;
  for (std::size_t i = 0, n = 0; i < text.size(); i += n) {
    n = utf8_length(text, i, cp);
    if (n == 0) throw_input_error(where, "is not UTF-8");
    const int32_t b = gpt2_byte_of(cp);
    if (b < 0) {
      char name[16];
      std::snprintf(name, sizeof name, "U+%04X", unsigned(cp));
      throw_input_error(where, std::string("holds ") + name + ", a code point outside GPT-2's byte table: not a byte-level BPE token");
    }
    bytes.push_back(char(b));
  }
  return bytes;
}

// A token written "<|name|>" (GPT-2's <|endoftext|>) is a special token: text, never merged into.
bool special(const std::string& bytes) {
  return bytes.size() > 4 && bytes.compare(0, 2, "<|") == 0 && bytes.compare(bytes.size() - 2, 2, "|>") == 0;
}

uint64_t pair_key(int32_t left, int32_t right) { return uint64_t(uint32_t(left)) << 32 | uint32_t(right); }

// Byte-pair merging of one piece, in O(n log n): the parts form a linked list (each part named by
// the offset of its first byte), and a heap holds candidate pairs by (rank, offset); a candidate
// whose parts have changed since it was pushed is dropped when it comes up. The result is the
// rule's: repeatedly merge the adjacent pair of lowest rank, the leftmost of equals.
struct Candidate {
  int32_t rank;  // the id the pair merges into: GPT-2's ids are in merge order
  int32_t at;    // the offset of the pair's left part
  bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : at > o.at; }
};

struct MergeScratch {
  std::vector<int32_t> id, prev, next;  // by offset; id -1: merged into the part on its left
  std::vector<Candidate> heap;
};

// `merged(left, right)`: the id the pair merges into, or -1. Every byte of `piece` has an id.
template <class Merged>
void merge_piece(std::string_view piece, const std::array<int32_t, 256>& byte_id, const Merged& merged, MergeScratch& s,
                 std::vector<int32_t>& out) {
  const auto n = int32_t(piece.size());
  s.id.resize(std::size_t(n));
  s.prev.resize(std::size_t(n));
  s.next.resize(std::size_t(n));
  s.heap.clear();
  for (int32_t i = 0; i < n; ++i) {
    s.id[std::size_t(i)] = byte_id[uint8_t(piece[std::size_t(i)])];
    s.prev[std::size_t(i)] = i - 1;
    s.next[std::size_t(i)] = i + 1 < n ? i + 1 : -1;
  }
  const auto consider = [&](int32_t at) {
    if (at < 0 || s.next[std::size_t(at)] < 0) return;
    const int32_t rank = merged(s.id[std::size_t(at)], s.id[std::size_t(s.next[std::size_t(at)])]);
    if (rank < 0) return;
    s.heap.push_back({rank, at});
    std::push_heap(s.heap.begin(), s.heap.end(), std::greater<>());
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!s.heap.empty()) {
    std::pop_heap(s.heap.begin(), s.heap.end(), std::greater<>());
    const Candidate c = s.heap.back();
    s.heap.pop_back();
    const auto at = std::size_t(c.at);
    if (s.id[at] < 0 || s.next[at] < 0) continue;
    const auto right = std::size_t(s.next[at]);
    if (merged(s.id[at], s.id[right]) != c.rank) continue;  // the pair changed since
    s.id[at] = c.rank;
    s.id[right] = -1;
    s.next[at] = s.next[right];
    if (s.next[right] >= 0) s.prev[std::size_t(s.next[right])] = c.at;
    consider(s.prev[at]);
    consider(c.at);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = s.next[std::size_t(i)]) out.push_back(s.id[std::size_t(i)]);
}

}  // namespace

int32_t Gpt2Vocab::merged(int32_t left, int32_t right) const {
  const auto it = merges_.find(pair_key(left, right));
  return it == merges_.end() ? -1 : it->second;
}

bool Gpt2Vocab::present(const fs::path& dir) {
  std::error_code ec;
  // Anything by these names counts (a symlink to nothing too): load() then refuses what is not a
  // regular file, rather than the tokenizer silently going missing.
  const auto there = [&](const char* name) { return fs::exists(fs::symlink_status(dir / name, ec)); };
  return there("encoder.json") || there("gpt2.tiktoken");
}

Gpt2Vocab Gpt2Vocab::load(const fs::path& dir, int32_t vocab_size) {
  Gpt2Vocab v;
  v.bytes_.assign(std::size_t(vocab_size), std::string());
  v.known_.assign(std::size_t(vocab_size), false);
  v.byte_id_.fill(-1);
  std::unordered_map<std::string, int32_t> id_of;  // bytes -> id, every entry
  const auto put = [&](const std::string& where, int64_t id, std::string bytes) {
    if (id < 0 || id >= vocab_size) {
      throw_input_error(where, "token id " + std::to_string(id) + " is outside the vocabulary (vocab_size " +
                                   std::to_string(vocab_size) + ")");
    }
    if (v.known_[std::size_t(id)]) throw_input_error(where, "token id " + std::to_string(id) + " appears twice");
    if (bytes.empty()) throw_input_error(where, "token id " + std::to_string(id) + " stands for no bytes");
    const auto [first, fresh] = id_of.emplace(bytes, int32_t(id));
    if (!fresh) {
      throw_input_error(where, "token id " + std::to_string(id) + " stands for the same bytes as token id " +
                                   std::to_string(first->second) + " (\"" + echo_value(bytes) + "\"): each byte sequence has one id");
    }
    if (bytes.size() == 1) v.byte_id_[uint8_t(bytes[0])] = int32_t(id);
    v.known_[std::size_t(id)] = true;
    v.bytes_[std::size_t(id)] = std::move(bytes);
    ++v.count_;
  };
  std::error_code ec;
  const auto exists = [&](const char* name) { return fs::exists(fs::symlink_status(dir / name, ec)); };
  if (exists("encoder.json")) {
    v.file_ = dir / "encoder.json";
    const std::string file = v.file_.string();
    std::unordered_set<std::string> keys;
    // JSON lets a key repeat (the parser keeps one of the values): refused here instead.
    const nlohmann::json::parser_callback_t repeated = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key && parsed.is_string() &&
          !keys.insert(parsed.get<std::string>()).second) {
        throw_input_error(file + ": entry \"" + parsed.get<std::string>() + "\"", "appears twice");
      }
      return true;
    };
    nlohmann::json j;
    const std::string text = read_bounded(v.file_);
    ablate::check_json_depth(text, file);
    try {
      j = nlohmann::json::parse(text, repeated);
    } catch (const nlohmann::json::exception& e) {
      throw_input_error(file, std::string("not valid JSON (cut short?): ") + e.what());
    }
    if (!j.is_object()) throw_input_error(file, "must be a JSON object of token string -> id");
    for (const auto& [token, id] : j.items()) {
      const std::string where = file + ": entry \"" + token + "\"";
      if (!id.is_number_integer()) throw_input_error(where, "the id must be an integer");
      put(where, id.get<int64_t>(), spelled_bytes(where, token));
    }
  } else if (exists("gpt2.tiktoken")) {
    v.file_ = dir / "gpt2.tiktoken";
    std::istringstream in(read_bounded(v.file_));
    std::string line;
    int64_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.empty()) continue;
      const std::string where = v.file_.string() + ":" + std::to_string(number);
      const std::size_t space = line.find(' ');
      std::string bytes;
      char* end = nullptr;
      const std::string id_text = space == std::string::npos ? std::string() : line.substr(space + 1);
      const long long id = std::strtoll(id_text.c_str(), &end, 10);
      if (space == std::string::npos || id_text.empty() || *end != '\0' || !base64_decode(line.substr(0, space), bytes)) {
        throw_input_error(where, "expected \"<base64 bytes> <id>\"");
      }
      put(where, id, std::move(bytes));
    }
  } else {
    throw_input_error(dir.string(), "holds neither encoder.json nor gpt2.tiktoken");
  }
  if (v.file_.filename() == "encoder.json" && exists("vocab.bpe")) {
    v.read_merges(dir / "vocab.bpe", id_of);
  } else {
    v.derive_merges();
  }
  return v;
}

// vocab.bpe: a "#version" line, then one merge per line, "left right" in GPT-2's byte spelling, in
// priority order; the k-th (from 0) makes token 256 + k of encoder.json from two earlier tokens,
// and every token of two or more bytes is made by one.
void Gpt2Vocab::read_merges(const fs::path& path, const std::unordered_map<std::string, int32_t>& id_of) {
  const std::string text = read_bounded(path);
  const std::string file = path.string();
  std::size_t at = 0;
  int64_t number = 0, k = 0;
  while (at < text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    const std::string where = file + ":" + std::to_string(++number);
    if (number == 1) {
      if (line.substr(0, 8) != "#version") throw_input_error(where, "expected the \"#version\" line vocab.bpe starts with");
      continue;
    }
    if (line.empty()) continue;
    const std::size_t space = line.find(' ');
    if (space == 0 || space == std::string_view::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string_view::npos) {
      throw_input_error(where, "expected a merge: two tokens separated by one space (the file cut short?)");
    }
    const std::string left = spelled_bytes(where, line.substr(0, space));
    const std::string right = spelled_bytes(where, line.substr(space + 1));
    const auto made = id_of.find(left + right);
    const int64_t want = 256 + k++;
    if (made == id_of.end() || made->second != want) {
      throw_input_error(where, "merge \"" + echo_value(line) + "\" should make token " + std::to_string(want) + " of " +
                                   file_.string() + ", which " +
                                   (made == id_of.end() ? std::string("has no token of those bytes")
                                                        : "gives those bytes id " + std::to_string(made->second)) +
                                   " (the files do not belong together, or one is cut short)");
    }
    const auto a = id_of.find(left), b = id_of.find(right);
    if (a == id_of.end() || b == id_of.end() || a->second >= want || b->second >= want) {
      throw_input_error(where, "merge \"" + echo_value(line) + "\" joins a token that no earlier line makes");
    }
    merges_.emplace(pair_key(a->second, b->second), int32_t(want));
  }
  std::size_t multi_byte = 0;
  for (std::size_t id = 0; id < bytes_.size(); ++id) {
    multi_byte += known_[id] && bytes_[id].size() > 1 && !special(bytes_[id]);
  }
  if (merges_.size() != multi_byte) {
    throw_input_error(file, std::to_string(merges_.size()) + " merges, but " + file_.string() + " has " + std::to_string(multi_byte) +
                                " tokens of two or more bytes, each made by one merge (is a file cut short?)");
  }
}

// Without vocab.bpe (gpt2.tiktoken lists tokens and ids only), each token's merge is what byte-pair
// merging of its bytes with the merges of the tokens before it leaves: two parts, or the token is
// never made by merging. For GPT-2 this gives vocab.bpe's merges exactly.
void Gpt2Vocab::derive_merges() {
  MergeScratch scratch;
  std::vector<int32_t> parts;
  const auto lookup = [this](int32_t left, int32_t right) { return merged(left, right); };
  for (std::size_t id = 0; id < bytes_.size(); ++id) {
    const std::string& b = bytes_[id];
    if (!known_[id] || b.size() < 2 || special(b)) continue;
    if (std::any_of(b.begin(), b.end(), [&](char c) { return byte_id_[uint8_t(c)] < 0; })) continue;
    parts.clear();
    merge_piece(b, byte_id_, lookup, scratch, parts);
    if (parts.size() == 2) merges_.emplace(pair_key(parts[0], parts[1]), int32_t(id));
  }
}

namespace {

// Character classes of GPT-2's pre-tokenizer; a byte that is not UTF-8 is `other` (Python reads it
// as a lone surrogate, which is none of the three).
enum class Class : uint8_t { letter, number, space, other };

template <std::size_t N>
constexpr bool in_table(const CodePointRange (&table)[N], uint32_t cp) {
  std::size_t lo = 0, hi = N;  // the first range ending at or after cp
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    if (table[mid].last < cp) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo < N && table[lo].first <= cp;
}

constexpr Class class_from_tables(uint32_t cp) {
  if (in_table(kLetterRanges, cp)) return Class::letter;
  if (in_table(kNumberRanges, cp)) return Class::number;
  if (in_table(kSpaceRanges, cp)) return Class::space;
  return Class::other;
}

// U+0000..U+00FF looked up directly (from the same tables, at compile time).
constexpr std::array<Class, 256> kLatin1 = [] {
  std::array<Class, 256> out{};
  for (uint32_t cp = 0; cp < 256; ++cp) out[cp] = class_from_tables(cp);
  return out;
}();

Class class_of(uint32_t cp) { return cp < 256 ? kLatin1[cp] : class_from_tables(cp); }

constexpr uint32_t kNotUtf8 = 0x110000;  // the code point recorded for a byte that is not UTF-8

struct Char {
  uint32_t cp;
  Class cls;
  std::size_t at;  // its first byte in the text
};

// The pieces GPT-2's pattern cuts `text` into, in one pass:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
template <class Piece>
void pretokenize(std::string_view text, Piece&& piece) {
  std::vector<Char> cs;
  cs.reserve(text.size() + 1);
  for (std::size_t i = 0; i < text.size();) {
    uint32_t cp = 0;
    const std::size_t n = utf8_length(text, i, cp);
    if (n == 0) {
      cs.push_back({kNotUtf8, Class::other, i});
      ++i;
    } else {
      cs.push_back({cp, class_of(cp), i});
      i += n;
    }
  }
  const std::size_t n = cs.size();
  cs.push_back({0, Class::other, text.size()});  // where the last character ends
  const auto emit = [&](std::size_t from, std::size_t to) { piece(text.substr(cs[from].at, cs[to].at - cs[from].at)); };
  const auto run_end = [&](std::size_t j, Class c) {
    while (j < n && cs[j].cls == c) ++j;
    return j;
  };
  // The length of the contraction after the apostrophe at `i`, 0 when there is none.
  const auto contraction = [&](std::size_t i) -> std::size_t {
    for (const std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
      std::size_t k = 0;
      while (k < suffix.size() && i + 1 + k < n && cs[i + 1 + k].cp == uint32_t(uint8_t(suffix[k]))) ++k;
      if (k == suffix.size()) return k;
    }
    return 0;
  };
  std::size_t i = 0;
  while (i < n) {
    if (cs[i].cp == '\'') {
      if (const std::size_t k = contraction(i); k > 0) {
        emit(i, i + 1 + k);
        i += 1 + k;
        continue;
      }
    }
    // An optional space, then a run of letters, of numbers or of other characters.
    const std::size_t body = cs[i].cp == ' ' && i + 1 < n ? i + 1 : i;
    if (cs[body].cls != Class::space) {
      const std::size_t end = run_end(body, cs[body].cls);
      emit(i, end);
      i = end;
      continue;
    }
    // White space: the run, less its last character when a non-space follows (\s+(?!\S)); a lone
    // white-space character before a non-space is a piece of its own (\s+).
    const std::size_t end = run_end(i, Class::space);
    const std::size_t stop = end == n || end - i == 1 ? end : end - 1;
    emit(i, stop);
    i = stop;
  }
}

}  // namespace

std::vector<int32_t> Gpt2Vocab::encode(const std::string& text) const {
  if (text.size() > std::size_t(INT32_MAX)) {
    throw_input_error("prompt", "is " + std::to_string(text.size()) + " bytes; at most 2 GiB can be encoded");
  }
  std::vector<int32_t> ids;
  MergeScratch scratch;
  const auto lookup = [this](int32_t left, int32_t right) { return merged(left, right); };
  pretokenize(text, [&](std::string_view piece) { merge_piece(piece, byte_id_, lookup, scratch, ids); });
  return ids;
}

std::string Gpt2Vocab::decode(const std::vector<int32_t>& tokens) const {
  std::string out;
  for (int32_t t : tokens) {
    if (t >= 0 && std::size_t(t) < bytes_.size() && known_[std::size_t(t)]) {
      out += bytes_[std::size_t(t)];
    } else {
      out += "<|" + std::to_string(t) + "|>";
    }
  }
  return out;
}

}  // namespace ablate::token_shards
