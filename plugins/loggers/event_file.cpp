// TensorBoard event records (see event_file.hpp). Field numbers, from tensorboard's protos:
//   Event      { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//                SessionLog session_log = 7; }
//   Summary    { repeated Value value = 1; }
//   Value      { string tag = 1; float simple_value = 2; TensorProto tensor = 8; SummaryMetadata metadata = 9; }
//   SummaryMetadata { PluginData plugin_data = 1; }   PluginData { string plugin_name = 1; bytes content = 2; }
//   TensorProto { DataType dtype = 1; TensorShapeProto tensor_shape = 2; }   with DT_FLOAT = 1
//   TensorShapeProto { repeated Dim dim = 2; }   Dim { int64 size = 1; }
//   SessionLog { SessionStatus status = 1; }   with START = 1
#include "event_file.hpp"

#include <cstring>

#include <boost/crc.hpp>

namespace ablate::loggers::tfevents {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

namespace event_field {
constexpr uint32_t wall_time = 1, step = 2, file_version = 3, summary = 5, session_log = 7;
}
constexpr uint32_t kSummaryValue = 1;                                                           // Summary.value
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2, kValueTensor = 8, kValueMetadata = 9;  // Summary.Value
constexpr uint32_t kMetadataPluginData = 1;                                                     // SummaryMetadata.plugin_data
constexpr uint32_t kPluginName = 1, kPluginContent = 2;                                         // SummaryMetadata.PluginData
constexpr uint32_t kTensorDtype = 1, kTensorShape = 2, kDtFloat = 1;                            // TensorProto
constexpr uint32_t kShapeDim = 2;                                                               // TensorShapeProto.dim
constexpr uint32_t kStatusField = 1, kStatusStart = 1;                                          // SessionLog.status = START

void put_le(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((bits >> (8 * i)) & 0xff));
}

// Boost.CRC's CRC-32C: polynomial 0x1EDC6F41, reflected in and out, initial and final XOR all ones.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

}  // namespace

void ProtoWriter::varint(uint64_t value) {
  // Seven bits at a time, least significant first; the high bit marks that more bytes follow.
  while (value >= 0x80) {
    out_.push_back(char((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out_.push_back(char(value));
}

void ProtoWriter::varint_field(uint32_t field, uint64_t value) {
  varint((uint64_t(field) << 3) | kVarint);
  varint(value);
}

void ProtoWriter::double_field(uint32_t field, double value) {
  varint((uint64_t(field) << 3) | kFixed64);
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_le(out_, bits, 8);
}

void ProtoWriter::float_field(uint32_t field, float value) {
  varint((uint64_t(field) << 3) | kFixed32);
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_le(out_, bits, 4);
}

void ProtoWriter::bytes_field(uint32_t field, std::string_view bytes) {
  varint((uint64_t(field) << 3) | kLengthDelimited);
  varint(bytes.size());
  out_.append(bytes);
}

uint32_t masked_crc32c(const void* data, std::size_t size) {
  Crc32c crc;
  crc.process_bytes(data, size);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string frame_record(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  put_le(record, data.size(), 8);
  put_le(record, masked_crc32c(record.data(), 8), 4);
  record.append(data);
  put_le(record, masked_crc32c(data.data(), data.size()), 4);
  return record;
}

std::string file_version_event(double wall_time) {
  ProtoWriter event;
  event.double_field(event_field::wall_time, wall_time);
  event.bytes_field(event_field::file_version, "brain.Event:2");
  return event.bytes();
}

std::string restart_event(double wall_time, int64_t step) {
  ProtoWriter status;
  status.varint_field(kStatusField, kStatusStart);
  ProtoWriter event;
  event.double_field(event_field::wall_time, wall_time);
  event.varint_field(event_field::step, uint64_t(step));
  event.bytes_field(event_field::session_log, status.bytes());
  return event.bytes();
}

namespace {

std::string summary_event(double wall_time, int64_t step, const ProtoWriter& summary) {
  ProtoWriter event;
  event.double_field(event_field::wall_time, wall_time);
  event.varint_field(event_field::step, uint64_t(step));  // int64 as two's complement, as protobuf does
  event.bytes_field(event_field::summary, summary.bytes());
  return event.bytes();
}

}  // namespace

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, float>>& values) {
  ProtoWriter summary;
  for (const auto& [tag, v] : values) {
    ProtoWriter value;
    value.bytes_field(kValueTag, tag);
    value.float_field(kValueSimpleValue, v);
    summary.bytes_field(kSummaryValue, value.bytes());
  }
  return summary_event(wall_time, step, summary);
}

std::string plugin_summary_event(double wall_time, int64_t step, std::string_view tag, std::string_view plugin_name,
                                 std::string_view content) {
  ProtoWriter plugin_data;
  plugin_data.bytes_field(kPluginName, plugin_name);
  plugin_data.bytes_field(kPluginContent, content);
  ProtoWriter metadata;
  metadata.bytes_field(kMetadataPluginData, plugin_data.bytes());
  ProtoWriter shape;
  shape.bytes_field(kShapeDim, "");  // one dimension of size 0 (the default, so the Dim is empty)
  ProtoWriter tensor;
  tensor.varint_field(kTensorDtype, kDtFloat);
  tensor.bytes_field(kTensorShape, shape.bytes());
  ProtoWriter value;
  value.bytes_field(kValueTag, tag);
  value.bytes_field(kValueTensor, tensor.bytes());
  value.bytes_field(kValueMetadata, metadata.bytes());
  ProtoWriter summary;
  summary.bytes_field(kSummaryValue, value.bytes());
  return summary_event(wall_time, step, summary);
}

}  // namespace ablate::loggers::tfevents
