// The `console` logger: progress for a person watching. On a terminal, one line redrawn in place:
// step/total, a bar, loss, the latest validation loss, tokens/s, MFU and ETA, ended by a newline at
// close. Elsewhere (CI, a file, a pipe) one plain line per logged step through the program's log,
// with loss, val, lr, grad norm, step time, tokens/s, MFU, data wait and ETA.
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <spdlog/spdlog.h>

#include "ablate/error.hpp"
#include "ablate/metrics.hpp"
#include "loggers.hpp"
#include "sink_files.hpp"

namespace ablate::loggers {
namespace {

enum class Mode { automatic, bar, lines };

Mode mode_from(const std::string& s) { return s == "bar" ? Mode::bar : s == "lines" ? Mode::lines : Mode::automatic; }

// 812, 45.3k, 1.25M: rates with a k/M suffix.
std::string si(double x) {
  if (x >= 1e6) return fmt::format("{:.2f}M", x / 1e6);
  if (x >= 1e3) return fmt::format("{:.1f}k", x / 1e3);
  return fmt::format("{:.0f}", x);
}

// 42s, 3m05s, 2h07m.
std::string duration(double seconds) {
  const int64_t s = int64_t(std::max(0.0, seconds) + 0.5);
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

// A terminal that understands "\r" and the erase-to-end-of-line sequence.
bool stdout_is_terminal() {
  if (isatty(STDOUT_FILENO) == 0) return false;
  const char* term = std::getenv("TERM");
  return term == nullptr || std::strcmp(term, "dumb") != 0;
}

int terminal_columns() {
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  if (const char* c = std::getenv("COLUMNS")) {
    const int n = std::atoi(c);
    if (n > 0) return n;
  }
  return 100;
}

class ConsoleLogger final : public Logger {
 public:
  ConsoleLogger(Mode mode, int64_t every) : mode_(mode), every_(every) {}

  void open(const LogContext& context) override {
    context_ = context;
    start_ = std::chrono::steady_clock::now();
    bar_ = mode_ == Mode::bar || (mode_ == Mode::automatic && stdout_is_terminal());
    drawn_ = false;
    last_val_.reset();
    open_ = true;
  }

  void log(const StepMetrics& m) override {
    if (!open_) throw_runtime_error("logging.console", "log() called before open() or after close()");
    const std::optional<double> val = find_extra(m, "val_loss");
    if (val) last_val_ = val;
    if (bar_) {
      draw_bar(m);
    } else if (m.step % every_ == 0 || m.step == context_.total_steps || val) {
      spdlog::info("step {:>5}/{} | loss {:.4f}{} | lr {:.2e} | norm {:.3f} | {:.1f} ms | {} tok/s ({} real) | mfu {} | "
                   "wait {:.1f}% | eta {:.0f}s",
                   m.step, context_.total_steps, m.loss, val ? fmt::format(" | val {:.4f}", *val) : std::string(), m.lr, m.grad_norm,
                   m.step_ms, si(m.tokens_per_s), si(m.real_tokens_per_s), mfu_text(m), m.data_wait_pct, eta_seconds(m.step));
    }
  }

  void close() override {
    if (bar_ && drawn_) {
      std::fputc('\n', stdout);
      std::fflush(stdout);
    }
    drawn_ = false;
    open_ = false;
  }

 private:
  // "12.3%"; "n/a" where there is no peak to measure against (an emulated device: MFU exactly 0
  // while FLOPs were done).
  static std::string mfu_text(const StepMetrics& m) {
    return m.mfu == 0.0 && m.tflops > 0.0 ? std::string("n/a") : fmt::format("{:.1f}%", 100.0 * m.mfu);
  }

  // Wall time since open, per step done since the start step, times the steps left.
  double eta_seconds(int64_t step) const {
    const int64_t done = step - context_.start_step, left = context_.total_steps - step;
    if (done <= 0 || left <= 0) return 0;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return elapsed / double(done) * double(left);
  }

  void draw_bar(const StepMetrics& m) {
    const int64_t total = context_.total_steps;
    const double fraction = total > 0 ? std::clamp(double(m.step) / double(total), 0.0, 1.0) : 0.0;
    const std::string head = fmt::format("step {}/{}", m.step, total);
    std::string tail =
        total > 0 ? fmt::format(" {:.0f}% | loss {:.4f}", 100.0 * fraction, m.loss) : fmt::format(" | loss {:.4f}", m.loss);
    if (last_val_) tail += fmt::format(" | val {:.4f}", *last_val_);
    tail += fmt::format(" | {} tok/s | mfu {} | eta {}", si(m.tokens_per_s), mfu_text(m), duration(eta_seconds(m.step)));
    // The bar " [###---]" takes what the text leaves of the line, 10 to 30 cells; none when less is left.
    const int columns = terminal_columns() - 1;  // writing the last column wraps on some terminals
    const int room = columns - int(head.size() + tail.size()) - 3;
    std::string line = head;
    if (total > 0 && room >= 10) {
      const int width = std::min(room, 30), filled = int(fraction * width);
      line += " [" + std::string(std::size_t(filled), '#') + std::string(std::size_t(width - filled), '-') + "]";
    }
    line += tail;
    if (int(line.size()) > columns && columns > 0) line.resize(std::size_t(columns));
    // Back to the start of the line, the new text, then erase what a longer earlier line left.
    std::fputs(("\r" + line + "\x1b[K").c_str(), stdout);
    std::fflush(stdout);
    drawn_ = true;
  }

  Mode mode_;
  int64_t every_;
  LogContext context_;
  std::chrono::steady_clock::time_point start_;
  bool bar_ = false, drawn_ = false, open_ = false;
  std::optional<double> last_val_;
};

}  // namespace

void register_console(Registrar& r) {
  r.add({Kind::logger,
         "console",
         "1.0.0",
         "progress on stdout: a bar redrawn in place on a terminal, one plain line per logged step elsewhere",
         {param::string("mode", "auto", "auto: a bar when stdout is a terminal, plain lines otherwise; bar; lines")
              .one_of({"auto", "bar", "lines"}),
          param::integer("every", 1,
                         "plain lines: print steps that are a multiple of this (and the last step and steps with a "
                         "validation loss); 1 prints every logged step")
              .within(1, 1e12)},
         [](const ComponentArgs& a) {
           const std::string& mode = a.own.get_string("mode");
           if (mode != "auto" && mode != "bar" && mode != "lines") {
             throw_input_error(key_path(a.own, "mode"), "'" + mode + "' is not one of \"auto\", \"bar\", \"lines\"");
           }
           const int64_t every = a.own.get_int("every");
           if (every < 1) throw_input_error(key_path(a.own, "every"), "must be at least 1, got " + std::to_string(every));
           return std::make_unique<ConsoleLogger>(mode_from(mode), every);
         },
         "",
         {}});
}

}  // namespace ablate::loggers
