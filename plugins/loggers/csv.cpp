// The `csv` logger: <run dir>/metrics.csv with a fixed header, docs/architecture.md's metric names in their
// documented order followed by the columns of `extra_columns` (default: the trainer's extras
// val_loss and elapsed_s) and one per metric of the run's evaluations (eval/<label>/<metric>). An extra column is empty on steps without that value; an extra metric
// not listed there is left out (with one warning naming it). Counts are integers, other numbers
// the shortest text that reads back exactly. A resumed run keeps the rows up to its start step,
// rearranged under the current header.
#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include <spdlog/spdlog.h>

#include "ablate/error.hpp"
#include "ablate/metrics.hpp"
#include "loggers.hpp"
#include "sink_files.hpp"

namespace ablate::loggers {
namespace {

std::vector<std::string> split_cells(const std::string& line) {
  std::vector<std::string> cells;
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = line.find(',', begin);
    cells.push_back(line.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    if (comma == std::string::npos) return cells;
    begin = comma + 1;
  }
}

std::string join_cells(const std::vector<std::string>& cells) {
  std::string line;
  for (std::size_t i = 0; i < cells.size(); ++i) line += (i ? "," : "") + cells[i];
  return line;
}

class CsvLogger final : public Logger {
 public:
  explicit CsvLogger(std::vector<std::string> extra_columns) : configured_(std::move(extra_columns)) {}

  void open(const LogContext& context) override {
    // The configured extras, then the run's evaluation metrics (each gets its column).
    extra_columns_ = configured_;
    for (const std::string& m : context.extra_metrics) {
      if (std::find(extra_columns_.begin(), extra_columns_.end(), m) == extra_columns_.end()) extra_columns_.push_back(m);
    }
    header_ = metric_names();
    header_.insert(header_.end(), extra_columns_.begin(), extra_columns_.end());
    ensure_directory(context.run_dir);
    path_ = fs::path(context.run_dir) / "metrics.csv";
    warned_.clear();
    if (context.start_step > 0 && fs::exists(path_)) {
      write_file_atomic(path_, rows_up_to(context.start_step));
      out_ = open_for_append(path_, false);
    } else {
      out_ = open_for_append(path_, true);
      out_ << join_cells(header_) << '\n';
    }
    flush_checked(out_, path_);
  }

  void log(const StepMetrics& metrics) override {
    if (!out_.is_open()) throw_runtime_error("logging.csv", "log() called before open() or after close()");
    std::vector<std::string> cells;
    cells.reserve(header_.size());
    for (const auto& [name, value] : metric_values(metrics)) {
      if (cells.size() < metric_names().size()) {
        cells.push_back(format_number(value, metric_is_count(name)));
      } else if (std::find(extra_columns_.begin(), extra_columns_.end(), name) == extra_columns_.end() &&
                 warned_.insert(name).second) {
        spdlog::warn("logging.csv: the metric '{}' has no column and is not written to {} "
                     "(add it to logging.csv.extra_columns)",
                     name, path_.string());
      }
    }
    for (const std::string& column : extra_columns_) {
      const std::optional<double> v = find_extra(metrics, column);
      cells.push_back(v ? format_number(*v, false) : std::string());
    }
    out_ << join_cells(cells) << '\n';
    flush_checked(out_, path_);
  }

  void close() override {
    if (out_.is_open()) out_.close();
  }

 private:
  // The current header, then the existing rows whose step is at most `start_step`, each cell moved
  // to its column under the current header by name (a column the old file lacks stays empty).
  // A header without a step column, or a row with the wrong number of cells or no whole-number step,
  // is damage the run did not write: an input error naming the line, before anything is rewritten.
  std::string rows_up_to(int64_t start_step) const {
    const std::vector<std::string> lines = read_complete_lines(path_);
    std::string text = join_cells(header_) + '\n';
    if (lines.empty()) return text;
    const std::vector<std::string> old_header = split_cells(lines[0]);
    std::map<std::string, std::size_t> old_index;
    for (std::size_t i = 0; i < old_header.size(); ++i) old_index.emplace(old_header[i], i);
    const auto step_column = old_index.find("step");
    const auto refuse = [&](std::size_t l, const std::string& what) {
      throw_input_error(path_.string() + ":" + std::to_string(l + 1), "'" + echo_value(lines[l]) + "' " + what +
                                                                          ": the file was changed after the run wrote it; repair it "
                                                                          "to resume");
    };
    if (step_column == old_index.end()) refuse(0, "is not a metrics header (no step column)");
    for (std::size_t l = 1; l < lines.size(); ++l) {
      const std::vector<std::string> cells = split_cells(lines[l]);
      if (cells.size() != old_header.size()) {
        refuse(l, "has " + std::to_string(cells.size()) + " cells, the header " + std::to_string(old_header.size()));
      }
      const std::string& step_text = cells[step_column->second];
      int64_t step = 0;
      const auto r = std::from_chars(step_text.data(), step_text.data() + step_text.size(), step);
      if (r.ec != std::errc() || r.ptr != step_text.data() + step_text.size()) refuse(l, "has no whole-number step");
      if (step > start_step) continue;
      std::vector<std::string> row;
      row.reserve(header_.size());
      for (const std::string& column : header_) {
        const auto it = old_index.find(column);
        row.push_back(it == old_index.end() ? std::string() : cells[it->second]);
      }
      text += join_cells(row) + '\n';
    }
    return text;
  }

  std::vector<std::string> configured_, extra_columns_;
  std::vector<std::string> header_;
  fs::path path_;
  std::ofstream out_;
  std::set<std::string> warned_;
};

// Extra column names must be distinct, not a fixed metric's, and need no CSV quoting.
std::vector<std::string> checked_extra_columns(const Params& own) {
  const std::string where = key_path(own, "extra_columns");
  const std::vector<std::string>& columns = own.get_string_list("extra_columns");
  std::set<std::string> seen;
  for (const std::string& c : columns) {
    if (c.empty()) throw_input_error(where, "a column name is empty");
    if (c.find_first_of(",\"\r\n") != std::string::npos) {
      throw_input_error(where, "column name '" + c + "' contains a comma, quote or line break");
    }
    if (std::find(metric_names().begin(), metric_names().end(), c) != metric_names().end()) {
      throw_input_error(where, "'" + c + "' is one of the fixed metric columns already written");
    }
    if (!seen.insert(c).second) throw_input_error(where, "column '" + c + "' is listed twice");
  }
  return columns;
}

}  // namespace

void register_csv(Registrar& r) {
  r.add({Kind::logger,
         "csv",
         "1.0.0",
         "metrics.csv in the run directory: the fixed metrics plus chosen extra columns, one row per logged step",
         {param::string_list("extra_columns", {"val_loss", "elapsed_s"},
                             "extra metrics given a column after the fixed ones (empty on steps without the value); "
                             "extras not listed are not written")},
         [](const ComponentArgs& a) { return std::make_unique<CsvLogger>(checked_extra_columns(a.own)); },
         "",
         {}});
}

}  // namespace ablate::loggers
