// The `mlflow` logger: the run as an MLflow run on a tracking server, through MLflow's REST API
// (docs/logging.md, "mlflow"). At open: the experiment (found or created), the run (its name the
// run directory's), the resolved config as params ("section.key"), tags naming the sweep, the arm
// and each factor for a sweep's arm; <run dir>/mlflow.json records the run's id. Each logged step:
// the jsonl logger's metrics at that step. At close: the run's status, and config.toml, run.json
// and any plots of the run directory as artifacts; summary.json, which the trainer writes after the
// sinks close, is sent when the program exits. The server is checked at open (an unreachable one
// fails the run before training); later failures are warnings, and unsent values are kept and
// sent again.
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <map>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/atomic_file.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/metrics.hpp"
#include "http_client.hpp"
#include "loggers.hpp"
#include "run_facts.hpp"
#include "sink_files.hpp"

namespace ablate::loggers {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// MLflow's limits (mlflow/utils/validation.py): longer values are cut by the server, larger
// batches refused.
constexpr std::size_t kMaxParamValue = 6000;
constexpr std::size_t kMaxTagValue = 8000;
constexpr std::size_t kMaxKey = 250;
constexpr std::size_t kMaxExperimentName = 500;
constexpr std::size_t kMaxParamsOrTagsPerBatch = 100;
constexpr std::size_t kMaxMetricsPerBatch = 1000;
// Values kept for a server that stopped answering; beyond this the oldest go (with a warning).
constexpr std::size_t kMaxPendingMetrics = 1'000'000;
constexpr std::uintmax_t kMaxArtifactBytes = std::uintmax_t(64) << 20;
constexpr auto kRetryAfter = std::chrono::seconds(30);

constexpr const char* kRunRecord = "mlflow.json";

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// At most `max_bytes` of `text`, cut before a UTF-8 continuation byte.
std::string cut_utf8(const std::string& text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  std::size_t n = max_bytes;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return text.substr(0, n);
}

// MLflow's rule for metric, param and tag names (validate_param_and_metric_name, path_not_unique):
// letters, digits, '_', '-', '.', ' ', ':', '/', as a relative path without "." or ".." parts.
bool valid_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxKey || name.front() == '/') return false;
  for (const char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && std::string_view("_-. :/").find(c) == std::string_view::npos) return false;
  }
  std::size_t begin = 0;
  while (begin <= name.size()) {
    const std::size_t end = std::min(name.find('/', begin), name.size());
    const std::string_view part(name.data() + begin, end - begin);
    if (part.empty() || part == "." || part == "..") return false;
    begin = end + 1;
  }
  return true;
}

// A metric value as MLflow's JSON takes it: NaN and infinities spelled as protobuf's JSON spells them.
json metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

std::string user_name() {
  for (const char* var : {"USER", "LOGNAME"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') return v;
  }
  if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_name != nullptr) return pw->pw_name;
  return "";
}

// The server answered with an error status; `code` is MLflow's error_code when it sent one.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string code, const std::string& what) : std::runtime_error(what), status(status), code(std::move(code)) {}
  int status;
  std::string code;
};

// MLflow's REST API on one server: /api/2.0/mlflow/<endpoint> and the artifact proxy.
class MlflowServer {
 public:
  MlflowServer(HttpUrl url, double timeout_s) : http_(std::move(url), timeout_s) {}

  const std::string& address() const noexcept { return http_.url().text; }

  // GET with `args` as the query, or POST with them as the JSON body. The answer's JSON for a 2xx
  // status; ApiError for another; HttpTransportError when there is no answer.
  json call(std::string_view method, const std::string& endpoint, const json& args) {
    std::string target = "/api/2.0/mlflow/" + endpoint;
    std::string body;
    if (method == "GET") {
      char sep = '?';
      for (const auto& [k, v] : args.items()) {
        target += sep + url_encode(k, false) + "=" + url_encode(v.is_string() ? v.get<std::string>() : dump(v), false);
        sep = '&';
      }
    } else {
      body = dump(args);
    }
    return answer(http_.request(method, target, body), endpoint);
  }

