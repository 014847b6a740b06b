// The logger sinks of libablate_loggers, made through the registry from the built plugin: jsonl and
// csv read back to exactly the logged values and keep only the steps up to a resume; console writes
// plain lines or a bar redrawn in place; tensorboard's records are checked against an independent
// bitwise CRC32C and decoded by a protobuf reader written here. Bad keys and unwritable run
// directories are input errors naming the key or the path; mlflow without a usable server address
// is an input error naming where the address came from, and an unreachable server a runtime error
// naming it (check_mlflow.py talks to a real server).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ablate/error.hpp"
#include "ablate/logger.hpp"
#include "ablate/metrics.hpp"
#include "ablate/runtime/registry.hpp"
#include "sample_metrics.hpp"
#include "test_support.hpp"

using namespace ablate;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Plugins {
  Registry registry;
  bool loaded = registry.load_file(test::plugin_dir() / "libablate_loggers.so");
};

Registry& registry() {
  static Plugins p;
  if (!p.loaded) {
    for (const LoadFailure& f : p.registry.failures()) FAIL(f.file << ": " << f.reason);
  }
  return p.registry;
}

// A logger with its schema's defaults, then `overrides`, as its own table [logging.<name>].
std::unique_ptr<Logger> make(const std::string& name, std::map<std::string, Value, std::less<>> overrides = {}) {
  const ComponentInfo& info = registry().get(Kind::logger, name);
  std::map<std::string, Value, std::less<>> values;
  for (const ParamSpec& p : info.schema) values[p.name] = p.default_value;
  for (auto& [k, v] : overrides) values[k] = v;
  const Params common{"logging", {{"sinks", std::vector<std::string>{name}}, {"every", int64_t(1)}}};
  const Params own{"logging." + name, values};
  const RunContext run;
  return registry().create<Logger>(Kind::logger, name, {common, own, run});
}

LogContext context(const fs::path& run_dir, int64_t start_step = 0, int64_t total_steps = 4) {
  LogContext c;
  c.run_dir = run_dir.string();
  c.run_name = run_dir.filename().string();
  c.start_step = start_step;
  c.total_steps = total_steps;
  return c;
}

// Opens a logger, logs steps start_step+1..last, closes it.
void log_steps(Logger& logger, const fs::path& run_dir, int64_t start_step, int64_t last, double offset = 0) {
  logger.open(context(run_dir, start_step, last));
  for (int64_t s = start_step + 1; s <= last; ++s) logger.log(test::sample_step(s, offset));
  logger.close();
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> split(const std::string& line, char sep) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, sep)) out.push_back(cell);
  if (!line.empty() && line.back() == sep) out.emplace_back();
  return out;
}

// The input error a call throws, or a failed check when it throws none or another kind.
template <class F>
std::string input_error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    return e.what();
  }
  FAIL("no error thrown");
  return {};
}

// Redirects file descriptor 1 (where stdout and the test program's log go) into a file.
class CaptureStdout {
 public:
  explicit CaptureStdout(fs::path file) : file_(std::move(file)) {
    std::fflush(stdout);
    saved_ = dup(STDOUT_FILENO);
    const int fd = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    ::close(fd);
  }
  ~CaptureStdout() { restore(); }
  std::string finish() {
    restore();
    return slurp(file_);
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stdout);
    dup2(saved_, STDOUT_FILENO);
    ::close(saved_);
    saved_ = -1;
  }
  fs::path file_;
  int saved_ = -1;
};

// ---- an independent reader of TensorBoard event files ----------------------------------------

