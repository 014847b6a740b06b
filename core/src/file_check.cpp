// Regular-file checks and bounded reads (see file_check.hpp).
#include "ablate/file_check.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ablate/error.hpp"

namespace ablate {

namespace fs = std::filesystem;

namespace {

std::string with_article(std::string_view kind) {
  const bool vowel = !kind.empty() && std::string_view("aeiouAEIOU").find(kind.front()) != std::string_view::npos;
  return (vowel ? "an " : "a ") + std::string(kind);
}

const char* type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string bytes_text(std::uintmax_t n) {
  if (n >= (std::uintmax_t(1) << 30) && n % (std::uintmax_t(1) << 30) == 0) return std::to_string(n >> 30) + " GiB";
  if (n >= (std::uintmax_t(1) << 20) && n % (std::uintmax_t(1) << 20) == 0) return std::to_string(n >> 20) + " MiB";
  if (n >= (std::uintmax_t(1) << 10) && n % (std::uintmax_t(1) << 10) == 0) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " bytes";
}

// What a symlink named by `path` points to, for the message ("" when `path` is no symlink).
std::string link_note(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return "";
  const fs::path target = fs::read_symlink(path, ec);
  return ec ? std::string("a symlink to ") : "a symlink to " + target.string() + ", ";
}

std::uintmax_t check_stat(const struct stat& st, const fs::path& path, std::string_view kind, std::uintmax_t max_bytes) {
  if (!S_ISREG(st.st_mode)) {
    const std::string what = type_name(st.st_mode);
    const std::string text = what == "not a regular file" ? what : what + ", not a regular file";
    throw_input_error(path.string(), "is " + link_note(path) + text + ": expected " + with_article(kind));
  }
  const auto size = std::uintmax_t(st.st_size);
  if (size > max_bytes) {
    throw_input_error(path.string(), "is " + std::to_string(size) + " bytes, more than the " + bytes_text(max_bytes) + " " +
                                         with_article(kind) + " may be");
  }
  return size;
}

}  // namespace

std::uintmax_t check_regular_file(const fs::path& path, std::string_view kind, std::uintmax_t max_bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      std::error_code ec;
      const bool dangling = fs::is_symlink(fs::symlink_status(path, ec));
      throw_input_error(path.string(), std::string(dangling ? "is a symlink to nothing (" + fs::read_symlink(path, ec).string() + ")"
                                                            : "does not exist") +
                                           ": expected " + with_article(kind));
    }
    throw_input_error(path.string(), "cannot read " + with_article(kind) + ": " + std::strerror(err));
  }
  return check_stat(st, path, kind, max_bytes);
}

std::uintmax_t check_regular_fd(int fd, const fs::path& path, std::string_view kind, std::uintmax_t max_bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_input_error(path.string(), std::string("cannot stat: ") + std::strerror(errno));
  return check_stat(st, path, kind, max_bytes);
}

int open_regular_file(const fs::path& path, std::string_view kind, std::uintmax_t max_bytes) {
  check_regular_file(path, kind, max_bytes);
  // O_NONBLOCK: should the path have become a FIFO since the check, open() returns at once and the
  // descriptor check refuses it. A regular file ignores the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw_input_error(path.string(), "cannot open " + with_article(kind) + ": " + std::strerror(errno));
  try {
    check_regular_fd(fd, path, kind, max_bytes);
  } catch (...) {
    ::close(fd);
    throw;
  }
  return fd;
}

std::string read_regular_file(const fs::path& path, std::string_view kind, std::uintmax_t max_bytes) {
  const int fd = open_regular_file(path, kind, max_bytes);
  std::string out;
  try {
    out.resize(std::size_t(check_regular_fd(fd, path, kind, max_bytes)));
    std::size_t done = 0;
    for (;;) {
      if (done == out.size()) {
        // Read past the size fstat gave: a file that grew is read to its end, up to the cap.
        if (out.size() > max_bytes) {
          throw_input_error(path.string(),
                            "grew past " + bytes_text(max_bytes) + " while it was read: " + with_article(kind) + " is at most that");
        }
        out.resize(out.size() + 4096);
      }
      const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw_input_error(path.string(), "cannot read " + with_article(kind) + ": " + std::strerror(errno));
      }
      if (n == 0) break;
      done += std::size_t(n);
    }
    out.resize(done);
    if (done > max_bytes) {
      throw_input_error(path.string(),
                        "grew past " + bytes_text(max_bytes) + " while it was read: " + with_article(kind) + " is at most that");
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

void check_output_file(const fs::path& path, std::string_view kind) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return;  // nothing there (or a dangling symlink): created
  if (!S_ISREG(st.st_mode)) {
    throw_input_error(path.string(), "is " + link_note(path) + type_name(st.st_mode) + ", not a regular file: expected " +
                                         with_article(kind) + " to write (or nothing there)");
  }
}

void check_output_directory(const fs::path& dir, std::string_view kind) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    // Nothing there: it is created, so the nearest thing that exists above it must be a directory.
    for (fs::path up = dir.parent_path(); !up.empty(); up = up.parent_path()) {
      if (::stat(up.c_str(), &st) != 0) {
        if (up == up.parent_path()) break;
        continue;
      }
      if (!S_ISDIR(st.st_mode)) {
        const std::string what = S_ISREG(st.st_mode) ? std::string("an existing file") : type_name(st.st_mode);
        throw_input_error(dir.string(), "cannot be created: " + up.string() + " is " + link_note(up) + what + ", not a directory (" +
                                            std::string(kind) +
                                            " must be a directory or a path that "
                                            "can be created)");
      }
      break;
    }
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    const std::string what = S_ISREG(st.st_mode) ? std::string("an existing file") : type_name(st.st_mode);
    throw_input_error(dir.string(), "is " + link_note(dir) + what + ", not a directory: " + std::string(kind) +
                                        " must be a directory or a path that does not exist yet");
  }
}

std::size_t json_too_deep_at(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return std::string_view::npos;
}

void check_json_depth(std::string_view text, const std::string& where, int max_depth) {
  const std::size_t at = json_too_deep_at(text, max_depth);
  if (at == std::string_view::npos) return;
  const auto line = 1 + std::count(text.begin(), text.begin() + std::ptrdiff_t(at), '\n');
  throw_input_error(where, "nests deeper than " + std::to_string(max_depth) + " levels (at line " + std::to_string(line) + ", byte " +
                               std::to_string(at) + "): not a file ablate can read");
}

std::string read_json_text(const fs::path& path, std::string_view kind, std::uintmax_t max_bytes) {
  std::string text = read_regular_file(path, kind, max_bytes);
  check_json_depth(text, path.string());
  return text;
}

}  // namespace ablate
