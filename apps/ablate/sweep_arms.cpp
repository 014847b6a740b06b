// One arm of a sweep as a process: where it starts from, the child `ablate train`, what it has
// logged, the early-stopping rule, and its arm.json. Used by both launchers (sweep_local.cpp, and
// `ablate sweep-arm` inside a Slurm array task).
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

#include "ablate/atomic_file.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/runtime/checkpoint.hpp"
#include "ablate/runtime/trainer.hpp"
#include "json_read.hpp"
#include "sweep.hpp"

extern char** environ;

namespace ablate::cli::sweep {

fs::path self_exe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw_runtime_error("sweep", "cannot find the ablate executable (/proc/self/exe)");
  return p;
}

void write_json_file(const fs::path& p, const json& j) { write_file_atomic(p, json_text(j, 2) + "\n"); }

void record_arm(const ArmPlan& p, const std::string& status, int code, double wall, const std::string& error, const json& extra) {
  json a = {{"name", p.arm.name}, {"group", p.arm.group}, {"repeat", p.arm.repeat}, {"overrides", p.overrides},
            {"sets", p.sets},     {"status", status},     {"exit_code", code},      {"wall_s", wall}};
  if (!error.empty()) a["error"] = error;
  for (const auto& [k, v] : extra.items()) a[k] = v;
  write_json_file(p.dir / "arm.json", a);
}

// Finished arms (same overrides, summary says completed, or stopped early) are skipped; an
// interrupted arm with a checkpoint resumes from it; anything else starts afresh (its old log kept
// beside). Every file is read typed: a damaged one is an input error, before anything is written.
void decide_start(ArmPlan& p) {
  p.done = p.resume = p.restart = false;
  const auto arm = read_json_file_if_present(p.dir / "arm.json", kArmJson);
  const auto summary = read_json_file_if_present(p.dir / "summary.json", kSummaryJson);
  const bool same = arm && arm->value("sets", std::vector<std::string>()) == p.sets;
  if (same && ((summary && summary->value("status", "") == "completed") || arm->value("status", "") == "stopped")) {
    read_jsonl_file_if_present(p.dir / "metrics.jsonl", kMetricsLine);  // the report reads it
    p.done = true;
  } else if (same && has_checkpoint(p.dir)) {  // latest, or a complete checkpoint it did not name yet
    p.resume = true;
  } else if (fs::exists(p.dir)) {
    if (has_checkpoint(p.dir)) {
      throw_input_error(p.dir.string(), "holds a run with other overrides than this sweep's arm '" + p.arm.name +
                                            "'; move it away or use another --out");
    }
    p.restart = true;
  }
}

void clear_for_restart(const ArmPlan& p) {
  if (!p.restart) return;
  if (fs::exists(p.dir / "train.log")) fs::rename(p.dir / "train.log", p.dir / "train.previous.log");
  fs::remove(p.dir / "summary.json");
}

// ---- progress --------------------------------------------------------------------------------------

namespace {

// The complete lines of metrics.jsonl from `offset` on; a line that does not parse is skipped (the
// report's typed read names it later), the last one only once it is complete.
void read_new_lines(const fs::path& file, ArmProgress& p, std::uintmax_t& offset) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(file, ec);
  if (ec || !fs::is_regular_file(file, ec)) return;
  if (size < offset) {  // started afresh: read it again
    offset = 0;
    p = ArmProgress{};
  }
  std::ifstream in(file, std::ios::binary);
  in.seekg(std::streamoff(offset));
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline yet: a line still being written
    offset += line.size() + 1;
    if (json_too_deep_at(line) != std::string::npos) continue;  // not a metrics line
    const json m = json::parse(line, nullptr, false);
    if (!m.is_object() || !m.contains("step") || !m["step"].is_number_integer()) continue;
    p.step = std::max(p.step, m["step"].get<int64_t>());
    if (m.contains("loss") && m["loss"].is_number()) p.loss = m["loss"].get<double>();
    if (m.contains("elapsed_s") && m["elapsed_s"].is_number()) p.elapsed_s = m["elapsed_s"].get<double>();
    if (m.contains("val_loss") && m["val_loss"].is_number()) p.val_loss[m["step"].get<int64_t>()] = m["val_loss"].get<double>();
  }
}

}  // namespace

ArmProgress read_progress(const fs::path& dir) {
  ArmProgress p;
  std::uintmax_t offset = 0;
  read_new_lines(dir / "metrics.jsonl", p, offset);
  return p;
}

std::optional<double> rung_value(const ArmProgress& p, int64_t rung) {
  const auto it = p.val_loss.lower_bound(rung);
  if (it == p.val_loss.end()) return std::nullopt;
  return it->second;
}

bool stopped_at_rung(double value, const std::vector<double>& others, const EarlyStop& rule) {
  const std::size_t n = others.size() + 1;
  if (n < std::size_t(rule.min_arms)) return false;
  const std::size_t kept = std::max<std::size_t>(1, std::size_t(std::ceil(double(n) * (1.0 - rule.fraction) - 1e-9)));
  const std::size_t better = std::size_t(std::count_if(others.begin(), others.end(), [&](double o) { return o < value; }));
  return better >= kept;
}