// CRC32C bit by bit (reflected polynomial 0x82F63B78), the reference for the plugin's Boost.CRC.
uint32_t crc32c_bitwise(const unsigned char* p, std::size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
  }
  return ~c;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint64_t read_le(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// The TFRecords of a file, each checked: length CRC and data CRC.
std::vector<std::string> read_records(const fs::path& file) {
  const std::string s = slurp(file);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::vector<std::string> records;
  std::size_t at = 0;
  while (at < s.size()) {
    REQUIRE(at + 12 <= s.size());
    const uint64_t length = read_le(p + at, 8);
    CHECK(read_le(p + at + 8, 4) == masked(crc32c_bitwise(p + at, 8)));
    REQUIRE(at + 12 + length + 4 <= s.size());
    CHECK(read_le(p + at + 12 + length, 4) == masked(crc32c_bitwise(p + at + 12, length)));
    records.push_back(s.substr(at + 12, length));
    at += 12 + length + 4;
  }
  return records;
}

// One protobuf field: number, wire type and payload (varint value, fixed bits or bytes).
struct Field {
  uint32_t number = 0;
  int wire = 0;
  uint64_t value = 0;
  std::string bytes;
};

std::vector<Field> parse_message(const std::string& msg) {
  std::size_t at = 0;
  auto varint = [&] {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      REQUIRE(at < msg.size());
      const auto b = uint8_t(msg[at++]);
      v |= uint64_t(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
  };
  std::vector<Field> fields;
  while (at < msg.size()) {
    Field f;
    const uint64_t key = varint();
    f.number = uint32_t(key >> 3);
    f.wire = int(key & 7);
    if (f.wire == 0) {
      f.value = varint();
    } else if (f.wire == 1 || f.wire == 5) {
      const int n = f.wire == 1 ? 8 : 4;
      REQUIRE(at + n <= msg.size());
      f.value = read_le(reinterpret_cast<const unsigned char*>(msg.data() + at), n);
      at += std::size_t(n);
    } else if (f.wire == 2) {
      const uint64_t n = varint();
      REQUIRE(at + n <= msg.size());
      f.bytes = msg.substr(at, n);
      at += n;
    } else {
      FAIL("unexpected wire type " << f.wire);
    }
    fields.push_back(f);
  }
  return fields;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  int64_t restart_status = -1;  // SessionLog.status when the event is one
  std::vector<std::pair<std::string, float>> scalars;
};

Event decode_event(const std::string& record) {
  Event e;
  for (const Field& f : parse_message(record)) {
    if (f.number == 1) {
      CHECK(f.wire == 1);
      std::memcpy(&e.wall_time, &f.value, 8);
    } else if (f.number == 2) {
      CHECK(f.wire == 0);
      e.step = int64_t(f.value);
    } else if (f.number == 3) {
      e.file_version = f.bytes;
    } else if (f.number == 5) {
      for (const Field& v : parse_message(f.bytes)) {
        REQUIRE(v.number == 1);
        std::pair<std::string, float> scalar;
        for (const Field& vf : parse_message(v.bytes)) {
          if (vf.number == 1) scalar.first = vf.bytes;
          if (vf.number == 2) {
            CHECK(vf.wire == 5);
            const auto bits = uint32_t(vf.value);
            std::memcpy(&scalar.second, &bits, 4);
          }
        }
        e.scalars.push_back(scalar);
      }
    } else if (f.number == 7) {
      for (const Field& s : parse_message(f.bytes)) {
        if (s.number == 1) e.restart_status = int64_t(s.value);
      }
    } else {
      FAIL("unexpected Event field " << f.number);
    }
  }
  return e;
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// What a scalar event must hold for `m`: every metric but step, tagged as docs/logging.md says.
std::vector<std::pair<std::string, float>> expected_scalars(const StepMetrics& m) {
  std::vector<std::pair<std::string, float>> out;
  for (const auto& [name, v] : metric_values(m)) {
    if (name == "step") continue;
    out.emplace_back(name == "val_loss" ? "val/loss" : "train/" + name, float(v));
  }
  return out;
}

}  // namespace

TEST_CASE("the plugin registers console, jsonl, csv, tensorboard and mlflow as loggers") {
  CHECK(registry().names(Kind::logger) == std::vector<std::string>{"console", "csv", "jsonl", "mlflow", "tensorboard"});
}

TEST_CASE("the reference CRC32C gives the standard check value") {
  const char* digits = "123456789";
  CHECK(crc32c_bitwise(reinterpret_cast<const unsigned char*>(digits), 9) == 0xE3069283u);
}

// ---- jsonl ------------------------------------------------------------------------------------

TEST_CASE("jsonl: one line per logged step that parses back to exactly the logged values") {
  test::TempDir tmp;
  auto logger = make("jsonl");
  log_steps(*logger, tmp.path(), 0, 4);
  const std::vector<std::string> lines = lines_of(slurp(tmp.path() / "metrics.jsonl"));
  REQUIRE(lines.size() == 4);
  for (int64_t s = 1; s <= 4; ++s) {
    const json j = json::parse(lines[std::size_t(s - 1)]);
    const auto want = metric_values(test::sample_step(s));
    CHECK(j.size() == want.size());
    for (const auto& [name, v] : want) {
      INFO("step " << s << " " << name);
      REQUIRE(j.contains(name));
      if (metric_is_count(name)) {
        CHECK(j[name].is_number_integer());
        CHECK(j[name].get<int64_t>() == int64_t(v));
      } else {
        CHECK(j[name].is_number_float());
        CHECK(j[name].get<double>() == v);  // exact: the text reads back to the same double
      }
    }
    CHECK(j.contains("val_loss") == (s % 2 == 0));
  }
  // docs/architecture.md's order: step first, optimizer_state_bytes last of the fixed ones.
  CHECK(lines[0].rfind("{\"step\":1,\"loss\":", 0) == 0);
}

TEST_CASE("jsonl: a resumed run keeps the lines up to its start step, a cut-short line is dropped") {
  test::TempDir tmp;
  log_steps(*make("jsonl"), tmp.path(), 0, 4);
  std::ofstream(tmp.path() / "metrics.jsonl", std::ios::app) << "{\"step\":5,\"loss\":1.2";  // a crash mid-line
  log_steps(*make("jsonl"), tmp.path(), 2, 4, 0.5);
  const std::vector<std::string> lines = lines_of(slurp(tmp.path() / "metrics.jsonl"));
  REQUIRE(lines.size() == 4);
  for (int64_t s = 1; s <= 4; ++s) {
    const json j = json::parse(lines[std::size_t(s - 1)]);
    CHECK(j["step"].get<int64_t>() == s);
    CHECK(j["loss"].get<double>() == test::sample_step(s, s > 2 ? 0.5 : 0.0).loss);
  }
  CHECK_FALSE(fs::exists(tmp.path() / "metrics.jsonl.tmp"));
}

TEST_CASE("jsonl: a new run (start step 0) empties the file") {
  test::TempDir tmp;
  log_steps(*make("jsonl"), tmp.path(), 0, 4);
  log_steps(*make("jsonl"), tmp.path(), 0, 1);
  CHECK(lines_of(slurp(tmp.path() / "metrics.jsonl")).size() == 1);
}

TEST_CASE("jsonl: each line is on disk as soon as it is logged") {
  test::TempDir tmp;
  auto logger = make("jsonl");
  logger->open(context(tmp.path()));
  logger->log(test::sample_step(1));
  CHECK(lines_of(slurp(tmp.path() / "metrics.jsonl")).size() == 1);
  logger->close();
}

// ---- csv --------------------------------------------------------------------------------------

TEST_CASE("csv: the header is the fixed metrics then val_loss and elapsed_s, values read back exactly, empty cells when absent") {
  test::TempDir tmp;
  log_steps(*make("csv"), tmp.path(), 0, 4);
  const std::vector<std::string> lines = lines_of(slurp(tmp.path() / "metrics.csv"));
  REQUIRE(lines.size() == 5);
  std::vector<std::string> header = metric_names();
  header.push_back("val_loss");
  header.push_back("elapsed_s");
  CHECK(split(lines[0], ',') == header);
  for (int64_t s = 1; s <= 4; ++s) {
    const std::vector<std::string> cells = split(lines[std::size_t(s)], ',');
    REQUIRE(cells.size() == header.size());
    const StepMetrics m = test::sample_step(s);
    const auto want = metric_values(m);
    for (std::size_t i = 0; i < metric_names().size(); ++i) {
      INFO("step " << s << " " << header[i] << " = " << cells[i]);
      if (metric_is_count(header[i])) {
        CHECK(cells[i] == std::to_string(int64_t(want[i].second)));
      } else {
        CHECK(std::stod(cells[i]) == want[i].second);
      }
    }
    if (s % 2 == 0) CHECK(std::stod(cells[cells.size() - 2]) == m.extra.at(0).second);
    else CHECK(cells[cells.size() - 2].empty());
    CHECK(cells.back().empty());  // elapsed_s: not in the sample steps
  }
}

TEST_CASE("csv: a resumed run keeps the rows up to its start step, moved under a changed header") {
  test::TempDir tmp;
  log_steps(*make("csv"), tmp.path(), 0, 4);
  const std::vector<std::string> before = lines_of(slurp(tmp.path() / "metrics.csv"));
  log_steps(*make("csv", {{"extra_columns", std::vector<std::string>{"val_acc", "val_loss"}}}), tmp.path(), 2, 4, 0.5);
  const std::vector<std::string> lines = lines_of(slurp(tmp.path() / "metrics.csv"));
  REQUIRE(lines.size() == 5);
  const std::vector<std::string> header = split(lines[0], ',');
  REQUIRE(header.size() == metric_names().size() + 2);
  CHECK(header[header.size() - 2] == "val_acc");
  CHECK(header.back() == "val_loss");
  for (int64_t s = 1; s <= 4; ++s) {
    const std::vector<std::string> cells = split(lines[std::size_t(s)], ',');
    REQUIRE(cells.size() == header.size());
    CHECK(cells[0] == std::to_string(s));
    CHECK(std::stod(cells[1]) == test::sample_step(s, s > 2 ? 0.5 : 0.0).loss);
    CHECK(cells[cells.size() - 2].empty());  // val_acc: never logged
  }
  // The kept rows carry their old val_loss cell into the new last column.
  const std::string old_val = split(before[2], ',').at(metric_names().size());
  CHECK_FALSE(old_val.empty());
  CHECK(split(lines[2], ',').back() == old_val);
}

TEST_CASE("csv: an extra metric without a column is left out and the rows keep their width") {
  test::TempDir tmp;
  auto logger = make("csv");
  logger->open(context(tmp.path()));
  StepMetrics m = test::sample_step(1);
  m.extra.push_back({"grad_scale", 65536.0});
  logger->log(m);
  logger->log(m);
  logger->close();
  const std::vector<std::string> lines = lines_of(slurp(tmp.path() / "metrics.csv"));
  REQUIRE(lines.size() == 3);
  CHECK(split(lines[1], ',').size() == split(lines[0], ',').size());
  CHECK(lines[1].find("65536") == std::string::npos);
}

TEST_CASE("csv: bad extra_columns are input errors naming the key") {
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{"val_loss", "val_loss"}, {"loss"}, {""}, {"a,b"}}) {
    const std::string what = input_error_of([&] { make("csv", {{"extra_columns", bad}}); });
    CHECK(what.find("logging.csv.extra_columns") != std::string::npos);
  }
}

