// Atomic file replacement (see atomic_file.hpp).
#include "ablate/atomic_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"

namespace ablate {

namespace fs = std::filesystem;

namespace {

void fsync_path(const fs::path& p, int flags) {
  const int fd = ::open(p.c_str(), flags);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

void write_file_atomic(const fs::path& path, const std::string& bytes) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const fs::path tmp = dir / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw_runtime_error(tmp.string(), std::string("cannot create: ") + std::strerror(errno));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw_runtime_error(tmp.string(), "write failed: " + why);
    }
    done += std::size_t(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw_runtime_error(tmp.string(), std::string("fsync/close failed: ") + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    // Something other than a file by that name (a directory put there): the input's fault, exit 2.
    if (err == EISDIR || err == ENOTDIR || err == ENOTEMPTY || err == EEXIST) {
      throw_input_error(path.string(),
                        std::string("cannot be written: ") + std::strerror(err) + " (expected a regular file there, or nothing)");
    }
    throw_runtime_error(path.string(), std::string("rename failed: ") + std::strerror(err));
  }
  fsync_path(dir, O_RDONLY | O_DIRECTORY);
}

DirectoryLock::DirectoryLock(const fs::path& dir, const std::string& what) {
  check_output_directory(dir, what);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_input_error(dir.string(), "cannot create " + what + ": " + ec.message());
  const fs::path file = dir / ".lock";
  // Never through a symlink (the lock would be another file's, and the pid written over it), never
  // a FIFO or device (opening one may wait; writing the pid would feed it).
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd_ < 0 && errno == ELOOP) {
    throw_input_error(file.string(), "is a symlink: expected the lock file ablate keeps in " + what + " (a regular file); remove it");
  }
  if (fd_ < 0) throw_input_error(file.string(), std::string("cannot open the lock file: ") + std::strerror(errno));
  try {
    check_regular_fd(fd_, file, "lock file", kMaxPointerBytes);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char holder[32] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    std::string pid = n > 0 ? std::string(holder, std::size_t(n)) : std::string("unknown");
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    ::close(fd_);
    fd_ = -1;
    throw_input_error(dir.string(), what + " is in use by another ablate process (pid " + pid +
                                        "): one run per directory; wait for it or choose another directory");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size())) {
    // The lock holds without the pid; only the message of a refused second process is poorer.
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
}

}  // namespace ablate
