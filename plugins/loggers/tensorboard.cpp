// The `tensorboard` logger: an event file <run dir>/<dir>/events.out.tfevents.<unix time>.<host>
// holding, per logged step, one Event with every metric as a scalar. Tags: "train/<metric>" for
// docs/architecture.md's metrics (step is the event's step, not a scalar), "val/<x>" for an extra named
// "val_<x>" (val_loss -> val/loss), "train/<name>" for any other extra. A new run removes the
// event files an earlier one left in <dir>; a resumed run starts a new file that first marks a
// restart, so TensorBoard drops what the earlier files hold after the resume step.
#include <unistd.h>

#include <chrono>

#include "ablate/error.hpp"
#include "ablate/metrics.hpp"
#include "event_file.hpp"
#include "loggers.hpp"
#include "sink_files.hpp"

namespace ablate::loggers {
namespace {

constexpr std::string_view kEventFilePrefix = "events.out.tfevents.";

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

class TensorboardLogger final : public Logger {
 public:
  explicit TensorboardLogger(fs::path dir) : dir_(std::move(dir)) {}

  void open(const LogContext& context) override {
    const fs::path dir = fs::path(context.run_dir) / dir_;
    ensure_directory(dir);
    if (context.start_step == 0) remove_event_files(dir);
    const double now = unix_seconds();
    const std::string base = std::string(kEventFilePrefix) + std::to_string(int64_t(now)) + "." + host_name();
    path_ = dir / base;
    // A second file in the same second (a quick resume) gets a suffix; it sorts after the first.
    for (int n = 1; fs::exists(path_); ++n) path_ = dir / (base + "." + std::to_string(n));
    out_ = open_for_append(path_, true);
    write(tfevents::file_version_event(now));
    if (context.start_step > 0) write(tfevents::restart_event(now, context.start_step + 1));
    flush_checked(out_, path_);
  }

  void log(const StepMetrics& metrics) override {
    if (!out_.is_open()) throw_runtime_error("logging.tensorboard", "log() called before open() or after close()");
    std::vector<std::pair<std::string, float>> values;
    for (const auto& [name, value] : metric_values(metrics)) {
      if (name == "step") continue;
      values.emplace_back(tag_for(name), float(value));
    }
    write(tfevents::scalars_event(unix_seconds(), metrics.step, values));
    flush_checked(out_, path_);
  }

  void close() override {
    if (out_.is_open()) out_.close();
  }

 private:
  static std::string tag_for(const std::string& metric) {
    if (metric.rfind("val_", 0) == 0) return "val/" + metric.substr(4);
    return "train/" + metric;
  }

  static void remove_event_files(const fs::path& dir) {
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      if (e.is_regular_file() && e.path().filename().string().rfind(kEventFilePrefix, 0) == 0) {
        if (!fs::remove(e.path(), ec) || ec) throw_input_error(e.path().string(), "cannot remove the old event file");
      }
    }
  }

  void write(const std::string& event) { out_ << tfevents::frame_record(event); }

  fs::path dir_;
  fs::path path_;
  std::ofstream out_;
};

// `dir` must stay inside the run directory: a new run empties it of event files.
fs::path checked_dir(const Params& own) {
  const std::string& dir = own.get_string("dir");
  const fs::path p = fs::path(dir).lexically_normal();
  if (dir.empty() || p.is_absolute() || p.empty() || *p.begin() == ".." || p == ".") {
    throw_input_error(key_path(own, "dir"), "'" + dir + "' is not a folder inside the run directory (a relative path "
                                            "such as \"tensorboard\")");
  }
  return p;
}

}  // namespace

void register_tensorboard(Registrar& r) {
  r.add({Kind::logger, "tensorboard", "1.0.0",
         "TensorBoard event file in the run directory: every metric as a scalar per logged step",
         {param::string("dir", "tensorboard", "folder inside the run directory for the event files")},
         [](const ComponentArgs& a) { return std::make_unique<TensorboardLogger>(checked_dir(a.own)); },
         "", {}});
}

}  // namespace ablate::loggers
