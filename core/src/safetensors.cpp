// safetensors reader and writer, and atomic file replacement (see safetensors.hpp).
#include "ablate/runtime/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <unordered_set>
#include <string>
#include <nlohmann/json.hpp>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"

namespace ablate {

namespace fs = std::filesystem;

namespace {

const char* st_dtype(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::i32: return "I32";
    case DType::u16: return "U16";
    case DType::u8: return "U8";
    case DType::f64: return "F64";
  }
  return "";
}

bool parse_dtype(const std::string& s, DType& out) {
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::u16, DType::u8, DType::f64}) {
    if (s == st_dtype(d)) {
      out = d;
      return true;
    }
  }
  return false;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The first top-level key of a JSON object text that appears twice, "" when none does: one SAX
// pass, a hash set of the keys seen (linear in the text).
std::string first_duplicate_key(const std::string& text) {
  struct Keys : nlohmann::json_sax<nlohmann::json> {
    int depth = 0;
    std::unordered_set<std::string> seen;
    std::string duplicate;
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return ++depth, true; }
    bool end_object() override { return --depth, true; }
    bool start_array(std::size_t) override { return ++depth, true; }
    bool end_array() override { return --depth, true; }
    bool key(string_t& k) override {
      if (depth == 1 && !seen.insert(k).second) {
        duplicate = k;
        return false;  // stop: one is enough
      }
      return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
  } keys;
  nlohmann::json::sax_parse(text, &keys);
  return keys.duplicate;
}

}  // namespace

