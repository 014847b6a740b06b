// Results tables and reports for runs and sweeps (used by `ablate sweep` and `ablate report`).
#pragma once

#include <filesystem>
#include <string>

namespace ablate::cli {

// A file's bytes ("" when it cannot be read).
std::string read_text(const std::filesystem::path& path);

// A sweep directory (it holds arms.json): gathers every arm's arm.json and summary.json into
// results.json and results.csv, one row per arm, in the sweep's order.
void write_sweep_results(const std::filesystem::path& sweep_dir);

// report.md with the table, and PNG plots beside it (drawn by matplotlib through the
// ablate_plots.py script installed with the program). `dir` is a run directory or a sweep
// directory. Returns the report's path. Throws ablate::Error when the plots cannot be drawn
// (report.md is written first and says so).
std::filesystem::path write_report(const std::filesystem::path& dir);

}  // namespace ablate::cli