std::vector<std::string> poll_arm(ArmRun& r, const ArmPlan& p, const std::vector<ArmPlan>& all, const EarlyStop& rule) {
  read_new_lines(p.dir / "metrics.jsonl", r.progress, r.metrics_offset);
  std::vector<std::string> events;
  while (!r.stopping && r.rungs_passed < rule.rungs.size()) {
    const int64_t rung = rule.rungs[r.rungs_passed];
    const std::optional<double> mine = rung_value(r.progress, rung);
    if (!mine) break;
    std::vector<double> others;
    for (const ArmPlan& o : all) {
      if (o.dir == p.dir) continue;
      if (const auto v = rung_value(read_progress(o.dir), rung)) others.push_back(*v);
    }
    r.rung_values[std::to_string(rung)] = *mine;
    ++r.rungs_passed;
    char line[256];
    if (stopped_at_rung(*mine, others, rule)) {
      std::snprintf(line, sizeof line, "early stopping at rung %lld: val_loss %.4f is in the worst %.0f%% of the %zu arm(s) there",
                    (long long)rung, *mine, rule.fraction * 100, others.size() + 1);
      r.stopping = true;
      r.stop_reason = line;
      ::kill(r.pid, SIGTERM);
      events.push_back(p.arm.name + ": " + line);
    } else {
      std::snprintf(line, sizeof line, "passed rung %lld (val_loss %.4f, %zu arm(s) there)", (long long)rung, *mine,
                    others.size() + 1);
      events.push_back(p.arm.name + ": " + line);
    }
  }
  return events;
}

namespace {

std::string last_error_line(const fs::path& log) {
  std::string text;
  std::error_code ec;
  if (!fs::exists(log, ec)) return text;
  try {
    text = read_regular_file(log, "training log", kMaxLogBytes);
  } catch (const Error& e) {  // the arm's failure is recorded all the same
    return std::string("no error line: ") + e.what();
  }
  std::istringstream in(text);
  std::string line, last, any;
  while (std::getline(in, line)) {
    if (line.rfind("error: ", 0) == 0) last = line.substr(7);
    if (!line.empty()) any = line;
  }
  return last.empty() ? any : last;
}

}  // namespace

std::pair<std::string, std::string> finish_arm(const ArmRun& r, const ArmPlan& p, int wait_status) {
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - r.start).count();
  const int code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  json extra = json::object();
  if (!r.rung_values.empty()) extra["rungs"] = r.rung_values;
  if (const char* job = std::getenv("SLURM_JOB_ID")) extra["slurm_job_id"] = job;
  if (const char* n = std::getenv("SLURM_RESTART_COUNT")) extra["requeues"] = std::strtoll(n, nullptr, 10);
  // The summary the arm's training wrote; one that does not read fails the arm, with the reason.
  std::optional<json> summary;
  std::string unreadable;
  try {
    summary = read_json_file_if_present(p.dir / "summary.json", kSummaryJson);
  } catch (const Error& e) {
    unreadable = e.what();
  }
  const bool completed = code == 0 && summary && summary->value("status", "") == "completed";
  // SIGUSR1 (a scheduler's warning) reached the training: it wrote a checkpoint and exited 75.
  if (code == 75 && summary && summary->value("status", "") == "preempted") {
    const std::string text = "preempted after step " + std::to_string(summary->value("steps", int64_t(0))) +
                             " (SIGUSR1): its checkpoint is written and the arm resumes from it";
    record_arm(p, "preempted", code, wall, text, extra);
    return {"preempted", text};
  }
  if (r.stopping && !completed) {  // (an arm that finished before the signal reached it completed)
    extra["stopped_at"] = std::max<int64_t>(0, r.progress.step);
    record_arm(p, "stopped", code, wall, r.stop_reason, extra);
    return {"stopped", r.stop_reason};
  }
  if (completed) {
    record_arm(p, "completed", 0, wall, "", extra);
    char line[256];
    std::snprintf(line, sizeof line, "loss %.4f, %.0f tok/s, %.1f s", summary->value("final_loss", std::nan("")),
                  summary->value("tokens_per_s", std::nan("")), wall);
    return {"completed", line};
  }
  std::string err = unreadable.empty() ? last_error_line(p.dir / "train.log") : unreadable;
  if (WIFSIGNALED(wait_status)) err = "killed by signal " + std::to_string(WTERMSIG(wait_status)) + (err.empty() ? "" : ": " + err);
  record_arm(p, "failed", code, wall, err, extra);
  return {"failed", "(exit " + std::to_string(code) + "): " + err};
}

pid_t spawn_train(const fs::path& exe, const fs::path& base, const ArmPlan& p, const std::vector<std::string>& prefix) {
  std::vector<std::string> argv = prefix;
  for (const std::string& x : {exe.string(), std::string("train"), base.string()}) argv.push_back(x);
  for (const std::string& x : p.sets) {
    argv.push_back("--set");
    argv.push_back(x);
  }
  argv.push_back("--run-dir");
  argv.push_back(p.dir.string());
  if (p.resume) argv.push_back("--resume");
  std::vector<char*> cargv;
  for (std::string& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  const std::string log = (p.dir / "train.log").string();
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw_runtime_error("sweep", std::string("cannot start ") + cargv[0] + ": " + std::strerror(rc));
  return pid;
}

}  // namespace ablate::cli::sweep
