// The `tensorboard` logger: an event file <run dir>/<dir>/events.out.tfevents.<unix time>.<host>
// holding, per logged step, one Event with every metric as a scalar. Tags: "train/<metric>" for
// docs/architecture.md's metrics (step is the event's step, not a scalar), "val/<x>" for an extra named
// "val_<x>" (val_loss -> val/loss), an evaluation's eval/<label>/<metric> as it is, "train/<name>"
// for any other extra. A new run removes the
// event files an earlier one left in <dir>; a resumed run starts a new file that first marks a
// restart, so TensorBoard drops what the earlier files hold after the resume step.
// For TensorBoard's HParams dashboard the file also holds, at step 0, the run's hyperparameters
// (a sweep's factors, then the config keys of `hparams`) as the plugin's experiment and
// session-start summaries, and a session end when the run completes. <dir> is the run directory
// itself by default, so that TensorBoard, which names a run by the folder of its event files,
// shows the run's (or the sweep arm's) name.
#include <unistd.h>

#include <algorithm>
#include <exception>

#include "ablate/error.hpp"
#include "ablate/metrics.hpp"
#include "event_file.hpp"
#include "hparams.hpp"
#include "loggers.hpp"
#include "run_facts.hpp"
#include "sink_files.hpp"

namespace ablate::loggers {
namespace {

constexpr std::string_view kEventFilePrefix = "events.out.tfevents.";

// The HParams dashboard's metric columns: the last value of each of these scalars.
const std::vector<hparams::Metric>& hparams_metrics() {
  static const std::vector<hparams::Metric> metrics = {{"train/loss", false},
                                                       {"val/loss", true},
                                                       {"train/tokens_per_s", false},
                                                       {"train/real_tokens_per_s", false},
                                                       {"train/mfu", false},
                                                       {"train/effective_mfu", false},
                                                       {"train/padding_fraction", false}};
  return metrics;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

class TensorboardLogger final : public Logger {
 public:
  TensorboardLogger(fs::path dir, std::vector<std::string> hparam_keys, std::string hparams_where)
      : dir_(std::move(dir)), hparam_keys_(std::move(hparam_keys)), hparams_where_(std::move(hparams_where)) {}

  void open(const LogContext& context) override {
    const std::optional<SweepArm> arm = read_sweep_arm(context.run_dir, context.run_name);
    const std::vector<hparams::HParam> hp = session_hparams(context, arm);
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
    // A resumed run writes the hparams summaries again: TensorBoard keeps the first of each.
    if (!hp.empty()) {
      write(tfevents::plugin_summary_event(now, 0, hparams::kExperimentTag, hparams::kPluginName,
                                           hparams::experiment(hp, hparams_metrics(), now)));
      write(tfevents::plugin_summary_event(now, 0, hparams::kSessionStartTag, hparams::kPluginName,
                                           hparams::session_start(hp, arm ? arm->group : context.run_name, now)));
    }
    session_ = !hp.empty();
    total_steps_ = context.total_steps;
    last_step_ = context.start_step;
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
    last_step_ = metrics.step;
  }

  // A completed run ends its HParams session with STATUS_SUCCESS. A run that fails or stops early
  // writes no end: TensorBoard keeps the first status a run's files hold, and such a run may be
  // resumed to completion.
  void close() override {
    if (!out_.is_open()) return;
    if (session_ && std::uncaught_exceptions() == 0 && last_step_ >= total_steps_) {
      write(tfevents::plugin_summary_event(unix_seconds(), 0, hparams::kSessionEndTag, hparams::kPluginName,
                                           hparams::session_success(unix_seconds())));
      out_.flush();
    }
    out_.close();
  }

 private:
  static std::string tag_for(const std::string& metric) {
    if (metric.rfind("val_", 0) == 0) return "val/" + metric.substr(4);
    if (metric.rfind("eval/", 0) == 0) return metric;  // an evaluation's: eval/<label>/<metric>
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

  // The session's hyperparameters: for a sweep's arm its factors (which differ between arms), then
  // the config values of `hparams`. A key of an implementation's sub-table the run did not select
  // ("optimizer.adamw8bit.min_8bit_size" with adamw) is left out; any other key the config lacks is
  // an input error naming `hparams`. A context without a config (a sink driven by hand) has none.
  std::vector<hparams::HParam> session_hparams(const LogContext& context, const std::optional<SweepArm>& arm) const {
    std::vector<hparams::HParam> out;
    if (context.config_toml.empty()) return out;
    const std::vector<ConfigEntry> entries = flatten_config(context.config_toml);
    auto add = [&](const std::string& key, bool differs) {
      for (const hparams::HParam& h : out) {
        if (h.value.key == key) return;
      }
      if (const ConfigEntry* e = find_entry(entries, key)) out.push_back({*e, differs});
      else if (std::count(key.begin(), key.end(), '.') < 2 && !differs) {
        throw_input_error(hparams_where_, "'" + echo_value(key) +
                                              "' is not a key of the run's config (a \"section.key\" "
                                              "such as \"optimizer.lr\")");
      }
    };
    if (arm) {
      for (const std::string& factor : arm->factors) add(factor, true);
    }
    for (const std::string& key : hparam_keys_) add(key, false);
    return out;
  }

  void write(const std::string& event) { out_ << tfevents::frame_record(event); }

  fs::path dir_;
  std::vector<std::string> hparam_keys_;
  std::string hparams_where_;
  fs::path path_;
  std::ofstream out_;
  bool session_ = false;
  int64_t total_steps_ = 0;
  int64_t last_step_ = 0;
};

// `dir` must stay inside the run directory (or be it): a new run empties it of event files.
fs::path checked_dir(const Params& own) {
  const std::string& dir = own.get_string("dir");
  const fs::path p = fs::path(dir).lexically_normal();
  if (dir.empty() || p.is_absolute() || p.empty() || *p.begin() == "..") {
    throw_input_error(key_path(own, "dir"), "'" + dir +
                                                "' is not the run directory or a folder inside it (\".\", or a "
                                                "relative path such as \"tensorboard\")");
  }
  return p;
}

// Each `hparams` entry is a dotted config key, named once.
std::vector<std::string> checked_hparam_keys(const Params& own) {
  const std::vector<std::string>& keys = own.get_string_list("hparams");
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const std::string& k = keys[i];
    if (k.find('.') == std::string::npos || k.front() == '.' || k.back() == '.') {
      throw_input_error(key_path(own, "hparams"), "'" + echo_value(k) + "' is not a \"section.key\" config key");
    }
    if (std::find(keys.begin(), keys.begin() + std::ptrdiff_t(i), k) != keys.begin() + std::ptrdiff_t(i)) {
      throw_input_error(key_path(own, "hparams"), "'" + echo_value(k) + "' is listed twice");
    }
  }
  return keys;
}

}  // namespace

void register_tensorboard(Registrar& r) {
  r.add({Kind::logger,
         "tensorboard",
         "1.0.0",
         "TensorBoard event file in the run directory: every metric as a scalar per logged step, and the run's "
         "hyperparameters for the HParams dashboard",
         {param::string("dir", ".",
                        "the run directory (\".\") or a folder inside it for the event files; TensorBoard names "
                        "a run by this folder"),
          param::string_list("hparams",
                             {"model.d_model", "model.n_layers", "model.n_heads", "batching.name", "batching.batch_size",
                              "batching.seq_len", "optimizer.name", "optimizer.lr", "schedule.name", "run.steps", "run.seed"},
                             "config keys recorded as the run's hyperparameters, after a sweep's factors")},
         [](const ComponentArgs& a) {
           return std::make_unique<TensorboardLogger>(checked_dir(a.own), checked_hparam_keys(a.own), key_path(a.own, "hparams"));
         },
         "",
         {}});
}

}  // namespace ablate::loggers