// ---- console ----------------------------------------------------------------------------------

TEST_CASE("console: off a terminal, one plain line per logged step with loss, val, lr, rates and eta") {
  test::TempDir tmp;
  std::string out;
  {
    CaptureStdout capture(tmp.path() / "stdout.txt");
    log_steps(*make("console"), tmp.path(), 0, 4);  // mode auto; stdout is a file here
    out = capture.finish();
  }
  const std::vector<std::string> lines = lines_of(out);
  REQUIRE(lines.size() == 4);
  CHECK(out.find('\r') == std::string::npos);
  CHECK(lines[0].find("step     1/4 | loss 3.6300 | lr 2.00e-04 | norm 0.333 | 124.5 ms | 2.11M tok/s (1.61M real)") !=
        std::string::npos);
  CHECK(lines[0].find("| mfu 0.1% | wait 12.5% | eta ") != std::string::npos);
  CHECK(lines[0].find("val") == std::string::npos);
  CHECK(lines[1].find("| val 3.3133 |") != std::string::npos);
  CHECK(lines[3].find("eta 0s") != std::string::npos);
}

TEST_CASE("console: `every` prints multiples of it, the last step and steps with a validation loss") {
  test::TempDir tmp;
  std::string out;
  {
    CaptureStdout capture(tmp.path() / "stdout.txt");
    auto logger = make("console", {{"mode", std::string("lines")}, {"every", int64_t(3)}});
    logger->open(context(tmp.path(), 0, 7));
    for (int64_t s = 1; s <= 7; ++s) {
      StepMetrics m = test::sample_step(s);
      if (s != 4) m.extra.clear();
      logger->log(m);
    }
    logger->close();
    out = capture.finish();
  }
  const std::vector<std::string> lines = lines_of(out);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0].find("step     3/7") != std::string::npos);
  CHECK(lines[1].find("step     4/7") != std::string::npos);
  CHECK(lines[2].find("step     6/7") != std::string::npos);
  CHECK(lines[3].find("step     7/7") != std::string::npos);
}

