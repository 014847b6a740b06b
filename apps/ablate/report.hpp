// Results tables and reports for runs and sweeps (used by `ablate sweep` and `ablate report`).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

namespace ablate::cli {

// A sweep directory (it holds arms.json): gathers every arm's arm.json and summary.json into
// results.json and results.csv, one row per arm, in the sweep's order, with each arm group's
// statistics over its repeats (mean, standard deviation, n, 95% interval) and its comparison with
// the baseline group (arms.json's `baseline`, else the first). Every file is read typed
// (json_read.hpp) before either is written: a damaged one is an input error naming it, and so is a
// baseline that names no arm group.
void write_sweep_results(const std::filesystem::path& sweep_dir);

// How the plots are drawn. The factors are a sweep's axes ("batching.name", ...).
struct ReportOptions {
  // EMA weight of the training-loss curves, in [0, 1); 0 draws them raw; unset: kDefaultSmooth when
  // the plots hold several arm groups, else raw.
  std::optional<double> smooth;
  bool log_y = false;    // loss axes on a log scale
  std::string color_by;  // the factor that picks a curve's colour ("": the first factor)
  std::string style_by;  // the factor that picks its line style ("": the first other factor)
};

inline constexpr double kDefaultSmooth = 0.6;

// The plot options `ablate report` and `ablate sweep` take: --smooth, --log-y, --color-by, --style-by.
void add_report_options(boost::program_options::options_description& desc);
// Reads them back from parsed arguments. A smoothing weight outside [0, 1) is an input error
// naming --smooth.
ReportOptions report_options(const boost::program_options::variables_map& vm);
// The options with --color-by / --style-by resolved against `factors`: a factor's full name, or
// its section when only one factor has it ("optimizer" for "optimizer.name"). An unknown or
// ambiguous name, or both options naming one factor, is an input error naming the option and
// listing the factors; `where` says what the factors belong to.
ReportOptions resolve_report_factors(const ReportOptions& options, const std::vector<std::string>& factors, const std::string& where);

// report.md with the table, and PNG plots beside it (drawn by matplotlib through the
// ablate_plots.py script installed with the program). `dir` is a run directory or a sweep
// directory. Returns the report's path. Throws ablate::Error when the plots cannot be drawn
// (report.md is written first and says so), and an input error for options that do not fit
// the directory (a factor it does not have).
std::filesystem::path write_report(const std::filesystem::path& dir, const ReportOptions& options = {});

}  // namespace ablate::cli