  // PUT through the server's artifact proxy: `path` is relative to the artifact root it serves.
  void put_artifact(const std::string& path, const std::string& bytes) {
    answer(http_.request("PUT", "/api/2.0/mlflow-artifacts/artifacts/" + url_encode(path, true), bytes, "application/octet-stream"),
           "mlflow-artifacts/artifacts");
  }

 private:
  static json answer(const HttpResponse& r, const std::string& endpoint) {
    const json j = json_too_deep_at(r.body) == std::string::npos ? json::parse(r.body, nullptr, /*allow_exceptions=*/false)
                                                                 : json(json::value_t::discarded);
    if (r.status >= 200 && r.status < 300) {
      if (!j.is_object()) {
        throw ApiError(r.status, "", endpoint + ": the answer is not a JSON object: '" + echo_value(r.body, 200) + "'");
      }
      return j;
    }
    std::string code, message;
    if (j.is_object()) {
      code = j.value("error_code", "");
      message = j.value("message", "");
    }
    if (message.empty()) message = echo_value(r.body, 200);
    throw ApiError(r.status, code,
                   endpoint + ": HTTP " + std::to_string(r.status) + (code.empty() ? "" : " " + code) + ": " +
                       echo_value(message, 600));
  }

  HttpClient http_;
};

// A transient failure (no answer, the server overloaded or failing) is worth trying again; a
// refusal of the request itself (4xx) is not.
bool transient(const std::exception& e) {
  if (dynamic_cast<const HttpTransportError*>(&e) != nullptr) return true;
  if (const auto* a = dynamic_cast<const ApiError*>(&e)) return a->status >= 500 || a->status == 429 || a->status == 408;
  return false;
}

// summary.json, which the trainer writes after its sinks close, sent when the program exits. The
// one instance is made at the first close, so at exit it is destroyed before everything made
// earlier, the program's log among them.
struct PendingSummary {
  HttpUrl url;
  double timeout_s = 10;
  std::string artifact_dir;  // relative to the server's artifact root: "<experiment>/<run>/artifacts"
  fs::path file;
  fs::file_time_type not_before;  // a summary.json older than the run's open is an earlier run's
};

class SummaryUploads {
 public:
  static SummaryUploads& instance() {
    static SummaryUploads uploads;
    return uploads;
  }
  void add(PendingSummary p) { pending_.push_back(std::move(p)); }

  ~SummaryUploads() {
    for (const PendingSummary& p : pending_) {
      try {
        std::error_code ec;
        if (!fs::exists(p.file, ec) || fs::last_write_time(p.file, ec) < p.not_before || ec) continue;
        MlflowServer server(p.url, p.timeout_s);
        server.put_artifact(p.artifact_dir + "/summary.json", read_regular_file(p.file, "run summary", kMaxArtifactBytes));
      } catch (const std::exception& e) {
        spdlog::warn("logging.mlflow: summary.json was not sent to {}: {}", p.url.text, e.what());
      }
    }
  }

 private:
  SummaryUploads() = default;
  std::vector<PendingSummary> pending_;
};

struct Metric {
  std::string key;
  double value;
  int64_t timestamp;
  int64_t step;
};

class MlflowLogger final : public Logger {
 public:
  MlflowLogger(HttpUrl url, std::string url_source, std::string experiment, double timeout_s, bool artifacts)
      : url_(std::move(url)),
        url_source_(std::move(url_source)),
        experiment_key_(std::move(experiment)),
        timeout_s_(timeout_s),
        artifacts_(artifacts) {}

