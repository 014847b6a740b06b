// The local launcher: a sweep's arms trained on this machine, `parallel` at once, each a child
// `ablate train`. On a terminal the sweep shows a live block, one line per running arm (step,
// loss, ETA) and a line of totals (done / failed / stopped / running / waiting), with the arms'
// events printed above it; into a file or a pipe it writes one line per event instead.
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <iostream>
#include <thread>

#include "ablate/error.hpp"
#include "sweep.hpp"

namespace ablate::cli::sweep {

namespace {

using Clock = std::chrono::steady_clock;

std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long s = long(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
  return buf;
}

// The sweep's progress on stdout: events, and on a terminal the live block under them.
class ProgressView {
 public:
  ProgressView(std::size_t total, bool live) : total_(total), live_(live) {}

  void event(const std::string& line) {
    erase();
    std::cout << line << "\n";
    draw_pending_ = true;
  }

  // Redraws the block (a terminal only): once a second, or at once after an event.
  void draw(const std::vector<ArmRun>& running, const std::vector<ArmPlan>& plans) {
    if (!live_) return;
    const auto now = Clock::now();
    if (!draw_pending_ && now - last_draw_ < std::chrono::seconds(1)) return;
    erase();
    std::vector<std::string> lines;
    for (const ArmRun& r : running) lines.push_back(arm_line(r, plans[r.index], now));
    char totals[200];
    std::snprintf(totals, sizeof totals, "arms: %zu/%zu done, %zu failed, %zu stopped, %zu running, %zu waiting", done, total_, failed,
                  stopped, running.size(), total_ - done - failed - stopped - running.size());
    lines.push_back(totals);
    const std::size_t width = terminal_width();
    for (std::string& l : lines) std::cout << l.substr(0, width - 1) << "\n";
    drawn_ = lines.size();
    std::cout << std::flush;
    last_draw_ = now;
    draw_pending_ = false;
  }

  void finish() {
    erase();
    std::cout << std::flush;
  }

  std::size_t done = 0, failed = 0, stopped = 0;

 private:
  static std::string arm_line(const ArmRun& r, const ArmPlan& p, Clock::time_point now) {
    char buf[256];
    if (r.progress.step < 0) {
      std::snprintf(buf, sizeof buf, "  %-24s starting (%s)", p.arm.name.c_str(),
                    clock_text(std::chrono::duration<double>(now - r.start).count()).c_str());
      return buf;
    }
    double eta = NAN;
    if (r.first_step >= 0 && r.progress.step > r.first_step) {
      const double rate = double(r.progress.step - r.first_step) / std::chrono::duration<double>(now - r.first_seen).count();
      eta = double(p.steps - r.progress.step) / rate;
    }
    std::snprintf(buf, sizeof buf, "  %-24s step %lld/%lld  loss %.4f  ETA %s", p.arm.name.c_str(), (long long)r.progress.step,
                  (long long)p.steps, r.progress.loss, clock_text(eta).c_str());
    return buf;
  }

  static std::size_t terminal_width() {
    winsize w{};
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 20) return w.ws_col;
    return 80;
  }

  void erase() {
    if (!live_ || drawn_ == 0) return;
    std::cout << "\x1b[" << drawn_ << "F\x1b[J";  // to the block's first line, then clear to the end
    drawn_ = 0;
  }

  std::size_t total_;
  bool live_;
  std::size_t drawn_ = 0;
  bool draw_pending_ = true;
  Clock::time_point last_draw_{};
};

std::string counter(const ProgressView& v, std::size_t total) {
  return "[" + std::to_string(v.done + v.failed + v.stopped) + "/" + std::to_string(total) + "] ";
}

}  // namespace

std::size_t run_local(const Sweep& s, std::vector<ArmPlan>& plans, int parallel) {
  const fs::path exe = self_exe();
  const std::size_t total = plans.size();
  ProgressView view(total, isatty(STDOUT_FILENO) != 0);
  std::vector<ArmRun> running;
  std::size_t next = 0;
  while (next < total || !running.empty()) {
    while (next < total && int(running.size()) < parallel) {
      ArmPlan& p = plans[next++];
      if (p.done) {
        ++view.done;
        view.event(counter(view, total) + p.arm.name + ": already " +
                   (fs::exists(p.dir / "summary.json") ? "completed" : "stopped early") + ", skipped");
        continue;
      }
      fs::create_directories(p.dir);
      record_arm(p, "running", 0, 0, "");
      ArmRun r;
      r.index = next - 1;
      r.start = Clock::now();
      r.pid = spawn_train(exe, s.base, p);
      running.push_back(r);
      view.event("      " + p.arm.name + ": training" + (p.resume ? " (resuming)" : "") + ", log " + (p.dir / "train.log").string());
    }
    for (ArmRun& r : running) {
      for (const std::string& e : poll_arm(r, plans[r.index], plans, s.early_stop)) view.event("      " + e);
      if (r.first_step < 0 && r.progress.step >= 0) {
        r.first_step = r.progress.step;
        r.first_seen = Clock::now();
      }
    }
    // Every child that ended since the last look.
    for (;;) {
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid == 0 || (pid < 0 && errno == ECHILD)) break;
      if (pid < 0) {
        if (errno == EINTR) continue;
        throw_runtime_error("sweep", std::string("waitpid: ") + std::strerror(errno));
      }
      const auto it = std::find_if(running.begin(), running.end(), [&](const ArmRun& r) { return r.pid == pid; });
      if (it == running.end()) continue;
      ArmRun r = *it;
      running.erase(it);
      const ArmPlan& p = plans[r.index];
      poll_arm(r, p, plans, EarlyStop{});  // the last lines it wrote
      const auto [word, text] = finish_arm(r, p, status);
      if (word == "completed") ++view.done;
      else if (word == "stopped") ++view.stopped;
      else ++view.failed;
      const std::string shown = word == "completed"   ? "done, "
                                : word == "stopped"   ? "stopped, "
                                : word == "preempted" ? "preempted (run the sweep again to resume it), "
                                                      : "FAILED ";
      view.event(counter(view, total) + p.arm.name + ": " + shown + text);
    }
    view.draw(running, plans);
    if (!running.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  view.finish();
  return view.failed;
}

}  // namespace ablate::cli::sweep
