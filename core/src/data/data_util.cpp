// Glob expansion (glob(3)), read-only memory maps (mmap(2)) and the tail split used by the
// file-backed data sources; the [batching] keys, document pieces and row writing of the batchers.
#include "ablate/data_util.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cmath>
#include <cstring>
#include <set>

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"

namespace ablate {

namespace fs = std::filesystem;

namespace {

bool has_glob_characters(const std::string& pattern) { return pattern.find_first_of("*?[") != std::string::npos; }

std::string prefixed(const std::string& where, const std::string& message) { return where.empty() ? message : where + ": " + message; }

}  // namespace

std::vector<fs::path> expand_paths(const std::vector<std::string>& patterns, const std::string& where) {
  std::vector<fs::path> files;
  std::set<std::string> seen;
  for (const std::string& pattern : patterns) {
    std::vector<std::string> matched;
    if (!has_glob_characters(pattern)) {
      std::error_code ec;
      if (!fs::exists(pattern, ec)) throw_input_error(pattern, prefixed(where, "no such file"));
      try {
        check_regular_file(pattern, "data file");
      } catch (const Error& e) {  // reworded as "PATH: WHERE: is a FIFO, not a regular file: ..."
        throw_input_error(pattern, prefixed(where, std::string(e.what()).substr(e.where().size() + 2)));
      }
      matched.push_back(pattern);
    } else {
      glob_t g{};
      const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
      if (rc == 0) {
        for (std::size_t i = 0; i < g.gl_pathc; ++i) {
          std::error_code ec;
          if (fs::is_regular_file(g.gl_pathv[i], ec)) matched.emplace_back(g.gl_pathv[i]);
        }
      }
      ::globfree(&g);
      if (rc != 0 && rc != GLOB_NOMATCH) throw_input_error(pattern, prefixed(where, "cannot read the directories of this glob"));
      if (matched.empty()) throw_input_error(pattern, prefixed(where, "the glob matches no file"));
      std::sort(matched.begin(), matched.end());
    }
    for (std::string& m : matched) {
      if (seen.insert(m).second) files.emplace_back(std::move(m));
    }
  }
  return files;
}

// ---------------------------------------------------------------------------------------------
// A mapped file that shrinks under the process (truncated or rewritten in place while a run reads
// it) turns the next read of a page past its new end into SIGBUS. The maps are recorded here so the
// handler can name the file and end the process with exit code 1 and a message instead of a
// signal death; checkpoints are written to a temporary directory and renamed into place, so the
// last complete one is intact whenever this happens.

namespace {

struct MapSlot {
  std::atomic<uintptr_t> begin{0};  // 0: free
  std::atomic<uintptr_t> end{0};
  char name[480] = {};
};
constexpr std::size_t kMapSlots = 4096;
MapSlot g_maps[kMapSlots];
std::atomic<bool> g_handler_installed{false};
struct sigaction g_previous_sigbus {};

void write_all(const char* s, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= std::size_t(w);
  }
}

void on_sigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const MapSlot& m : g_maps) {
    const uintptr_t b = m.begin.load(std::memory_order_acquire);
    if (b == 0 || addr < b || addr >= m.end.load(std::memory_order_acquire)) continue;
    static const char head[] = "error: ";
    static const char tail[] =
        ": the file shrank while the run read it (truncated or rewritten in place): the run stops here; its last "
        "complete checkpoint is intact (ablate train ... --resume continues once the file is whole again)\n";
    write_all(head, sizeof head - 1);
    write_all(m.name, ::strnlen(m.name, sizeof m.name));
    write_all(tail, sizeof tail - 1);
    ::_exit(1);
  }
  // Not one of ours: what would have happened without this handler.
  if (g_previous_sigbus.sa_flags & SA_SIGINFO && g_previous_sigbus.sa_sigaction != nullptr) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);
  ::raise(SIGBUS);
}

void install_sigbus_handler() {
  if (g_handler_installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
}

void record_map(const std::byte* data, std::size_t size, const fs::path& path) {
  install_sigbus_handler();
  const std::string name = path.string();
  for (MapSlot& m : g_maps) {
    uintptr_t expected = 0;
    // Claim the slot with a placeholder begin no address matches, fill it, then publish.
    if (!m.begin.compare_exchange_strong(expected, UINTPTR_MAX, std::memory_order_acq_rel)) continue;
    const std::size_t n = std::min(name.size(), sizeof m.name - 1);
    std::memcpy(m.name, name.data(), n);
    m.name[n] = 0;
    m.end.store(reinterpret_cast<uintptr_t>(data) + size, std::memory_order_release);
    m.begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
    return;
  }
  // Every slot taken: the map still works; a shrinking file would end the process by the signal.
}

void forget_map(const std::byte* data) {
  for (MapSlot& m : g_maps) {
    if (m.begin.load(std::memory_order_acquire) == reinterpret_cast<uintptr_t>(data)) {
      m.end.store(0, std::memory_order_release);
      m.begin.store(0, std::memory_order_release);
      return;
    }
  }
}

}  // namespace