  void open(const LogContext& context) override {
    context_ = context;
    last_step_ = context.start_step;
    opened_at_ = fs::file_time_type::clock::now() - std::chrono::seconds(1);
    server_ = std::make_unique<MlflowServer>(url_, timeout_s_);
    entries_ = flatten_config(context.config_toml);
    arm_ = read_sweep_arm(context.run_dir, context.run_name);
    std::string experiment = experiment_key_;
    std::string experiment_where = "logging.mlflow.experiment";
    if (experiment.empty() && arm_) {
      experiment = arm_->sweep;
      experiment_where = "the sweep name";
    }
    if (experiment.empty()) experiment = experiment_file_name(context.config_toml);
    if (experiment.empty()) experiment = context.run_name;
    if (experiment.size() > kMaxExperimentName) {
      throw_input_error(experiment_where, "'" + echo_value(experiment) + "' is longer than MLflow's " +
                                              std::to_string(kMaxExperimentName) + " bytes for an experiment name");
    }
    ensure_directory(context.run_dir);
    check_output_file(fs::path(context.run_dir) / kRunRecord, "MLflow run record");

    try {
      experiment_id_ = experiment_id(experiment);
      json existing_params = json::array();
      if (context.start_step > 0) existing_params = continue_recorded_run(experiment);
      if (run_id_.empty()) create_run();
      write_file_atomic(fs::path(context.run_dir) / kRunRecord, dump(json{{"tracking_uri", url_.text},
                                                                          {"experiment", experiment},
                                                                          {"experiment_id", experiment_id_},
                                                                          {"run_id", run_id_},
                                                                          {"run_url", run_url()}}) +
                                                                    "\n");
      log_params(existing_params);
      std::vector<std::pair<std::string, std::string>> tags = {
          {"ablate.run_dir", fs::absolute(context.run_dir).lexically_normal().string()}, {"ablate.status", "running"}};
      if (arm_) {
        tags.insert(tags.end(), {{"ablate.sweep", arm_->sweep},
                                 {"ablate.arm", arm_->arm},
                                 {"ablate.group", arm_->group},
                                 {"ablate.repeat", std::to_string(arm_->repeat)}});
        for (const std::string& factor : arm_->factors) {
          const ConfigEntry* e = find_entry(entries_, factor);
          tags.emplace_back("factor." + factor, e ? e->text : "");
        }
      }
      set_tags(tags);
    } catch (const HttpTransportError& e) {
      throw_runtime_error(server_->address(), std::string("cannot reach the MLflow tracking server (from ") + url_source_ +
                                                  "): " + e.what() +
                                                  "; start it (`mlflow server --host 127.0.0.1 --port 5000 "
                                                  "--backend-store-uri sqlite:///mlflow.db`) or give another address");
    } catch (const ApiError& e) {
      throw_runtime_error(server_->address(), std::string("the MLflow tracking server (from ") + url_source_ + ") answered " +
                                                  e.what() + (e.code.empty() ? " (is this an MLflow tracking server?)" : ""));
    } catch (const json::exception& e) {
      throw_runtime_error(server_->address(), std::string("the answer of the MLflow tracking server (from ") + url_source_ +
                                                  ") lacks a field: " + e.what() + " (is this an MLflow tracking server?)");
    }
    spdlog::info("mlflow: run '{}' in experiment '{}': {}", context.run_name, experiment, run_url());
  }

  void log(const StepMetrics& metrics) override {
    if (!server_ || run_id_.empty()) throw_runtime_error("logging.mlflow", "log() called before open() or after close()");
    const int64_t ts = now_ms();
    for (const auto& [name, value] : metric_values(metrics)) {
      if (name == "step") continue;  // every value's step
      if (!valid_name(name)) {
        if (warned_names_.insert(name).second) {
          spdlog::warn("logging.mlflow: the metric '{}' is not sent: MLflow names hold letters, digits and _-. :/ only", name);
        }
        continue;
      }
      pending_.push_back({name, value, ts, metrics.step});
    }
    last_step_ = metrics.step;
    if (pending_.size() > kMaxPendingMetrics) {
      const std::size_t drop = pending_.size() - kMaxPendingMetrics;
      pending_.erase(pending_.begin(), pending_.begin() + std::ptrdiff_t(drop));
      if (!warned_overflow_) {
        spdlog::warn("logging.mlflow: more than {} metric values wait for {}; the oldest are dropped", kMaxPendingMetrics,
                     server_->address());
      }
      warned_overflow_ = true;
      dropped_ += drop;
    }
    send_pending(false);
  }

