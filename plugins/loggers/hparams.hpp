// TensorBoard's HParams plugin data, encoded by hand like the rest of the event file (event_file.hpp):
// the serialized HParamsPluginData that goes, as plugin "hparams", into the summaries tagged
// "_hparams_/experiment", "_hparams_/session_start_info" and "_hparams_/session_end_info".
// References: tensorboard/plugins/hparams/plugin_data.proto and api.proto.
#pragma once

#include <string>
#include <vector>

#include "run_facts.hpp"

namespace ablate::loggers::hparams {

inline constexpr const char* kPluginName = "hparams";
inline constexpr const char* kExperimentTag = "_hparams_/experiment";
inline constexpr const char* kSessionStartTag = "_hparams_/session_start_info";
inline constexpr const char* kSessionEndTag = "_hparams_/session_end_info";

// One hyperparameter of the session: a config value, and whether it is one the sweep varies.
struct HParam {
  ConfigEntry value;  // numbers become FLOAT64, booleans BOOL, strings and lists STRING
  bool differs = false;
};

// A metric column of the hparams table: a scalar tag of the session's own run.
struct Metric {
  std::string tag;  // "train/loss"
  bool validation = false;
};

// HParamsPluginData{experiment = Experiment{time_created_secs, hparam_infos, metric_infos}}.
std::string experiment(const std::vector<HParam>& hparams, const std::vector<Metric>& metrics, double time_created_secs);
// HParamsPluginData{session_start_info = SessionStartInfo{hparams, group_name, start_time_secs}}.
std::string session_start(const std::vector<HParam>& hparams, const std::string& group_name, double start_time_secs);
// HParamsPluginData{session_end_info = SessionEndInfo{status = STATUS_SUCCESS, end_time_secs}}.
std::string session_success(double end_time_secs);

}  // namespace ablate::loggers::hparams