TEST_CASE("console: the bar is redrawn in place on one line and ended by a newline at close") {
  test::TempDir tmp;
  std::string before_close, out;
  setenv("COLUMNS", "120", 1);  // stdout is a file here: the width comes from COLUMNS
  {
    CaptureStdout capture(tmp.path() / "stdout.txt");
    auto logger = make("console", {{"mode", std::string("bar")}});
    logger->open(context(tmp.path(), 0, 4));
    for (int64_t s = 1; s <= 4; ++s) logger->log(test::sample_step(s));
    std::fflush(stdout);
    before_close = slurp(tmp.path() / "stdout.txt");
    logger->close();
    out = capture.finish();
  }
  CHECK(before_close.find('\n') == std::string::npos);
  CHECK(std::count(before_close.begin(), before_close.end(), '\r') == 4);
  CHECK(out == before_close + "\n");
  const std::string last = out.substr(out.rfind('\r') + 1);
  INFO(last);
  CHECK(last.rfind("step 4/4 [", 0) == 0);
  CHECK(last.find("100% | loss 2.5200 | val 3.2933 | 2.06M tok/s | mfu 0.1% | eta 0s") != std::string::npos);
}

TEST_CASE("console: bad mode or every are input errors naming the key") {
  CHECK(input_error_of([] { make("console", {{"every", int64_t(0)}}); }).find("logging.console.every") != std::string::npos);
  CHECK(input_error_of([] { make("console", {{"mode", std::string("fancy")}}); }).find("logging.console.mode") != std::string::npos);
}