  void close() override {
    if (!server_ || run_id_.empty()) return;
    const bool failed = std::uncaught_exceptions() > 0;  // closed while an error leaves the trainer
    const bool completed = !failed && last_step_ >= context_.total_steps;
    send_pending(true);
    const std::size_t unsent = pending_.size() + dropped_;
    if (failing_) {
      spdlog::warn("logging.mlflow: {} does not answer: {} metric value(s), the run's status and its artifacts were not sent "
                   "(metrics.jsonl in the run directory has every logged step)",
                   server_->address(), unsent);
    } else {
      if (unsent > 0) {
        spdlog::warn("logging.mlflow: {} metric value(s) were not sent to {} or refused by it (metrics.jsonl in the run "
                     "directory has every logged step)",
                     unsent, server_->address());
      }
      try {
        set_tags({{"ablate.status", failed ? "failed" : completed ? "completed" : "stopped"}});
        if (artifacts_) send_artifacts(failed);
        server_->call("POST", "runs/update",
                      {{"run_id", run_id_},
                       {"status", failed      ? "FAILED"
                                  : completed ? "FINISHED"
                                              : "KILLED"},
                       {"end_time", now_ms()}});
      } catch (const std::exception& e) {
        spdlog::warn("logging.mlflow: closing the run on {} failed: {}", server_->address(), e.what());
      }
    }
    server_.reset();
    run_id_.clear();
  }

 private:
  std::string run_url() const {
    return url_.text + "/#/experiments/" + url_encode(experiment_id_, false) + "/runs/" + url_encode(run_id_, false);
  }

