// The `jsonl` logger: <run dir>/metrics.jsonl, one JSON object per logged step with docs/architecture.md's
// metric names in their documented order (counts as integers), then the step's extras (val_loss).
// Each line is flushed as it is written. A resumed run keeps the lines up to its start step.
#include <nlohmann/json.hpp>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/metrics.hpp"
#include "loggers.hpp"
#include "sink_files.hpp"

namespace ablate::loggers {
namespace {

using ordered_json = nlohmann::ordered_json;

class JsonlLogger final : public Logger {
 public:
  void open(const LogContext& context) override {
    ensure_directory(context.run_dir);
    path_ = fs::path(context.run_dir) / "metrics.jsonl";
    if (context.start_step > 0) keep_up_to(context.start_step);
    out_ = open_for_append(path_, context.start_step == 0);
  }

  void log(const StepMetrics& metrics) override {
    if (!out_.is_open()) throw_runtime_error("logging.jsonl", "log() called before open() or after close()");
    ordered_json line = ordered_json::object();
    for (const auto& [name, value] : metric_values(metrics)) {
      if (metric_is_count(name)) line[name] = int64_t(value);
      else line[name] = value;  // NaN and infinities have no JSON spelling: written as null
    }
    out_ << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    flush_checked(out_, path_);
  }

  void close() override {
    if (out_.is_open()) out_.close();
  }

 private:
  // Keeps the complete lines whose step is at most `start_step` (a line cut short by a killed run
  // is not complete, and goes). A complete line that is not a metrics object is damage the run did
  // not write: an input error naming the line, before the file is rewritten without it.
  void keep_up_to(int64_t start_step) {
    if (!fs::exists(path_)) return;
    std::string kept;
    std::size_t n = 0;
    for (const std::string& line : read_complete_lines(path_)) {
      ++n;
      check_json_depth(line, path_.string() + ":" + std::to_string(n));
      const ordered_json j = ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) {
        throw_input_error(path_.string() + ":" + std::to_string(n),
                          "'" + echo_value(line) +
                              "' is not a metrics line (a JSON object with an integer step): the file "
                              "was changed after the run wrote it; repair or remove the line to resume");
      }
      if (j["step"].get<int64_t>() <= start_step) kept += line + '\n';
    }
    write_file_atomic(path_, kept);
  }

  fs::path path_;
  std::ofstream out_;
};

}  // namespace

void register_jsonl(Registrar& r) {
  r.add({Kind::logger,
         "jsonl",
         "1.0.0",
         "metrics.jsonl in the run directory: one JSON object per logged step, flushed line by line",
         {},
         [](const ComponentArgs&) { return std::make_unique<JsonlLogger>(); },
         "",
         {}});
}

}  // namespace ablate::loggers
