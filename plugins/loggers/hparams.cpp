// HParamsPluginData (see hparams.hpp). Field numbers, from tensorboard's plugin_data.proto and api.proto:
//   HParamsPluginData { int32 version = 1; oneof data { Experiment experiment = 2;
//                       SessionStartInfo session_start_info = 3; SessionEndInfo session_end_info = 4; } }
//   SessionStartInfo  { map<string, google.protobuf.Value> hparams = 1; string group_name = 4; double start_time_secs = 5; }
//   SessionEndInfo    { Status status = 1; double end_time_secs = 2; }   with STATUS_SUCCESS = 1
//   Experiment        { double time_created_secs = 3; repeated HParamInfo hparam_infos = 4; repeated MetricInfo metric_infos = 5; }
//   HParamInfo        { string name = 1; DataType type = 4; bool differs = 7; }
//                     with DATA_TYPE_STRING = 1, DATA_TYPE_BOOL = 2, DATA_TYPE_FLOAT64 = 3
//   MetricInfo        { MetricName name = 1; DatasetType dataset_type = 5; }
//                     with DATASET_TRAINING = 1, DATASET_VALIDATION = 2
//   MetricName        { string group = 1; string tag = 2; }   (group "": the session's own run)
//   google.protobuf.Value { double number_value = 2; string string_value = 3; bool bool_value = 4; }
// A map field is a repeated entry message { key = 1; value = 2; }. version is 0, the default, and
// so left out.
#include "hparams.hpp"

#include "event_file.hpp"

namespace ablate::loggers::hparams {
namespace {

using tfevents::ProtoWriter;

namespace plugin_data {
constexpr uint32_t experiment = 2, session_start_info = 3, session_end_info = 4;
}
namespace start_info {
constexpr uint32_t hparams = 1, group_name = 4, start_time_secs = 5;
}
namespace end_info {
constexpr uint32_t status = 1, end_time_secs = 2;
constexpr uint64_t kStatusSuccess = 1;
}
namespace experiment_field {
constexpr uint32_t time_created_secs = 3, hparam_infos = 4, metric_infos = 5;
}
namespace hparam_info {
constexpr uint32_t name = 1, type = 4, differs = 7;
constexpr uint64_t kString = 1, kBool = 2, kFloat64 = 3;
}
namespace metric_info {
constexpr uint32_t name = 1, dataset_type = 5;
constexpr uint64_t kTraining = 1, kValidation = 2;
constexpr uint32_t group = 1, tag = 2;  // MetricName
}
namespace value_field {
constexpr uint32_t number = 2, string = 3, boolean = 4;
}
constexpr uint32_t kMapKey = 1, kMapValue = 2;

uint64_t data_type(const ConfigEntry& e) {
  switch (e.type) {
    case ConfigEntry::Type::number: return hparam_info::kFloat64;
    case ConfigEntry::Type::boolean: return hparam_info::kBool;
    default: return hparam_info::kString;
  }
}

std::string value_message(const ConfigEntry& e) {
  ProtoWriter v;
  switch (e.type) {
    case ConfigEntry::Type::number: v.double_field(value_field::number, e.number); break;
    case ConfigEntry::Type::boolean: v.varint_field(value_field::boolean, e.boolean ? 1 : 0); break;
    default: v.bytes_field(value_field::string, e.text); break;
  }
  return v.bytes();
}

std::string plugin_data_with(uint32_t field, const ProtoWriter& data) {
  ProtoWriter out;
  out.bytes_field(field, data.bytes());
  return out.bytes();
}

}  // namespace

std::string experiment(const std::vector<HParam>& hparams, const std::vector<Metric>& metrics, double time_created_secs) {
  ProtoWriter e;
  e.double_field(experiment_field::time_created_secs, time_created_secs);
  for (const HParam& h : hparams) {
    ProtoWriter info;
    info.bytes_field(hparam_info::name, h.value.key);
    info.varint_field(hparam_info::type, data_type(h.value));
    if (h.differs) info.varint_field(hparam_info::differs, 1);
    e.bytes_field(experiment_field::hparam_infos, info.bytes());
  }
  for (const Metric& m : metrics) {
    ProtoWriter name;
    name.bytes_field(metric_info::group, "");
    name.bytes_field(metric_info::tag, m.tag);
    ProtoWriter info;
    info.bytes_field(metric_info::name, name.bytes());
    info.varint_field(metric_info::dataset_type, m.validation ? metric_info::kValidation : metric_info::kTraining);
    e.bytes_field(experiment_field::metric_infos, info.bytes());
  }
  return plugin_data_with(plugin_data::experiment, e);
}

std::string session_start(const std::vector<HParam>& hparams, const std::string& group_name, double start_time_secs) {
  ProtoWriter s;
  for (const HParam& h : hparams) {
    ProtoWriter entry;
    entry.bytes_field(kMapKey, h.value.key);
    entry.bytes_field(kMapValue, value_message(h.value));
    s.bytes_field(start_info::hparams, entry.bytes());
  }
  s.bytes_field(start_info::group_name, group_name);
  s.double_field(start_info::start_time_secs, start_time_secs);
  return plugin_data_with(plugin_data::session_start_info, s);
}

std::string session_success(double end_time_secs) {
  ProtoWriter s;
  s.varint_field(end_info::status, end_info::kStatusSuccess);
  s.double_field(end_info::end_time_secs, end_time_secs);
  return plugin_data_with(plugin_data::session_end_info, s);
}

}  // namespace ablate::loggers::hparams