const NamedTensor* SafetensorsFile::find(const std::string& name) const {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

std::unordered_map<std::string, const NamedTensor*> tensors_by_name(const SafetensorsFile& file) {
  std::unordered_map<std::string, const NamedTensor*> out;
  out.reserve(file.tensors.size());
  for (const NamedTensor& t : file.tensors) out.emplace(t.name, &t);
  return out;
}

void write_safetensors(const fs::path& path, const SafetensorsFile& file) {
  // The header is written entry by entry (an ordered_json object would look each new key up with a
  // scan of the others: quadratic in the number of tensors).
  std::string json = "{";
  const auto add = [&json](const std::string& key, const nlohmann::ordered_json& value) {
    if (json.size() > 1) json += ',';
    json += nlohmann::ordered_json(key).dump();
    json += ':';
    json += value.dump();
  };
  if (!file.metadata.empty()) add("__metadata__", nlohmann::ordered_json(file.metadata));
  std::unordered_set<std::string> names;
  uint64_t offset = 0;
  for (const NamedTensor& t : file.tensors) {
    const uint64_t size = uint64_t(numel(t.shape)) * dtype_size(t.dtype);
    if (size != t.bytes.size()) {
      throw_runtime_error(path.string(), "tensor '" + t.name + "' has " + std::to_string(t.bytes.size()) + " bytes for its shape's " +
                                             std::to_string(size));
    }
    if (t.name == "__metadata__" || !names.insert(t.name).second) {
      throw_runtime_error(path.string(), "tensor name '" + t.name + "' is repeated or reserved");
    }
    add(t.name, {{"dtype", st_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + size}}});
    offset += size;
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');  // align the data to 8 bytes, as the reference writer does
  std::string bytes(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) bytes[i] = char((n >> (8 * i)) & 0xff);
  bytes += json;
  bytes.reserve(bytes.size() + offset);
  for (const NamedTensor& t : file.tensors) bytes.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  write_file_atomic(path, bytes);
}

namespace {

// n bytes of `fd` at `offset`: false when the file ends (or fails) first.
bool read_at(int fd, uint64_t offset, void* into, uint64_t n) {
  auto* p = static_cast<char*>(into);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, std::size_t(n), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    offset += uint64_t(got);
    n -= uint64_t(got);
  }
  return true;
}

// The JSON header's text of a safetensors file of `file_size` bytes, after its 8-byte length.
std::string read_header_text(int fd, uint64_t file_size, const std::string& where) {
  if (file_size < 8) throw_input_error(where, "truncated: " + std::to_string(file_size) + " bytes, no header length");
  unsigned char len_bytes[8];
  if (!read_at(fd, 0, len_bytes, 8)) throw_input_error(where, "could not read the header length");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(len_bytes[i]) << (8 * i);
  if (header_len > file_size - 8) {
    throw_input_error(where, "truncated: header of " + std::to_string(header_len) + " bytes but the file has " +
                                 std::to_string(file_size) + " bytes");
  }
  std::string json(header_len, '\0');
  if (!read_at(fd, 8, json.data(), header_len))
    throw_input_error(where, "could not read the " + std::to_string(header_len) + "-byte header");
  return json;
}

// The header parsed, refused unless it is a JSON object with no key twice.
nlohmann::json parse_header(const std::string& json, const std::string& where) {
  nlohmann::json header;
  check_json_depth(json, where + ": header");
  try {
    header = nlohmann::json::parse(json);
  } catch (const std::exception& e) {
    throw_input_error(where + ":offset 8", std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) throw_input_error(where, "header is not a JSON object");
  // JSON lets a key repeat (the parser keeps the last); two tensors of one name are refused. A
  // second, SAX pass sees every top-level key in linear time (a parse callback would not: the DOM
  // parser rescans the top-level object for discarded values at the end of every entry, which is
  // quadratic in the number of tensors).
  const std::string duplicate = first_duplicate_key(json);
  if (!duplicate.empty()) throw_input_error(where, "the header names tensor '" + duplicate + "' twice");
  return header;
}

// A tensor of the header and where its bytes lie in the data section.
struct Entry {
  uint64_t begin, end;
  NamedTensor tensor;
};

// Where the data section lies in the file, for checking each tensor's entry against it.
struct DataSection {
  uint64_t start, size, file_size;
};

// The header's entry for tensor `name`, checked: a known dtype, a shape of no negative dimension,
// data_offsets that span exactly its bytes and lie inside the file.
Entry tensor_entry(const std::string& name, const nlohmann::json& v, const std::string& where, const DataSection& data) {
  NamedTensor t;
  t.name = name;
  try {
    if (!parse_dtype(v.at("dtype").get<std::string>(), t.dtype)) {
      throw_input_error(where, "tensor '" + t.name + "' has unsupported dtype " + v.at("dtype").dump());
    }
    t.shape = v.at("shape").get<std::vector<int64_t>>();
    const auto offsets = v.at("data_offsets").get<std::vector<uint64_t>>();
    if (offsets.size() != 2 || offsets[0] > offsets[1]) throw_input_error(where, "tensor '" + t.name + "' has bad data_offsets");
    for (int64_t d : t.shape) {
      if (d < 0) throw_input_error(where, "tensor '" + t.name + "' has a negative dimension");
    }
    if (offsets[1] - offsets[0] != uint64_t(numel(t.shape)) * dtype_size(t.dtype)) {
      throw_input_error(where, "tensor '" + t.name + "': data_offsets span " + std::to_string(offsets[1] - offsets[0]) +
                                   " bytes, its shape and dtype need " +
                                   std::to_string(uint64_t(numel(t.shape)) * dtype_size(t.dtype)));
    }
    if (offsets[1] > data.size) {
      throw_input_error(where, "truncated: tensor '" + t.name + "' ends at byte " + std::to_string(data.start + offsets[1]) +
                                   " of a " + std::to_string(data.file_size) + "-byte file");
    }
    return {offsets[0], offsets[1], std::move(t)};
  } catch (const nlohmann::json::exception& e) {
    throw_input_error(where, "tensor '" + name + "' entry is malformed: " + e.what());
  }
}

}  // namespace

SafetensorsFile read_safetensors(const fs::path& path) {
  const std::string where = path.string();
  // A regular file of any size (the header is checked against it); the descriptor is checked
  // again once open, and a FIFO swapped in between does not block the open.
  const int fd = open_regular_file(path, "safetensors file");
  const uint64_t file_size = check_regular_fd(fd, path, "safetensors file");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const std::string json = read_header_text(fd, file_size, where);
  const nlohmann::json header = parse_header(json, where);
  const uint64_t data_start = 8 + json.size();
  const DataSection data{data_start, file_size - data_start, file_size};
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) throw_input_error(where, "__metadata__ is not a JSON object of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) throw_input_error(where, "metadata '" + m.key() + "' is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    entries.push_back(tensor_entry(it.key(), it.value(), where, data));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (std::size_t i = 1; i < entries.size(); ++i) {
    if (entries[i].begin < entries[i - 1].end) {
      throw_input_error(where, "tensors '" + entries[i - 1].tensor.name + "' and '" + entries[i].tensor.name + "' overlap");
    }
  }
  for (Entry& e : entries) {
    e.tensor.bytes.resize(e.end - e.begin);
    if (!read_at(fd, data_start + e.begin, e.tensor.bytes.data(), e.tensor.bytes.size()))
      throw_input_error(where, "could not read tensor '" + e.tensor.name + "'");
    out.tensors.push_back(std::move(e.tensor));
  }
  return out;
}

}  // namespace ablate
