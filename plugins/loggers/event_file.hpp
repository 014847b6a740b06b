// TensorBoard's event file format, written by hand so the plugin needs no protobuf or TensorFlow:
// the few protobuf fields of event.proto / summary.proto that scalars and plugin summaries use, and
// the TFRecord framing around each serialized Event. References: protobuf's wire format ("Encoding" in the protobuf
// docs), TensorFlow's event.proto and summary.proto, and TFRecord's record layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ablate::loggers::tfevents {

// Appends protobuf fields to a buffer. A field is a key (field number << 3 | wire type) followed by
// its payload; fields equal to their default may be left out (proto3), and a sub-message is a
// length-delimited field holding the sub-message's own encoding.
class ProtoWriter {
 public:
  void varint_field(uint32_t field, uint64_t value);         // wire type 0: int64, enum, bool
  void double_field(uint32_t field, double value);           // wire type 1: 8 bytes little-endian
  void float_field(uint32_t field, float value);             // wire type 5: 4 bytes little-endian
  void bytes_field(uint32_t field, std::string_view bytes);  // wire type 2: length, then bytes

  const std::string& bytes() const noexcept { return out_; }

 private:
  void varint(uint64_t value);
  std::string out_;
};

// CRC32C (Castagnoli) masked as TFRecord stores it: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(const void* data, std::size_t size);

// One TFRecord: uint64 length (little-endian), uint32 masked CRC32C of those 8 bytes, the data,
// uint32 masked CRC32C of the data.
std::string frame_record(std::string_view data);

// Serialized Events (tensorboard.Event):
// The first record of every event file: Event{wall_time, file_version = "brain.Event:2"}.
std::string file_version_event(double wall_time);
// Event{wall_time, step, session_log = SessionLog{status = START}}: a restart at `step`; TensorBoard
// drops what earlier files hold at `step` and after.
std::string restart_event(double wall_time, int64_t step);
// Event{wall_time, step, summary = Summary{value = [Value{tag, simple_value}, ...]}}.
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values);
// Event{wall_time, step, summary = Summary{value = [Value{tag, metadata = SummaryMetadata{plugin_data =
// PluginData{plugin_name, content}}, tensor = an empty float tensor}]}}: a plugin's summary whose
// data is all in its metadata, as TensorBoard's own hparams summaries are written.
std::string plugin_summary_event(double wall_time, int64_t step, std::string_view tag, std::string_view plugin_name,
                                 std::string_view content);

}  // namespace ablate::loggers::tfevents
