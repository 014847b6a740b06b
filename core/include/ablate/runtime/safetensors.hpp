// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// Reading and writing the safetensors format (an 8-byte little-endian header length, a JSON
// header of name -> {dtype, shape, data_offsets} plus "__metadata__", then the raw bytes), which
// checkpoints and Hugging Face exports use. Writes are atomic: a temporary file in the same
// directory, fsync, rename, fsync of the directory, so a crash never leaves a broken file behind.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "ablate/atomic_file.hpp"
#include "ablate/tensor.hpp"

namespace ablate {

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in file order
  std::map<std::string, std::string> metadata;
  const NamedTensor* find(const std::string& name) const;  // a scan: for one or a few names
};

// Every tensor of `file` by name (the first of a repeated name), for looking many up in linear
// time overall; the pointers are into file.tensors and valid while it is unchanged.
std::unordered_map<std::string, const NamedTensor*> tensors_by_name(const SafetensorsFile& file);

// Throws ablate::Error (runtime) when the file cannot be written.
void write_safetensors(const std::filesystem::path& path, const SafetensorsFile& file);
// Throws ablate::Error (input) naming the file and what is wrong: truncated, bad header, offsets
// out of range or overlapping, unknown dtype.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

}  // namespace ablate
