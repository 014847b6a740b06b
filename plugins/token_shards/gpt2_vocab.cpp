#include "gpt2_vocab.hpp"

#include <climits>
#include <clocale>
#include <cwctype>
#include <fstream>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"

namespace ablate::token_shards {

namespace fs = std::filesystem;

namespace {


bool prints(int32_t b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

// GPT-2's files are 1-2 MB; a FIFO, a device or a file past kMaxTokenizerBytes is refused.
std::string read_bounded(const fs::path& p) { return read_regular_file(p, "GPT-2 tokenizer file", kMaxTokenizerBytes); }

struct CodePoint {
  uint32_t cp;
  std::size_t at, size;  // its bytes in the text
};

// The code points of UTF-8 text with their byte ranges. A malformed sequence gives its first byte
// alone as a code point and sets *malformed (when given).
std::vector<CodePoint> decode_utf8(const std::string& s, bool* malformed = nullptr) {
  std::vector<CodePoint> out;
  if (malformed != nullptr) *malformed = false;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = uint8_t(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    uint32_t cp = n <= 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    int k = 1;
    for (; k < n && i + std::size_t(k) < s.size() && (uint8_t(s[i + std::size_t(k)]) >> 6) == 2; ++k) {
      cp = (cp << 6) | (uint8_t(s[i + std::size_t(k)]) & 0x3Fu);
    }
    if (n == 0 || k != n) {
      cp = c;
      k = 1;
      if (malformed != nullptr) *malformed = true;
    }
    out.push_back({cp, i, std::size_t(k)});
    i += std::size_t(k);
  }
  return out;
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
  if (code_point < 256 && prints(int32_t(code_point))) return int32_t(code_point);
  if (code_point < 256) return -1;
  int32_t n = 0;  // the (code_point - 256)-th byte that does not print
  for (int32_t b = 0; b < 256; ++b) {
    if (prints(b)) continue;
    if (uint32_t(256 + n) == code_point) return b;
    ++n;
  }
  return -1;
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
  const auto put = [&](const std::string& where, int64_t id, std::string bytes) {
    if (id < 0 || id >= vocab_size) {
      throw_input_error(where, "token id " + std::to_string(id) + " is outside the vocabulary (vocab_size " +
                                   std::to_string(vocab_size) + ")");
    }
    if (v.known_[std::size_t(id)]) throw_input_error(where, "token id " + std::to_string(id) + " appears twice");
    v.known_[std::size_t(id)] = true;
    v.bytes_[std::size_t(id)] = std::move(bytes);
    ++v.count_;
  };
  std::error_code ec;
  if (fs::exists(fs::symlink_status(dir / "encoder.json", ec))) {
    v.file_ = dir / "encoder.json";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_bounded(v.file_));
    } catch (const nlohmann::json::exception& e) {
      throw_input_error(v.file_.string(), std::string("not valid JSON: ") + e.what());
    }
    if (!j.is_object()) throw_input_error(v.file_.string(), "must be a JSON object of token string -> id");
    for (const auto& [token, id] : j.items()) {
      const std::string where = v.file_.string() + ": entry \"" + token + "\"";
      if (!id.is_number_integer()) throw_input_error(where, "the id must be an integer");
      bool malformed = false;
      const std::vector<CodePoint> cps = decode_utf8(token, &malformed);
      if (malformed) throw_input_error(where, "is not UTF-8");
      std::string bytes;
      for (const CodePoint& c : cps) {
        const int32_t b = gpt2_byte_of(c.cp);
        if (b < 0) throw_input_error(where, "holds a code point outside GPT-2's byte table: not a byte-level BPE token");
        bytes.push_back(char(b));
      }
      put(where, id.get<int64_t>(), std::move(bytes));
    }
  } else if (fs::exists(fs::symlink_status(dir / "gpt2.tiktoken", ec))) {
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
  for (std::size_t id = 0; id < v.bytes_.size(); ++id) {
    const std::string& b = v.bytes_[id];
    if (!v.known_[id] || b.empty()) continue;
    if (b.size() > 4 && b.compare(0, 2, "<|") == 0 && b.compare(b.size() - 2, 2, "|>") == 0) continue;  // special
    v.rank_.emplace(b, int32_t(id));
    if (b.size() == 1) ++v.byte_tokens_;
  }
  return v;
}

namespace {

// Character classes of GPT-2's pre-tokenizer, from the C library's tables under a UTF-8 locale.
enum class Class { letter, number, space, other };

Class class_of(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return Class::letter;
    if (cp >= '0' && cp <= '9') return Class::number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return Class::space;
    return Class::other;
  }
  static std::once_flag once;
  static locale_t utf8 = nullptr;
  std::call_once(once, [] { utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", nullptr); });
  if (utf8 == nullptr) return Class::letter;  // no tables: treat as a letter (keeps words whole)
  const auto w = wint_t(cp);
  if (iswspace_l(w, utf8)) return Class::space;
  if (iswdigit_l(w, utf8)) return Class::number;
  if (iswalpha_l(w, utf8)) return Class::letter;
  return Class::other;
}

// The pieces GPT-2's pattern cuts `text` into:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::string> pretokenize(const std::string& text) {
  const std::vector<CodePoint> cps = decode_utf8(text);
  std::vector<Class> cls(cps.size());
  for (std::size_t i = 0; i < cps.size(); ++i) cls[i] = class_of(cps[i].cp);
  std::vector<std::string> out;
  const auto piece = [&](std::size_t from, std::size_t to) {
    const std::size_t a = cps[from].at, b = cps[to - 1].at + cps[to - 1].size;
    out.push_back(text.substr(a, b - a));
  };
  const auto run_of = [&](std::size_t from, auto&& in_class) {
    std::size_t j = from;
    while (j < cps.size() && in_class(cls[j])) ++j;
    return j;
  };
  const auto is = [](Class c) { return [c](Class x) { return x == c; }; };
  const auto is_other = [](Class x) { return x == Class::other; };
  std::size_t i = 0;
  while (i < cps.size()) {
    // Contractions.
    if (cps[i].cp == '\'') {
      std::size_t matched = 0;
      for (const char* suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
        std::size_t k = 0;
        while (suffix[k] != 0 && i + 1 + k < cps.size() && cps[i + 1 + k].cp == uint32_t(suffix[k])) ++k;
        if (suffix[k] == 0) {
          matched = k;
          break;
        }
      }
      if (matched > 0) {
        piece(i, i + 1 + matched);
        i += 1 + matched;
        continue;
      }
    }
    // An optional space, then a run of letters, of numbers or of other characters.
    const std::size_t start = i, body = (cps[i].cp == ' ' && i + 1 < cps.size()) ? i + 1 : i;
    if (cls[body] != Class::space) {
      const std::size_t end = cls[body] == Class::other ? run_of(body, is_other) : run_of(body, is(cls[body]));
      piece(start, end);
      i = end;
      continue;
    }
    // White space: the run, less its last character when a non-space follows (\s+(?!\S)); a lone
    // space before a non-space is a piece of its own (\s+).
    const std::size_t end = run_of(i, is(Class::space));
    if (end == cps.size() || end - i == 1) {
      piece(i, end);
      i = end;
    } else {
      piece(i, end - 1);
      i = end - 1;
    }
  }
  return out;
}

}  // namespace

std::vector<int32_t> Gpt2Vocab::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  for (const std::string& piece : pretokenize(text)) {
    std::vector<std::string> parts;
    for (char c : piece) parts.emplace_back(1, c);
    for (;;) {  // merge the adjacent pair of lowest rank, leftmost first, until none is a token
      int32_t best = INT32_MAX;
      std::size_t at = 0;
      for (std::size_t j = 0; j + 1 < parts.size(); ++j) {
        const auto it = rank_.find(parts[j] + parts[j + 1]);
        if (it != rank_.end() && it->second < best) {
          best = it->second;
          at = j;
        }
      }
      if (best == INT32_MAX) break;
      parts[at] += parts[at + 1];
      parts.erase(parts.begin() + std::ptrdiff_t(at) + 1);
    }
    for (const std::string& p : parts) ids.push_back(rank_.at(p));
  }
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