// ---- tensorboard ------------------------------------------------------------------------------

TEST_CASE("tensorboard: records framed with both CRCs right, a version event, then one event per step") {
  test::TempDir tmp;
  log_steps(*make("tensorboard"), tmp.path(), 0, 4);
  const std::vector<fs::path> files = event_files(tmp.path());  // the run directory itself, by default
  REQUIRE(files.size() == 1);
  CHECK(files[0].filename().string().rfind("events.out.tfevents.", 0) == 0);
  const std::vector<std::string> records = read_records(files[0]);
  REQUIRE(records.size() == 5);
  const Event first = decode_event(records[0]);
  CHECK(first.file_version == "brain.Event:2");
  CHECK(first.wall_time > 1.6e9);
  for (int64_t s = 1; s <= 4; ++s) {
    const Event e = decode_event(records[std::size_t(s)]);
    CHECK(e.step == s);
    CHECK(e.wall_time >= first.wall_time);
    CHECK(e.scalars == expected_scalars(test::sample_step(s)));
  }
}

TEST_CASE("tensorboard: a resumed run writes a second file that opens with a restart at the step after the start") {
  test::TempDir tmp;
  log_steps(*make("tensorboard"), tmp.path(), 0, 4);
  log_steps(*make("tensorboard"), tmp.path(), 2, 4, 0.5);
  const std::vector<fs::path> files = event_files(tmp.path());
  REQUIRE(files.size() == 2);  // the second sorts after the first
  CHECK(read_records(files[0]).size() == 5);
  const std::vector<std::string> records = read_records(files[1]);
  REQUIRE(records.size() == 4);
  CHECK(decode_event(records[0]).file_version == "brain.Event:2");
  const Event restart = decode_event(records[1]);
  CHECK(restart.restart_status == 1);  // SessionLog.START
  CHECK(restart.step == 3);
  CHECK(decode_event(records[2]).scalars == expected_scalars(test::sample_step(3, 0.5)));
  CHECK(decode_event(records[3]).step == 4);

  // A new run starts over: the earlier event files go.
  log_steps(*make("tensorboard"), tmp.path(), 0, 1);
  CHECK(event_files(tmp.path()).size() == 1);
}

TEST_CASE("tensorboard: `dir` names the folder inside the run directory, and one outside it is an input error") {
  test::TempDir tmp;
  log_steps(*make("tensorboard", {{"dir", std::string("tb/train")}}), tmp.path(), 0, 1);
  CHECK(event_files(tmp.path() / "tb" / "train").size() == 1);
  CHECK(event_files(tmp.path()).empty());
  for (const char* bad : {"", "/tmp/tb", "../tb", "tb/../../x"}) {
    INFO(bad);
    CHECK(input_error_of([&] {
            make("tensorboard", {{"dir", std::string(bad)}});
          }).find("logging.tensorboard.dir") != std::string::npos);
  }
}

TEST_CASE("tensorboard: `hparams` entries that are not config keys are input errors naming the key") {
  const auto with = [](std::vector<std::string> keys) {
    return std::map<std::string, Value, std::less<>>{{"hparams", std::move(keys)}};
  };
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"lr"}, {"optimizer."}, {".lr"}, {"run.seed", "run.seed"}}) {
    INFO(bad.front());
    CHECK(input_error_of([&] { make("tensorboard", with(bad)); }).find("logging.tensorboard.hparams") != std::string::npos);
  }
  // A core key the resolved config lacks is refused at open, before any event file is written.
  test::TempDir tmp;
  auto logger = make("tensorboard", with({"model.d_modle"}));
  LogContext c = context(tmp.path());
  c.config_toml = "[model]\nd_model = 32\n";
  CHECK(input_error_of([&] { logger->open(c); }).find("model.d_modle") != std::string::npos);
  logger->close();
  CHECK(event_files(tmp.path()).empty());
}

