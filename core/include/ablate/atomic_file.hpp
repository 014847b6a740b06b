// The one way ablate replaces a file: write a temporary file beside it, fsync it, rename it over
// the target, fsync the directory. A crash leaves the old content or the new, never a mix, and
// what a run has already saved is never lost to a half-written replacement.
#pragma once

#include <filesystem>
#include <string>

namespace ablate {

// Writes `bytes` to `path` atomically. Throws ablate::Error (runtime) naming the file on failure.
void write_file_atomic(const std::filesystem::path& path, const std::string& bytes);

}  // namespace ablate