MappedFile::MappedFile(const fs::path& path) : path_(path) {
  // Checked before and after the open (which does not block on a FIFO): only a regular file is
  // mapped; a data file's size is its own business (it is paged in on demand).
  const int fd = open_regular_file(path, "data file");
  try {
    size_ = std::size_t(check_regular_fd(fd, path, "data file"));
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw_input_error(path.string(), std::string("cannot map: ") + std::strerror(err));
    }
    data_ = static_cast<const std::byte*>(p);
    record_map(data_, size_, path);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept : path_(std::move(other.path_)), data_(other.data_), size_(other.size_) {
  other.data_ = nullptr;
  other.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_ != nullptr) {
    forget_map(data_);
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  data_ = nullptr;
  size_ = 0;
}

uint64_t validation_tail(uint64_t documents, double fraction) {
  if (fraction <= 0.0 || documents < 2) return 0;
  auto tail = uint64_t(std::llround(double(documents) * fraction));
  tail = std::max<uint64_t>(tail, 1);
  return std::min(tail, documents - 1);
}

// ---------------------------------------------------------------------------------------------

BatchingOptions BatchingOptions::from(const Params& common) {
  BatchingOptions o;
  o.batch_size = int32_t(common.get_int("batch_size"));
  o.seq_len = int32_t(common.get_int("seq_len"));
  o.append_eot = common.get_bool("append_eot");
  o.split_long = common.get_string("long_documents") == "split";
  return o;
}

DocumentPiece piece_of(const Document& doc, const PendingPiece& span) {
  const auto length = int32_t(doc.tokens.size());
  if (span.begin < 0 || span.end <= span.begin || span.end > length) {
    throw_input_error("data cursor", "piece [" + std::to_string(span.begin) + ", " + std::to_string(span.end) +
                                         ") does not fit document " + std::to_string(span.document) + " of " + std::to_string(length) +
                                         " tokens (was the cursor saved with other data?)");
  }
  DocumentPiece piece;
  piece.span = span;
  piece.ends_document = span.end == length;
  const int32_t copy_end = piece.ends_document ? span.end : span.end + 1;
  piece.tokens.assign(doc.tokens.begin() + span.begin, doc.tokens.begin() + copy_end);
  return piece;
}

void cut_document(const Document& doc, int32_t seq_len, bool split_long, std::vector<DocumentPiece>& out) {
  const auto length = int32_t(doc.tokens.size());
  for (int32_t begin = 0; begin < length; begin += seq_len) {
    out.push_back(piece_of(doc, {doc.index, begin, std::min(length, begin + seq_len)}));
    if (!split_long) break;
  }
}

void write_rows(Batch& out, int32_t rows, int32_t seq_len, const std::vector<std::vector<const DocumentPiece*>>& row_pieces,
                int32_t final_target) {
  out.reset(rows, seq_len);
  for (int32_t r = 0; r < rows; ++r) {
    int32_t column = 0;
    int32_t segment_id = 0;
    if (std::size_t(r) < row_pieces.size()) {
      for (const DocumentPiece* piece : row_pieces[std::size_t(r)]) {
        const int32_t n = piece->length();
        if (column + n > seq_len) throw_runtime_error("batcher", "a row overflows its " + std::to_string(seq_len) + " positions");
        const std::size_t base = std::size_t(r) * std::size_t(seq_len) + std::size_t(column);
        ++segment_id;
        const int32_t* tok = piece->tokens.data();
        for (int32_t i = 0; i < n; ++i) {
          out.tokens[base + i] = tok[i];
          out.positions[base + i] = i;
          out.segment_ids[base + i] = segment_id;
        }
        // The next token of the document is the target; the piece's last token targets the token
        // after it (held in tokens[n]) or, at the document's end, final_target.
        for (int32_t i = 0; i + 1 < n; ++i) out.targets[base + i] = tok[i + 1];
        out.targets[base + n - 1] = piece->ends_document ? final_target : tok[n];
        out.segments.push_back({column, n});
        column += n;
      }
    }
    out.row_segments[std::size_t(r) + 1] = int32_t(out.segments.size());
  }
}

std::vector<int32_t> read_token_shard(const std::filesystem::path& path) {
  // Checked before and after the open, which does not block on a FIFO; its size is checked
  // against its header below.
  const int fd = open_regular_file(path, "token shard");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  const uintmax_t size = check_regular_fd(fd, path, "token shard");
  const auto read_at = [fd](uintmax_t offset, void* into, std::size_t n) {
    auto* p = static_cast<char*>(into);
    while (n > 0) {
      const ssize_t got = ::pread(fd, p, n, off_t(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      p += got;
      offset += uintmax_t(got);
      n -= std::size_t(got);
    }
    return true;
  };
  int32_t header[256];
  if (!read_at(0, header, sizeof header) || header[0] != 20240520) {
    throw_input_error(path.string(), "not an llm.c token shard (expected a 1024-byte header with magic 20240520)");
  }
  if (header[1] != 1) throw_input_error(path.string(), "shard version " + std::to_string(header[1]) + ", expected 1 (uint16 tokens)");
  // The header's count is checked against the file before anything is sized by it.
  const int64_t count = header[2];
  if (count < 0) throw_input_error(path.string(), "the header's token count is negative (" + std::to_string(count) + ")");
  const uintmax_t want = sizeof header + uintmax_t(count) * 2;
  if (size != want) {
    throw_input_error(path.string(), std::string(size < want ? "truncated" : "trailing bytes") + ": the header promises " +
                                         std::to_string(count) + " tokens (" + std::to_string(want) + " bytes), the file has " +
                                         std::to_string(size) + " bytes");
  }
  std::vector<uint16_t> raw(static_cast<std::size_t>(count));
  if (!read_at(sizeof header, raw.data(), raw.size() * 2)) throw_input_error(path.string(), "could not read its tokens");
  return {raw.begin(), raw.end()};
}

}  // namespace ablate
