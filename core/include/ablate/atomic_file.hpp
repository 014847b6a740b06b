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

namespace ablate {

// One writer per directory: an advisory lock (flock on DIR/.lock) held for the object's life, with
// the holder's pid written in the file. A second process asking for it is refused (ablate::Error,
// input: exit 2) with that pid, before it reads or writes anything else there. The kernel drops
// the lock when the holder exits, however it exits, so a killed run never leaves the directory
// locked.
class DirectoryLock {
 public:
  DirectoryLock(const std::filesystem::path& dir, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace ablate