  // The id of the experiment named `name`, created when the server has none. Two arms of a sweep
  // may create it at once: the one that loses reads the other's.
  std::string experiment_id(const std::string& name) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      try {
        const json r = server_->call("GET", "experiments/get-by-name", {{"experiment_name", name}});
        const json& e = r.at("experiment");
        if (e.value("lifecycle_stage", "") == "deleted") {
          throw_runtime_error(server_->address(), "the MLflow experiment '" + echo_value(name) +
                                                      "' is deleted (in the server's trash): "
                                                      "restore it (`mlflow experiments restore --experiment-id " +
                                                      e.value("experiment_id", "") +
                                                      "`) or name another with logging.mlflow.experiment");
        }
        return e.at("experiment_id").get<std::string>();
      } catch (const ApiError& e) {
        if (e.code != "RESOURCE_DOES_NOT_EXIST") throw;
      }
      try {
        return server_->call("POST", "experiments/create", {{"name", name}}).at("experiment_id").get<std::string>();
      } catch (const ApiError& e) {
        if (e.code != "RESOURCE_ALREADY_EXISTS") throw;
      }
    }
    throw_runtime_error(server_->address(), "the MLflow experiment '" + echo_value(name) + "' can be neither found nor created");
  }

  void create_run() {
    json tags = json::array();
    if (const std::string user = user_name(); !user.empty()) tags.push_back({{"key", "mlflow.user"}, {"value", user}});
    const json r =
        server_->call("POST", "runs/create",
                      {{"experiment_id", experiment_id_}, {"run_name", context_.run_name}, {"start_time", now_ms()}, {"tags", tags}});
    run_id_ = r.at("run").at("info").at("run_id").get<std::string>();
    note_artifact_root(r.at("run").at("info").value("artifact_uri", ""));
  }

  // A resumed run continues the MLflow run its mlflow.json names, when that run is on this server
  // and not deleted; it returns the run's params. Otherwise a new run is made (run_id_ stays empty).
  json continue_recorded_run(const std::string& experiment) {
    const fs::path record = fs::path(context_.run_dir) / kRunRecord;
    std::error_code ec;
    if (!fs::exists(record, ec)) return json::array();
    const std::string text = read_json_text(record, "MLflow run record", kMaxJsonBytes);
    const json j = json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("run_id") || !j["run_id"].is_string() || !j.contains("tracking_uri") ||
        !j["tracking_uri"].is_string()) {
      throw_input_error(record.string(), "is not the MLflow run record this logger writes (an object with run_id and "
                                         "tracking_uri); repair or remove it to resume");
    }
    if (j["tracking_uri"].get<std::string>() != url_.text) {
      spdlog::info("mlflow: the run was recorded on {}; a new MLflow run is started on {}", j["tracking_uri"].get<std::string>(),
                   url_.text);
      return json::array();
    }
    json run;
    try {
      run = server_->call("GET", "runs/get", {{"run_id", j["run_id"].get<std::string>()}}).at("run");
    } catch (const ApiError& e) {
      if (e.code != "RESOURCE_DOES_NOT_EXIST") throw;
      spdlog::warn("logging.mlflow: the run {} that {} names is not on {}; a new MLflow run is started",
                   j["run_id"].get<std::string>(), record.string(), url_.text);
      return json::array();
    }
    const json& info = run.at("info");
    if (info.value("lifecycle_stage", "") == "deleted") {
      spdlog::warn("logging.mlflow: the run {} that {} names is deleted on {}; a new MLflow run is started",
                   j["run_id"].get<std::string>(), record.string(), url_.text);
      return json::array();
    }
    run_id_ = info.at("run_id").get<std::string>();
    experiment_id_ = info.at("experiment_id").get<std::string>();
    note_artifact_root(info.value("artifact_uri", ""));
    server_->call("POST", "runs/update", {{"run_id", run_id_}, {"status", "RUNNING"}});
    const json data = run.value("data", json::object());
    // MLflow keeps every value it was sent: steps the interrupted run logged after its checkpoint
    // stay beside the resumed run's.
    for (const json& m : data.value("metrics", json::array())) {
      if (m.value("key", "") == "loss" && m.value("step", int64_t(0)) > context_.start_step) {
        spdlog::warn("logging.mlflow: the MLflow run holds steps up to {} from before the resume at step {}; MLflow cannot "
                     "delete logged values, so steps {}..{} show both (the later value is the resumed run's)",
                     m.value("step", int64_t(0)), context_.start_step, context_.start_step + 1, m.value("step", int64_t(0)));
      }
    }
    spdlog::info("mlflow: continuing run {} in experiment '{}'", run_id_, experiment);
    return data.value("params", json::array());
  }

  // Where this run's artifacts go through the server's proxy: "mlflow-artifacts:/1/<run>/artifacts"
  // (or with a "//host:port" part) is "1/<run>/artifacts". Another root (s3://, a local path) is
  // one the server does not serve.
  void note_artifact_root(const std::string& uri) {
    artifact_dir_.clear();
    const std::string scheme = "mlflow-artifacts:";
    if (uri.rfind(scheme, 0) == 0) {
      std::string rest = uri.substr(scheme.size());
      if (rest.rfind("//", 0) == 0) rest = rest.substr(std::min(rest.size(), rest.find('/', 2)));
      while (!rest.empty() && rest.front() == '/') rest.erase(0, 1);
      artifact_dir_ = rest;
    }
    if (artifacts_ && artifact_dir_.empty()) {
      spdlog::warn("logging.mlflow: the server keeps this run's artifacts at '{}', which it does not serve through its artifact "
                   "proxy: config.toml, summary.json and plots are not sent (start `mlflow server` with artifact serving, its "
                   "default, or set logging.mlflow.artifacts = false)",
                   echo_value(uri));
    }
  }

  // The resolved config as params, at most MLflow's length each (a longer value is cut, with a
  // warning). A param the continued run already holds is not sent again; one whose value changed
  // keeps its first value (MLflow's params do not change), with a warning.
  void log_params(const json& existing) {
    std::map<std::string, std::string> had;
    for (const json& p : existing) had[p.value("key", "")] = p.value("value", "");
    json batch = json::array();
    std::vector<std::string> cut, changed;
    for (const ConfigEntry& e : entries_) {
      if (!valid_name(e.key)) continue;
      std::string value = cut_utf8(e.text, kMaxParamValue);
      if (value.size() < e.text.size()) cut.push_back(e.key);
      if (const auto it = had.find(e.key); it != had.end()) {
        if (it->second != value) changed.push_back(e.key);
        continue;
      }
      batch.push_back({{"key", e.key}, {"value", value}});
      if (batch.size() == kMaxParamsOrTagsPerBatch) send_batch("params", batch);
    }
    send_batch("params", batch);
    if (!cut.empty()) {
      spdlog::warn(
          "logging.mlflow: the value of {} is longer than MLflow's {} bytes for a param and was cut (config.toml has it whole)",
          join(cut), kMaxParamValue);
    }
    if (!changed.empty()) {
      spdlog::warn(
          "logging.mlflow: {} changed since the run started; MLflow keeps a param's first value (config.toml has the current one)",
          join(changed));
    }
  }

  void set_tags(const std::vector<std::pair<std::string, std::string>>& tags) {
    json batch = json::array();
    for (const auto& [k, v] : tags) {
      if (!valid_name(k)) continue;
      batch.push_back({{"key", k}, {"value", cut_utf8(v, kMaxTagValue)}});
      if (batch.size() == kMaxParamsOrTagsPerBatch) send_batch("tags", batch);
    }
    send_batch("tags", batch);
  }

  void send_batch(const char* field, json& batch) {
    if (batch.empty()) return;
    server_->call("POST", "runs/log-batch", {{"run_id", run_id_}, {field, batch}});
    batch = json::array();
  }

  // Sends what is pending, 1000 values a request. A transient failure keeps the values for the
  // next attempt, made at a log() call 30 s later at the earliest or at close (`final`); a
  // refused request's values are dropped (and counted). Each change between sending and failing,
  // and the first refusal, is said once.
  void send_pending(bool final) {
    if (pending_.empty() || (!final && Clock::now() < retry_at_)) return;
    while (!pending_.empty()) {
      const std::size_t n = std::min(pending_.size(), kMaxMetricsPerBatch);
      json metrics = json::array();
      for (std::size_t i = 0; i < n; ++i) {
        const Metric& m = pending_[i];
        metrics.push_back({{"key", m.key}, {"value", metric_value(m.value)}, {"timestamp", m.timestamp}, {"step", m.step}});
      }
      try {
        server_->call("POST", "runs/log-batch", {{"run_id", run_id_}, {"metrics", metrics}});
        if (failing_) spdlog::info("mlflow: sending metrics to {} again", server_->address());
        failing_ = false;
      } catch (const std::exception& e) {
        if (transient(e)) {
          if (!failing_) {
            spdlog::warn("logging.mlflow: metrics not sent to {}: {}; kept, and sent again later", server_->address(), e.what());
          }
          failing_ = true;
          retry_at_ = Clock::now() + kRetryAfter;
          return;
        }
        if (!warned_refusal_) {
          spdlog::warn("logging.mlflow: {} refused {} metric value(s) of steps {}..{}: {}", server_->address(), n,
                       pending_.front().step, pending_[n - 1].step, e.what());
        }
        warned_refusal_ = true;
        dropped_ += n;
      }
      pending_.erase(pending_.begin(), pending_.begin() + std::ptrdiff_t(n));
    }
  }

  // config.toml, run.json and the plots of the run directory; summary.json at exit (a failed run
  // writes none).
  void send_artifacts(bool failed) {
    if (artifact_dir_.empty()) return;
    const fs::path dir = context_.run_dir;
    std::vector<std::string> names = {"config.toml", "run.json"};
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      if (e.is_regular_file(ec) && e.path().extension() == ".png") names.push_back(e.path().filename().string());
    }
    for (const std::string& name : names) {
      if (!fs::is_regular_file(dir / name, ec)) continue;
      try {
        server_->put_artifact(artifact_dir_ + "/" + name, read_regular_file(dir / name, "artifact", kMaxArtifactBytes));
      } catch (const std::exception& e) {
        spdlog::warn("logging.mlflow: {} was not sent to {}: {}", name, server_->address(), e.what());
      }
    }
    if (!failed) SummaryUploads::instance().add({url_, timeout_s_, artifact_dir_, dir / "summary.json", opened_at_});
  }

  HttpUrl url_;
  std::string url_source_;
  std::string experiment_key_;
  double timeout_s_;
  bool artifacts_;

  LogContext context_;
  fs::file_time_type opened_at_;
  std::unique_ptr<MlflowServer> server_;
  std::vector<ConfigEntry> entries_;
  std::optional<SweepArm> arm_;
  std::string experiment_id_;
  std::string run_id_;
  std::string artifact_dir_;
  std::vector<Metric> pending_;
  std::size_t dropped_ = 0;
  bool failing_ = false;
  bool warned_refusal_ = false;
  bool warned_overflow_ = false;
  Clock::time_point retry_at_{};
  int64_t last_step_ = 0;
  std::set<std::string> warned_names_;
};

