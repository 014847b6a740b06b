#include "gpt2_vocab.hpp"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ablate/error.hpp"

namespace ablate::token_shards {

namespace fs = std::filesystem;

namespace {

constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t(64) << 20;  // GPT-2's files are 1-2 MB

bool prints(int32_t b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

std::string read_bounded(const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec) || fs::file_size(p, ec) > kMaxFileBytes) {
    throw_input_error(p.string(), "is not a regular file of at most 64 MiB: not a GPT-2 tokenizer file");
  }
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The code points of UTF-8 text; false on a malformed sequence.
bool code_points(const std::string& s, std::vector<uint32_t>& out) {
  out.clear();
  for (std::size_t i = 0; i < s.size();) {
    const auto c = uint8_t(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + std::size_t(n) > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
    for (int k = 1; k < n; ++k) {
      const auto d = uint8_t(s[i + std::size_t(k)]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    out.push_back(cp);
    i += std::size_t(n);
  }
  return true;
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
  return fs::is_regular_file(dir / "encoder.json", ec) || fs::is_regular_file(dir / "gpt2.tiktoken", ec);
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
  if (fs::is_regular_file(dir / "encoder.json", ec)) {
    v.file_ = dir / "encoder.json";
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_bounded(v.file_));
    } catch (const nlohmann::json::exception& e) {
      throw_input_error(v.file_.string(), std::string("not valid JSON: ") + e.what());
    }
    if (!j.is_object()) throw_input_error(v.file_.string(), "must be a JSON object of token string -> id");
    std::vector<uint32_t> cps;
    for (const auto& [token, id] : j.items()) {
      const std::string where = v.file_.string() + ": entry \"" + token + "\"";
      if (!id.is_number_integer()) throw_input_error(where, "the id must be an integer");
      if (!code_points(token, cps)) throw_input_error(where, "is not UTF-8");
      std::string bytes;
      for (uint32_t cp : cps) {
        const int32_t b = gpt2_byte_of(cp);
        if (b < 0) throw_input_error(where, "holds a code point outside GPT-2's byte table: not a byte-level BPE token");
        bytes.push_back(char(b));
      }
      put(where, id.get<int64_t>(), std::move(bytes));
    }
  } else if (fs::is_regular_file(dir / "gpt2.tiktoken", ec)) {
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
  return v;
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