// ---- every file sink -------------------------------------------------------------------------

TEST_CASE("a run directory that cannot be created is an input error naming the path") {
  test::TempDir tmp;
  const fs::path blocker = tmp.write("not_a_dir", "a file where the run directory's parent should be");
  const fs::path run_dir = blocker / "run";
  for (const char* name : {"jsonl", "csv", "tensorboard"}) {
    INFO(name);
    auto logger = make(name);
    CHECK(input_error_of([&] { logger->open(context(run_dir)); }).find(blocker.string()) != std::string::npos);
    logger->close();
  }
}

// ---- mlflow ------------------------------------------------------------------------------------

namespace {

// A local port nothing listens on: bound, then released.
int closed_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t n = sizeof a;
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace

// Each test case runs in a process of its own (ctest), so the environment variable set here for
// the case stays with it.
TEST_CASE("mlflow: without a server address, or with one that is not http://host:port, an input error names its source") {
  unsetenv("MLFLOW_TRACKING_URI");
  const auto uri = [](const char* u) { return std::map<std::string, Value, std::less<>>{{"tracking_uri", std::string(u)}}; };
  const std::string none = input_error_of([&] { make("mlflow"); });
  CHECK(none.find("logging.mlflow.tracking_uri") != std::string::npos);
  CHECK(none.find("MLFLOW_TRACKING_URI") != std::string::npos);
  CHECK(none.find("MLFLOW_ALLOW_FILE_STORE") != std::string::npos);  // why there is no local store
  CHECK(input_error_of([&] { make("mlflow", uri("https://mlflow.example.com")); }).find("https is not supported") !=
        std::string::npos);
  for (const char* bad : {"file:./mlruns", "./mlruns", "sqlite:///mlflow.db"}) {
    INFO(bad);
    const std::string e = input_error_of([&] { make("mlflow", uri(bad)); });
    CHECK(e.find("logging.mlflow.tracking_uri") != std::string::npos);
    CHECK(e.find("mlflow server --backend-store-uri") != std::string::npos);
  }
  for (const char* bad : {"http://", "http://host:0", "http://host:99999", "http://host:", "http://u@host:5000",
                          "http://host:5000/?x=1", "http://[::1"}) {
    INFO(bad);
    CHECK(input_error_of([&] { make("mlflow", uri(bad)); }).find("logging.mlflow.tracking_uri") != std::string::npos);
  }
  setenv("MLFLOW_TRACKING_URI", "file:///tmp/mlruns", 1);
  CHECK(input_error_of([&] { make("mlflow"); }).find("MLFLOW_TRACKING_URI") != std::string::npos);
  unsetenv("MLFLOW_TRACKING_URI");
  std::string long_name(501, 'x');
  CHECK(input_error_of([&] {
          make("mlflow", {{"tracking_uri", std::string("http://127.0.0.1:5000")}, {"experiment", long_name}});
        }).find("logging.mlflow.experiment") != std::string::npos);
}

TEST_CASE("mlflow: a server that cannot be reached fails the open with a runtime error naming it") {
  test::TempDir tmp;
  const std::string address = "http://127.0.0.1:" + std::to_string(closed_port());
  setenv("MLFLOW_TRACKING_URI", address.c_str(), 1);  // MLflow's own variable is honoured
  auto logger = make("mlflow");
  unsetenv("MLFLOW_TRACKING_URI");
  logger->close();  // before open: nothing to do
  LogContext c = context(tmp.path());
  c.config_toml = "[model]\nd_model = 32\n";
  try {
    logger->open(c);
    FAIL("open succeeded without a server");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::runtime);
    CHECK(std::string(e.what()).find(address) != std::string::npos);
    CHECK(std::string(e.what()).find("MLFLOW_TRACKING_URI") != std::string::npos);
  }
  logger->close();
  logger->close();
  CHECK_FALSE(fs::exists(tmp.path() / "mlflow.json"));
}

TEST_CASE("close may be called before open and twice after it") {
  test::TempDir tmp;
  for (const char* name : {"console", "jsonl", "csv", "tensorboard"}) {
    auto logger = make(name, std::string(name) == "console" ? std::map<std::string, Value, std::less<>>{{"mode", std::string("lines")}}
                                                            : std::map<std::string, Value, std::less<>>{});
    logger->close();
    logger->open(context(tmp.path() / name));
    logger->close();
    logger->close();
  }
}