// The server: the `tracking_uri` key, else MLflow's own MLFLOW_TRACKING_URI. Only a tracking
// server's http:// address will do.
std::unique_ptr<Logger> make_mlflow(const ComponentArgs& a) {
  const std::string key = key_path(a.own, "tracking_uri");
  std::string uri = a.own.get_string("tracking_uri"), source = key;
  if (uri.empty()) {
    if (const char* env = std::getenv("MLFLOW_TRACKING_URI"); env != nullptr && *env != '\0') {
      uri = env;
      source = "MLFLOW_TRACKING_URI";
    }
  }
  if (uri.empty()) {
    throw_input_error(key, "no MLflow tracking server given: set this key (\"http://127.0.0.1:5000\") or the MLFLOW_TRACKING_URI "
                           "environment variable. There is no local store: MLflow 3 refuses its ./mlruns file store unless "
                           "MLFLOW_ALLOW_FILE_STORE=true, so runs go to a tracking server; start one with `mlflow server --host "
                           "127.0.0.1 --port 5000 --backend-store-uri sqlite:///mlflow.db`");
  }
  std::string why;
  std::optional<HttpUrl> url = parse_http_url(uri, why);
  if (!url) {
    const bool store = uri.find("://") == std::string::npos || uri.rfind("file:", 0) == 0 || uri.rfind("sqlite:", 0) == 0;
    throw_input_error(source, "'" + echo_value(uri) + "' " + why +
                                  (store && why.rfind("is not", 0) == 0
                                       ? ": this logger sends runs to an MLflow tracking server; a store (file:, sqlite:, a path) "
                                         "is what `mlflow server --backend-store-uri ...` serves, at an http:// address"
                                       : std::string()));
  }
  const std::string& experiment = a.own.get_string("experiment");
  if (experiment.size() > kMaxExperimentName) {
    throw_input_error(key_path(a.own, "experiment"), "'" + echo_value(experiment) + "' is longer than MLflow's " +
                                                         std::to_string(kMaxExperimentName) + " bytes for an experiment name");
  }
  return std::make_unique<MlflowLogger>(*url, source, experiment, a.own.get_float("timeout_s"), a.own.get_bool("artifacts"));
}

}  // namespace

void register_mlflow(Registrar& r) {
  r.add({Kind::logger,
         "mlflow",
         "1.0.0",
         "an MLflow tracking server (REST over http): params, per-step metrics, tags and artifacts of the run",
         {param::string("tracking_uri", "",
                        "the tracking server, http://host:port[/path]; empty: the MLFLOW_TRACKING_URI environment variable"),
          param::string("experiment", "",
                        "MLflow experiment; empty: the sweep's name for a sweep's arm, else the experiment file's name"),
          param::floating("timeout_s", 10.0, "seconds to wait for the server at each step of a request").within(0.1, 600),
          param::boolean("artifacts", true, "send config.toml, run.json, summary.json and the run directory's plots at the end")},
         make_mlflow,
         "",
         {}});
}

}  // namespace ablate::loggers
