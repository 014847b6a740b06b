// Checkpoints: the files of one saved step, the state that names them, resume, and the model
// restored for evaluation, sampling and export (see checkpointer.hpp and ablate/runtime/checkpoint.hpp).
#include "checkpointer.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstring>
#include <optional>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/runtime/checkpoint.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/runtime/run_spec.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/runtime/hf_checkpoint.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/reshard.hpp"
#include "ablate/runtime/safetensors.hpp"
#include "ablate/runtime/session.hpp"
#include "ablate/runtime/defaults.hpp"
#include "ablate/runtime/trainer.hpp"

namespace ablate {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}


}  // namespace

// A cursor holds positions only: the draw number and the batcher's pending pieces as token offsets.
// Consecutive pieces of one document cut at a fixed length (a long document split into rows) are
// one run, [document, begin, end, length]: the pieces [begin + i length, min(end, begin + (i + 1)
// length)). A single piece is [document, begin, end]. So a cursor's size follows the number of
// documents pending, not their length (a 50 MB one-line text is one run, not 1.5 million pieces).
json cursor_json(const DataCursor& c) {
  json pending = json::array();
  for (std::size_t i = 0; i < c.pending.size();) {
    const PendingPiece& first = c.pending[i];
    const int32_t length = first.end - first.begin;
    int32_t end = first.end;
    std::size_t j = i + 1;
    // Extend while the next piece continues the document and every piece so far is whole.
    while (j < c.pending.size() && c.pending[j].document == first.document && c.pending[j].begin == end &&
           (end - first.begin) % length == 0 && c.pending[j].end - c.pending[j].begin <= length) {
      end = c.pending[j].end;
      ++j;
    }
    if (j == i + 1) pending.push_back({first.document, first.begin, first.end});
    else pending.push_back({first.document, first.begin, end, length});
    i = j;
  }
  json out = {{"draw", c.draw}, {"pending", pending}};
  // A job resumed on another world size: how its ranks deal the documents (data.hpp's Reshard).
  if (c.reshard) {
    out["reshard"] = {
        {"from_world", c.reshard->from_world}, {"first", c.reshard->first}, {"end", c.reshard->end}, {"drawn", c.reshard->drawn}};
  }
  return out;
}

namespace {

// A state.json field that must be a whole number in [lo, hi]: an input error naming the file, the
// field and what it holds otherwise (a string, a float, a negative seed read as a huge one).
template <class T>
T whole_field(const json& j, const std::string& field, const fs::path& file, T lo, T hi) {
  const auto refuse = [&](const std::string& held) -> T {
    throw_input_error(file.string(), "not a valid checkpoint state: '" + field + "' is " + held + ", expected a whole number from " +
                                         std::to_string(lo) + " to " + std::to_string(hi));
  };
  if (!j.is_number_integer()) return refuse(echo_value(j.dump()));
  if (j.is_number_unsigned()) {
    const uint64_t v = j.get<uint64_t>();
    if (v > uint64_t(hi) || (lo > T(0) && v < uint64_t(lo))) return refuse(j.dump());
    return T(v);
  }
  const int64_t v = j.get<int64_t>();
  if (v < 0 && std::is_unsigned_v<T>) return refuse(j.dump());
  if ((!std::is_unsigned_v<T> && (v < int64_t(lo) || v > int64_t(hi))) || (std::is_unsigned_v<T> && uint64_t(v) > uint64_t(hi))) {
    return refuse(j.dump());
  }
  return T(v);
}

template <class T>
T whole_field(const json& j, const char* key, const std::string& prefix, const fs::path& file, T lo, T hi) {
  if (!j.is_object() || !j.contains(key)) {
    throw_input_error(file.string(), "not a valid checkpoint state: no '" + prefix + key + "'");
  }
  return whole_field<T>(j.at(key), prefix + key, file, lo, hi);
}

// A state.json field that must be a string.
std::string string_field(const json& j, const char* key, const fs::path& file) {
  if (!j.contains(key)) throw_input_error(file.string(), std::string("not a valid checkpoint state: no '") + key + "'");
  if (!j.at(key).is_string()) {
    throw_input_error(file.string(), std::string("not a valid checkpoint state: '") + key + "' is " + echo_value(j.at(key).dump()) +
                                         ", expected a string");
  }
  return j.at(key).get<std::string>();
}

// More pieces than any batcher holds (a batch's rows, and the rest of the documents it cut): a
// damaged run would otherwise expand into gigabytes.
constexpr std::size_t kMaxPendingPieces = std::size_t(1) << 26;

}  // namespace

DataCursor cursor_from(const json& j, const std::string& name, const fs::path& file) {
  DataCursor c;
  c.draw = whole_field<uint64_t>(j, "draw", name + ".", file, 0, UINT64_MAX - 1);
  if (!j.contains("pending") || !j.at("pending").is_array()) {
    throw_input_error(file.string(), "not a valid checkpoint state: '" + name + ".pending' is not an array");
  }
  const json& pending = j.at("pending");
  for (std::size_t i = 0; i < pending.size(); ++i) {
    const std::string at = name + ".pending[" + std::to_string(i) + "]";
    const json& p = pending[i];
    if (!p.is_array() || (p.size() != 3 && p.size() != 4)) {
      throw_input_error(file.string(), "not a valid checkpoint state: '" + at + "' is " + echo_value(p.dump()) +
                                           ", expected [document, begin, end] or a run [document, begin, end, length]");
    }
    PendingPiece piece;
    piece.document = whole_field<uint64_t>(p[0], at + "[0] (document)", file, 0, UINT64_MAX);
    piece.begin = whole_field<int32_t>(p[1], at + "[1] (begin)", file, 0, INT32_MAX);
    const auto end = whole_field<int32_t>(p[2], at + "[2] (end)", file, 1, INT32_MAX);
    if (end <= piece.begin) {
      throw_input_error(file.string(), "not a valid checkpoint state: '" + at + "' is " + p.dump() + ", an empty piece");
    }
    const int32_t length = p.size() == 4 ? whole_field<int32_t>(p[3], at + "[3] (length)", file, 1, INT32_MAX) : end - piece.begin;
    const int64_t pieces = (int64_t(end) - piece.begin + length - 1) / length;
    if (c.pending.size() + uint64_t(pieces) > kMaxPendingPieces) {
      throw_input_error(file.string(), "not a valid checkpoint state: '" + name + ".pending' holds more than " +
                                           std::to_string(kMaxPendingPieces) + " pieces (at '" + at + "')");
    }
    for (int64_t b = piece.begin; b < end; b += length) {
      c.pending.push_back({piece.document, int32_t(b), int32_t(std::min<int64_t>(end, b + length))});
    }
  }
  // Absent in a cursor of the sampler's standard deal (and in every checkpoint written before it existed).
  if (j.contains("reshard")) {
    const std::string at = name + ".reshard";
    const json& r = j.at("reshard");
    if (!r.is_object()) {
      throw_input_error(file.string(), "not a valid checkpoint state: '" + at + "' is " + echo_value(r.dump()) +
                                           ", expected {\"from_world\", \"first\", \"end\", \"drawn\"}");
    }
    Reshard record;
    record.from_world = whole_field<int>(r, "from_world", at + ".", file, 1, 1 << 20);
    record.first = whole_field<uint64_t>(r, "first", at + ".", file, 0, UINT64_MAX - 1);
    record.end = whole_field<uint64_t>(r, "end", at + ".", file, 0, UINT64_MAX - 1);
    if (!r.contains("drawn") || !r.at("drawn").is_array()) {
      throw_input_error(file.string(), "not a valid checkpoint state: '" + at + ".drawn' is not an array");
    }
    const json& drawn = r.at("drawn");
    if (drawn.size() > kMaxReshardDrawn) {
      throw_input_error(file.string(), "not a valid checkpoint state: '" + at + ".drawn' holds more than " +
                                           std::to_string(kMaxReshardDrawn) + " positions");
    }
    for (std::size_t i = 0; i < drawn.size(); ++i) {
      record.drawn.push_back(whole_field<uint64_t>(drawn[i], at + ".drawn[" + std::to_string(i) + "]", file, 0, UINT64_MAX - 1));
    }
    check_reshard(record, at, file.string());
    c.reshard = std::move(record);
  }
  return c;
}

namespace {

// A cursor's draw number, checked against the data: every draw hands the batcher a document, and a
// document that is not empty puts at least one token into a batch or stays pending; between two
// non-empty documents at most one epoch of empty ones can be drawn (the pipeline stops there). So
// after `step` steps of at most rows x T tokens per micro-batch, a rank drew at most
// (step x accumulation x rows x T + pending + 1) x (draws per epoch + 1) documents. A larger draw
// is a damaged checkpoint (or one of other data), refused before anything is restored.
void check_cursor_draws(const CheckpointState& st, const DataPipeline& data, int64_t accumulation, const fs::path& state_file) {
  using u128 = unsigned __int128;
  // The cursors' own world may be smaller than this job's (more draws an epoch per rank).
  const uint64_t documents = data.source().size(data.options().split);
  const uint64_t per_epoch = std::max<uint64_t>(data.draws_per_epoch(), (documents + uint64_t(st.world) - 1) / uint64_t(st.world));
  const u128 tokens = u128(uint64_t(std::max<int64_t>(st.step, 0))) * u128(uint64_t(std::max<int64_t>(accumulation, 1))) *
                      u128(uint64_t(std::max(data.batcher().max_rows(), 1))) *
                      u128(uint64_t(std::max(data.batcher().max_seq_len(), 1)));
  for (std::size_t r = 0; r < st.cursors.size(); ++r) {
    const DataCursor& c = st.cursors[r];
    const u128 bound = (tokens + c.pending.size() + 1) * (u128(per_epoch) + 1);
    if (u128(c.draw) > bound) {
      const uint64_t shown = bound > u128(UINT64_MAX) ? UINT64_MAX : uint64_t(bound);
      throw_input_error(state_file.string(), "data_cursors[" + std::to_string(r) + "].draw is " + std::to_string(c.draw) +
                                                 ", more than the " + std::to_string(shown) + " draws " + std::to_string(st.step) +
                                                 " step(s) can have taken from this data (" + std::to_string(per_epoch) +
                                                 " draws an epoch): the checkpoint is damaged or was written with other data");
    }
  }
}

// The first value of a floating-point tensor that is a NaN or an infinity: its flat index, -1 when
// every value is finite (and for integer tensors).
int64_t first_nonfinite(const NamedTensor& t, double& value) {
  const std::size_t n = t.bytes.size();
  const unsigned char* b = t.bytes.data();
  switch (t.dtype) {
    case DType::f32:
      for (std::size_t i = 0; i + 4 <= n; i += 4) {
        float v;
        std::memcpy(&v, b + i, 4);
        if (!std::isfinite(v)) return value = v, int64_t(i / 4);
      }
      return -1;
    case DType::f64:
      for (std::size_t i = 0; i + 8 <= n; i += 8) {
        double v;
        std::memcpy(&v, b + i, 8);
        if (!std::isfinite(v)) return value = v, int64_t(i / 8);
      }
      return -1;
    case DType::bf16:
    case DType::f16: {
      const uint16_t exponent = t.dtype == DType::bf16 ? 0x7f80 : 0x7c00;
      const uint16_t mantissa = t.dtype == DType::bf16 ? 0x007f : 0x03ff;
      for (std::size_t i = 0; i + 2 <= n; i += 2) {
        uint16_t v;
        std::memcpy(&v, b + i, 2);
        if ((v & exponent) == exponent) {
          value = (v & mantissa) != 0 ? std::nan("") : ((v & 0x8000) != 0 ? -INFINITY : INFINITY);
          return int64_t(i / 2);
        }
      }
      return -1;
    }
    default: return -1;
  }
}

// Refuses (or, with `allow`, warns about) the first tensor of `file` holding a NaN or an infinity.
void require_finite(const fs::path& file, const std::vector<NamedTensor>& tensors, bool allow) {
  for (const NamedTensor& t : tensors) {
    double value = 0;
    const int64_t at = first_nonfinite(t, value);
    if (at < 0) continue;
    const std::string what = "tensor '" + t.name + "' holds " +
                             (std::isnan(value) ? "NaN"
                              : value > 0       ? "+inf"
                                                : "-inf") +
                             " at index " + std::to_string(at) + ", expected finite values";
    if (allow) {
      spdlog::warn("{}: {} (read anyway: --allow-nonfinite)", file.string(), what);
      return;
    }
    throw_input_error(file.string(), what + ": the run diverged or the file is damaged (eval and sample read it anyway with "
                                            "--allow-nonfinite)");
  }
}

std::vector<NamedTensor> param_tensors(const ParamTable& table, const std::vector<float>& data) {
  std::vector<NamedTensor> out;
  for (const ParamSlice& s : table.slices) {
    NamedTensor t;
    t.name = s.name;
    t.dtype = DType::f32;
    t.shape = s.shape;
    t.bytes.resize(std::size_t(s.numel()) * 4);
    std::memcpy(t.bytes.data(), data.data() + s.offset, t.bytes.size());
    out.push_back(std::move(t));
  }
  return out;
}

void load_params(const fs::path& file, const ParamTable& table, std::vector<float>& data, bool allow_nonfinite) {
  SafetensorsFile f;
  try {
    f = read_safetensors(file);
  } catch (const Error& e) {
    throw_input_error(file.string(), std::string("cannot read the checkpoint's parameters: ") + e.what());
  }
  const auto by_name = tensors_by_name(f);
  for (const ParamSlice& s : table.slices) {
    const auto found = by_name.find(s.name);
    const NamedTensor* t = found == by_name.end() ? nullptr : found->second;
    if (t == nullptr)
      throw_input_error(file.string(), "the checkpoint has no tensor '" + s.name + "': it was written for another model");
    if (t->shape != s.shape || t->dtype != DType::f32) {
      std::string want, got;
      for (int64_t d : s.shape) want += (want.empty() ? "" : "x") + std::to_string(d);
      for (int64_t d : t->shape) got += (got.empty() ? "" : "x") + std::to_string(d);
      throw_input_error(file.string(), "tensor '" + s.name + "' is " + got + " in the checkpoint, the model expects " + want +
                                           ": the checkpoint does not match the config's [model]");
    }
    std::memcpy(data.data() + s.offset, t->bytes.data(), t->bytes.size());
  }
  if (f.tensors.size() != table.slices.size()) {
    throw_input_error(file.string(), "the checkpoint has " + std::to_string(f.tensors.size()) + " tensors, the model " +
                                         std::to_string(table.slices.size()) + ": it was written for another model");
  }
  require_finite(file, f.tensors, allow_nonfinite);
}

constexpr const char* kScalingFile = "scaling.safetensors";  // the layers' scaling state, where there is one
constexpr const char* kScalingTensor = "scaling_state";

// A checkpoint's model.safetensors (the parameters by name, fp32), config.toml and, where the
// layers keep one (FP8 delayed scaling), scaling.safetensors.
void write_model_and_config(const fs::path& dir, Model& model, const RunSpec& spec) {
  SafetensorsFile mf;
  std::vector<float> values;
  model.copy_params_to_host(values);
  mf.tensors = param_tensors(model.table(), values);
  mf.metadata["format"] = "ablate";
  write_safetensors(dir / "model.safetensors", mf);
  write_file_atomic(dir / "config.toml", spec.config_toml);
  const TensorView state = model.scaling_state();
  if (state.data == nullptr) return;
  NamedTensor t{kScalingTensor, DType::f32, {state.numel()}, std::vector<uint8_t>(std::size_t(state.numel()) * sizeof(float))};
  model.device().download(t.bytes.data(), state);
  SafetensorsFile sf;
  sf.tensors.push_back(std::move(t));
  sf.metadata["format"] = "ablate";
  write_safetensors(dir / kScalingFile, sf);
}

// The layers' scaling state from a checkpoint, where both have one of the same size; otherwise the
// run goes on with what it has (zeros: the scales start afresh) and says why.
void restore_scaling_state(const fs::path& cdir, Model& model, const RunSpec& spec) {
  const fs::path file = cdir / kScalingFile;
  const TensorView state = model.scaling_state();
  if (!fs::exists(file)) {
    if (state.data != nullptr) {
      spdlog::warn("{}: the checkpoint holds no FP8 scaling state (written without run.fp8_scaling = \"delayed\"); the "
                   "scales start afresh, from each tensor's own amax at first",
                   cdir.string());
    }
    return;
  }
  SafetensorsFile f;
  try {
    f = read_safetensors(file);
  } catch (const Error& e) {
    throw_input_error(file.string(), std::string("cannot read the scaling state: ") + e.what());
  }
  const NamedTensor* t = f.find(kScalingTensor);
  if (t == nullptr || t->dtype != DType::f32 || t->shape.size() != 1) {
    throw_input_error(file.string(), std::string("not a scaling state: expected one f32 vector named '") + kScalingTensor + "'");
  }
  if (state.data == nullptr) {
    spdlog::warn("{}: FP8 delayed scaling state that this run (run.dtype = \"{}\", run.fp8_scaling = \"{}\") does not use: "
                 "ignored",
                 file.string(), spec.run.dtype, spec.run.fp8_scaling);
    return;
  }
  if (t->shape[0] != state.numel()) {
    spdlog::warn("{}: {} values of scaling state, this run keeps {} (another run.fp8_amax_history, or model): the scales "
                 "start afresh",
                 file.string(), t->shape[0], state.numel());
    return;
  }
  model.device().upload(state, t->bytes.data());
}

}  // namespace

// Bytes that are not UTF-8 (a path of such a name) are written as U+FFFD rather than refused.
void write_json_file(const fs::path& p, const json& j) {
  write_file_atomic(p, j.dump(2, ' ', false, json::error_handler_t::replace) + "\n");
}

std::optional<fs::path> newest_complete_checkpoint(const fs::path& run_dir) {
  const fs::path root = run_dir / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  int64_t best = -1;
  fs::path found;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("step_", 0) != 0 || n.size() == 5 || n.size() > 5 + 18) continue;
    if (n.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    // state.json is written last, inside the hidden directory that is renamed into place: a
    // step_ directory holding it is complete.
    if (!fs::is_regular_file(e.path() / "state.json", ec)) continue;
    const int64_t step = std::stoll(n.substr(5));
    if (step > best) {
      best = step;
      found = e.path();
    }
  }
  if (best < 0) return std::nullopt;
  return found;
}

bool has_checkpoint(const fs::path& run_dir) {
  std::error_code ec;
  return fs::exists(fs::symlink_status(run_dir / "checkpoints" / "latest", ec)) || newest_complete_checkpoint(run_dir).has_value();
}

fs::path resolve_checkpoint(const fs::path& path) {
  if (!fs::exists(path)) throw_input_error(path.string(), "no such checkpoint or run directory");
  if (fs::exists(path / "state.json")) return path;
  const fs::path latest = path / "checkpoints" / "latest";
  std::error_code ec;
  if (fs::exists(fs::symlink_status(latest, ec))) {
    std::string name = read_regular_file(latest, "checkpoint pointer", kMaxPointerBytes);
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ' || name.back() == '\r')) name.pop_back();
    // A checkpoint of this run: a plain directory name under checkpoints/, never a path that
    // leaves it ("../elsewhere", "/abs/path", a symlink pointing out).
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
      throw_input_error(latest.string(), "names '" + echo_value(name) + "', expected the name of a checkpoint directory inside " +
                                             (path / "checkpoints").string() + " (like step_00000100)");
    }
    const fs::path dir = path / "checkpoints" / name;
    if (!fs::exists(dir / "state.json")) {
      throw_input_error(latest.string(), "names '" + echo_value(name) + "', which is not a complete checkpoint (" +
                                             (dir / "state.json").string() + " is missing)");
    }
    const fs::path real_root = fs::canonical(path / "checkpoints", ec);
    const fs::path real_dir = ec ? fs::path() : fs::canonical(dir, ec);
    if (ec || real_dir.parent_path() != real_root) {
      throw_input_error(latest.string(), "names '" + echo_value(name) + "', which leads to " +
                                             (ec ? dir.string() : real_dir.string()) + ", outside " + (path / "checkpoints").string() +
                                             ": expected a checkpoint of this run");
    }
    return dir;
  }
  // A run stopped between moving a checkpoint into place and naming it latest: its newest
  // complete checkpoint is the one it would have named.
  if (const auto newest = newest_complete_checkpoint(path)) {
    spdlog::warn("{}: missing (the run stopped while saving a checkpoint); using {}, the newest complete checkpoint", latest.string(),
                 newest->string());
    return *newest;
  }
  throw_input_error(path.string(), "is neither a checkpoint (no state.json) nor a run directory with a complete checkpoint");
}

CheckpointState read_checkpoint_state(const fs::path& dir) {
  const fs::path file = dir / "state.json";
  CheckpointState s;
  try {
    const std::string text = read_json_text(file, "checkpoint state", kMaxJsonBytes);
    const json j = json::parse(text);
    if (!j.is_object()) throw_input_error(file.string(), "not a valid checkpoint state: not a JSON object");
    s.step = whole_field<int64_t>(j, "step", "", file, 0, INT64_MAX);
    for (auto [key, into] : {std::pair<const char*, double*>{"loss", &s.loss}, {"val_loss", &s.val_loss}}) {
      if (!j.contains(key) || j.at(key).is_null()) continue;  // not recorded (or not evaluated at that step)
      if (!j.at(key).is_number() || !std::isfinite(j.at(key).get<double>())) {
        throw_input_error(file.string(), std::string("not a valid checkpoint state: '") + key + "' is " +
                                             echo_value(j.at(key).dump()) + ", expected a finite number or null");
      }
      *into = j.at(key).get<double>();
    }
    if (!j.contains("data_cursor")) throw_input_error(file.string(), "not a valid checkpoint state: no 'data_cursor'");
    s.cursor = cursor_from(j.at("data_cursor"), "data_cursor", file);
    s.seed = whole_field<uint64_t>(j, "seed", "", file, 0, UINT64_MAX);
    s.config_hash = string_field(j, "config_hash", file);
    s.model = string_field(j, "model", file);
    s.parameters = whole_field<int64_t>(j, "parameters", "", file, 0, INT64_MAX);
    s.optimizer = string_field(j, "optimizer", file);
    s.vocab_size = whole_field<int64_t>(j, "vocab_size", "", file, 1, INT32_MAX);
    s.world = j.contains("world") ? whole_field<int>(j, "world", "", file, 1, 1 << 20) : 1;
    if (j.contains("shard_state") && !j.at("shard_state").is_boolean()) {
      throw_input_error(file.string(), "not a valid checkpoint state: 'shard_state' is " + echo_value(j.at("shard_state").dump()) +
                                           ", expected true or false");
    }
    s.shard_state = j.value("shard_state", false);
    if (j.contains("data_cursors")) {
      const json& cursors = j.at("data_cursors");
      if (!cursors.is_array()) throw_input_error(file.string(), "not a valid checkpoint state: 'data_cursors' is not an array");
      for (std::size_t r = 0; r < cursors.size(); ++r) {
        s.cursors.push_back(cursor_from(cursors[r], "data_cursors[" + std::to_string(r) + "]", file));
      }
    } else {
      s.cursors.push_back(s.cursor);
    }
    if (j.contains("optimizer_files")) {
      s.optimizer_files = j.at("optimizer_files").get<std::vector<std::string>>();
    } else {
      s.optimizer_files.push_back("optimizer.safetensors");
    }
  } catch (const json::exception& e) {
    throw_input_error(file.string(), std::string("not a valid checkpoint state: ") + e.what());
  }
  if (s.step < 0 || s.parameters < 0 || s.vocab_size <= 0) {
    throw_input_error(file.string(), "not a valid checkpoint state: step " + std::to_string(s.step) + ", parameters " +
                                         std::to_string(s.parameters) + ", vocab_size " + std::to_string(s.vocab_size));
  }
  for (const std::string& f : s.optimizer_files) {  // files of this checkpoint's own directory, nothing else
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos) {
      throw_input_error(file.string(), "not a valid checkpoint state: optimizer file '" + f + "' is not a plain file name");
    }
  }
  if (s.world < 1 || int64_t(s.cursors.size()) != s.world || int64_t(s.optimizer_files.size()) != (s.shard_state ? s.world : 1)) {
    throw_input_error(file.string(), "not a valid checkpoint state: world " + std::to_string(s.world) + " with " +
                                         std::to_string(s.cursors.size()) + " data cursors and " +
                                         std::to_string(s.optimizer_files.size()) + " optimizer files");
  }
  return s;
}

LoadedModel load_model(const fs::path& path, Registry& registry, bool allow_nonfinite, const std::vector<std::string>& overrides) {
  LoadedModel lm;
  lm.dir = resolve_checkpoint(path);
  lm.state = read_checkpoint_state(lm.dir);
  const fs::path cfg = lm.dir / "config.toml";
  if (!fs::exists(cfg)) throw_input_error(lm.dir.string(), "checkpoint has no config.toml");
  const std::string cfg_text = read_regular_file(cfg, "checkpoint config", kMaxRunTomlBytes);
  lm.config = std::make_unique<Config>(Config::parse(cfg_text, cfg.string(), overrides, registry, lm.dir));
  lm.spec = std::make_unique<RunSpec>(RunSpec::from(*lm.config));
  // Read on the cpu in fp32, whatever device the run trained on (the process's threads as they are).
  RunContext run;
  run.seed = lm.state.seed;
  const Session session(*lm.spec, registry, run);
  ModelOptions mo = session.model_options(lm.state.vocab_size);
  // A checkpoint of a GPU run names a GPU attention backend; every backend computes the same
  // function, so the CPU reads it with the CPU reference.
  if (registry.find(Kind::attention, mo.attention, "cpu") == nullptr) {
    spdlog::info("attention '{}' does not run on the cpu: {} is read with {}", mo.attention, lm.dir.string(), defaults::cpu_attention);
    mo.attention = defaults::cpu_attention;
  }
  lm.model = session.model(mo);
  std::vector<float> values(std::size_t(lm.model->num_params()));
  load_params(lm.dir / "model.safetensors", lm.model->table(), values, allow_nonfinite);
  lm.model->load_params_from_host(values);
  return lm;
}

void write_initial_checkpoint(const fs::path& run_dir, const RunSpec& spec, Model& model, const json& provenance) {
  const fs::path root = run_dir / "checkpoints", final_dir = root / step_name(0), tmp = root / ("." + step_name(0) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  write_model_and_config(tmp, model, spec);
  write_safetensors(tmp / "optimizer.safetensors", SafetensorsFile{});  // no optimizer has run
  const json cursor = {{"draw", 0}, {"pending", json::array()}};
  write_json_file(tmp / "state.json", {{"step", 0},
                                       {"loss", nullptr},
                                       {"val_loss", nullptr},
                                       {"data_cursor", cursor},
                                       {"data_cursors", json::array({cursor})},
                                       {"world", 1},
                                       {"shard_state", false},
                                       {"optimizer_files", json::array({"optimizer.safetensors"})},
                                       {"seed", int64_t(spec.run.seed)},
                                       {"config_hash", spec.config_hash},
                                       {"model", model.options().describe()},
                                       {"parameters", model.num_params()},
                                       {"vocab_size", model.options().vocab_size},
                                       {"optimizer", spec.optimizer.name},
                                       {"imported_from", provenance}});
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  write_file_atomic(root / "latest", step_name(0) + "\n");
}

namespace {

// Where two model descriptions (ModelOptions::describe) part: the first of their space-separated
// "key=value" words that differs, as "<checkpoint's> where this experiment's [model] has <experiment's>".
std::string first_difference(const std::string& checkpoint, const std::string& experiment) {
  std::istringstream a(checkpoint), b(experiment);
  std::string x, y;
  while (true) {
    const bool more_a = bool(a >> x), more_b = bool(b >> y);
    if (!more_a && !more_b) return "a different shape";
    if (!more_a) return "nothing where this experiment's [model] has " + y;
    if (!more_b) return x + " where this experiment's [model] has nothing";
    if (x != y) return x + " where this experiment's [model] has " + y;
  }
}

}  // namespace

void init_from_weights(Model& model, const fs::path& from) {
  // The base's parameters come from the directory; an adapter's (after the base) keep the fresh
  // initialisation the model has already.
  std::vector<float> values;
  model.copy_params_to_host(values);
  const int64_t base_end = model.frozen_params() > 0 ? model.frozen_params() : model.num_params();
  ParamTable base;
  for (const ParamSlice& s : model.table().slices) {
    if (s.offset < base_end) base.slices.push_back(s);
  }
  base.total = base_end;
  if (is_hf_checkpoint_dir(from)) {
    const HfCheckpoint hf = read_hf_checkpoint(from);
    require_hf_model_matches(hf, model.options());
    const std::vector<float> read = hf_parameters(hf, model);
    std::copy(read.begin(), read.begin() + base_end, values.begin());
  } else {
    if (!fs::is_directory(from)) {
      throw_input_error("model.init_from", "'" + from.string() +
                                               "' is not a directory (expected an ablate run or checkpoint "
                                               "directory, or a Hugging Face checkpoint directory with config.json)");
    }
    const fs::path dir = resolve_checkpoint(from);
    const CheckpointState st = read_checkpoint_state(dir);
    // The same model up to its attention backend (every backend computes the same function).
    const auto shape_of = [](std::string d) { return d.substr(0, d.find(" attention=")); };
    if (shape_of(st.model) != shape_of(model.options().describe())) {
      throw_input_error("model.init_from", "'" + from.string() + "' holds a model with " +
                                               first_difference(shape_of(st.model), shape_of(model.options().describe())) +
                                               " (leave the key out of [model] to take the checkpoint's); its model is " + st.model +
                                               ", this experiment's " + model.options().describe());
    }
    load_params(dir / "model.safetensors", base, values, false);
  }
  model.load_params_from_host(values);
  spdlog::info("model.init_from: {} parameters from {}", base_end, from.string());
}


// ---------------------------------------------------------------------------------------------

// Retention: the newest `keep` checkpoints by step (not by name: step_100000000 sorts before
// step_99999999 as text) among those at or before the one just written, which `latest` names and
// is never removed. Checkpoints after it are left alone: they belong to an abandoned continuation
// (a run resumed from an earlier checkpoint, or killed between writing a checkpoint and naming it
// latest) and are data, not clutter; a later save of the same step replaces its directory.
void Checkpointer::remove_old_checkpoints(int64_t written) const {
  std::vector<std::pair<int64_t, fs::path>> older;
  for (const auto& e : fs::directory_iterator(root_)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step_", 0) != 0 || n.size() == 5) continue;
    if (n.find_first_not_of("0123456789", 5) != std::string::npos || n.size() > 5 + 18) continue;
    const int64_t step = std::stoll(n.substr(5));
    if (step < written) older.emplace_back(step, e.path());
  }
  std::sort(older.begin(), older.end());
  // `written` itself is one of the `keep` newest.
  const std::size_t keep_older = spec_.checkpoint_keep > 0 ? std::size_t(spec_.checkpoint_keep - 1) : 0;
  for (std::size_t i = 0; i + keep_older < older.size(); ++i) fs::remove_all(older[i].second);
}

Checkpointer::Checkpointer(const Setup& setup, const RunSpec& spec, Communicator& comm)
    : s_(setup), spec_(spec), comm_(comm), root_(setup.run_dir / "checkpoints") {}

std::string Checkpointer::optimizer_file(int rank) const {
  if (!spec_.shard_state) return "optimizer.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "optimizer.rank_%05d-of-%05d.safetensors", rank, comm_.world());
  return buf;
}

void Checkpointer::save(int64_t step, Model& model, const Optimizer& optimizer, const DataPipeline& data, double loss,
                        double val_loss) {
  const fs::path final_dir = root_ / step_name(step);
  const fs::path tmp = root_ / ("." + step_name(step) + ".tmp");
  if (comm_.rank() == 0) {
    fs::remove_all(tmp);
    fs::create_directories(tmp);
  }
  comm_.barrier();
  char cname[48];
  std::snprintf(cname, sizeof cname, "cursor.rank_%05d.json", comm_.rank());
  write_json_file(tmp / cname, cursor_json(data.cursor()));
  if (spec_.shard_state || comm_.rank() == 0) {
    SafetensorsFile of;
    of.tensors = optimizer.save_state();
    write_safetensors(tmp / optimizer_file(comm_.rank()), of);
  }
  comm_.barrier();
  if (comm_.rank() == 0) {
    write_model_and_config(tmp, model, spec_);
    json cursors = json::array();
    for (int r = 0; r < comm_.world(); ++r) {
      std::snprintf(cname, sizeof cname, "cursor.rank_%05d.json", r);
      const std::string text = read_json_text(tmp / cname, "data cursor", kMaxJsonBytes);
      cursors.push_back(json::parse(text));
      fs::remove(tmp / cname);
    }
    json ofiles = json::array();
    for (int r = 0; r < (spec_.shard_state ? comm_.world() : 1); ++r) ofiles.push_back(optimizer_file(r));
    const auto number_or_null = [](double v) { return std::isfinite(v) ? json(v) : json(nullptr); };
    write_json_file(tmp / "state.json", {{"step", step},
                                         {"loss", number_or_null(loss)},
                                         {"val_loss", number_or_null(val_loss)},
                                         {"data_cursor", cursors[0]},
                                         {"data_cursors", cursors},
                                         {"world", comm_.world()},
                                         {"shard_state", spec_.shard_state},
                                         {"optimizer_files", ofiles},
                                         {"seed", spec_.run.seed},
                                         {"rng", {{"dropout_key", "mix64(seed, step * 4096 + rank * accum + micro-batch)"}}},
                                         {"config_hash", spec_.config_hash},
                                         {"model", model.options().describe()},
                                         {"parameters", model.num_params()},
                                         {"vocab_size", model.options().vocab_size},
                                         {"optimizer", s_.optimizer}});
    fs::remove_all(final_dir);
    fs::rename(tmp, final_dir);
    write_file_atomic(root_ / "latest", step_name(step) + "\n");
    remove_old_checkpoints(step);
  }
  comm_.barrier();  // the checkpoint is complete for every rank
}

SafetensorsFile Checkpointer::read_optimizer_file(const fs::path& file) const {
  SafetensorsFile of;
  try {
    of = read_safetensors(file);
  } catch (const Error& e) {
    throw_input_error(file.string(), std::string("cannot read the optimizer state: ") + e.what());
  }
  require_finite(file, of.tensors, false);
  return of;
}

// The optimizer state of this rank's part of the `n` trainable parameters (its shard_of under
// ZeRO-1, all of them otherwise), cut from the checkpoint's files (the whole state, or one shard
// per old rank): each tensor of the state must hold one value per parameter of its file, in the
// parameters' order (adamw's moments), and this rank's tensor is the concatenation of the pieces
// of the files that overlap its part. Only the files that overlap are read (the first one also for
// an empty part: the names).
std::vector<NamedTensor> Checkpointer::resplit_optimizer_state(const fs::path& cdir, const CheckpointState& st, int64_t n,
                                                               const fs::path& state_file) const {
  const int world = comm_.world(), rank = comm_.rank();
  const Shard mine = spec_.shard_state ? shard_of(n, world, rank) : Shard{0, n};
  const std::string keep =
      "resume with " + std::to_string(st.world) + " rank(s) and optimizer.shard_state = " + (st.shard_state ? "true" : "false");
  std::vector<NamedTensor> out;
  bool named = false;
  std::string named_by;  // the file the names and dtypes came from
  for (std::size_t i = 0; i < st.optimizer_files.size(); ++i) {
    const Shard part = st.shard_state ? shard_of(n, st.world, int(i)) : Shard{0, n};
    const int64_t lo = std::max(part.offset, mine.offset), hi = std::min(part.offset + part.count, mine.offset + mine.count);
    if (lo >= hi && (named || mine.count > 0)) continue;
    const fs::path file = cdir / st.optimizer_files[i];
    const SafetensorsFile of = read_optimizer_file(file);
    const std::string whose = st.shard_state ? "the " + std::to_string(part.count) + " parameters of rank " + std::to_string(i) +
                                                   "'s shard of " + std::to_string(st.world)
                                             : "the model's " + std::to_string(n) + " trainable parameters";
    for (const NamedTensor& t : of.tensors) {
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      if (numel != part.count || t.bytes.size() != std::size_t(part.count) * dtype_size(t.dtype)) {
        throw_input_error(file.string(), "optimizer state tensor '" + t.name + "' holds " + std::to_string(numel) +
                                             " values, not one for each of " + whose + ": optimizer '" + st.optimizer +
                                             "' keeps state that cannot be cut at other shard boundaries, which resuming on " +
                                             "another world size or optimizer.shard_state needs; " + keep);
      }
    }
    if (!named) {
      for (const NamedTensor& t : of.tensors) {
        out.push_back({t.name, t.dtype, {mine.count}, std::vector<uint8_t>(std::size_t(mine.count) * dtype_size(t.dtype))});
      }
      named = true;
      named_by = st.optimizer_files[i];
    }
    const auto mismatch = [&](const std::string& what) {
      throw_input_error(file.string(),
                        what + " than " + named_by + ": the checkpoint's optimizer files do not belong together (" + keep + ")");
    };
    if (of.tensors.size() != out.size()) mismatch("holds other tensors");
    for (NamedTensor& o : out) {
      const auto found = std::find_if(of.tensors.begin(), of.tensors.end(), [&](const NamedTensor& t) { return t.name == o.name; });
      if (found == of.tensors.end() || found->dtype != o.dtype) mismatch("holds other tensors or dtypes");
      if (lo >= hi) continue;
      const std::size_t size = dtype_size(o.dtype);
      std::memcpy(o.bytes.data() + std::size_t(lo - mine.offset) * size, found->bytes.data() + std::size_t(lo - part.offset) * size,
                  std::size_t(hi - lo) * size);
    }
  }
  if (rank == 0) {
    spdlog::info("{}: optimizer state of {} file(s) ({}) re-cut for {} rank(s) ({})", state_file.string(), st.optimizer_files.size(),
                 st.shard_state ? "one shard per rank" : "whole", world, spec_.shard_state ? "one shard per rank" : "whole");
  }
  return out;
}

// Another optimizer's state (adamw_fused's on cuda, adamw's on the cpu: the same two moments) is
// taken when the config's optimizer accepts every tensor of it, else refused naming both.
void Checkpointer::load_optimizer_state(Optimizer& optimizer, const CheckpointState& st, const SafetensorsFile& of,
                                        const fs::path& state_file) const {
  if (st.optimizer == s_.optimizer) {
    optimizer.load_state(of.tensors);
    return;
  }
  try {
    optimizer.load_state(of.tensors);
  } catch (const Error& e) {
    throw_input_error(state_file.string(), "the checkpoint was written by optimizer '" + st.optimizer + "', the config selects '" +
                                               s_.optimizer + "', whose state differs: " + e.what());
  }
  spdlog::warn("{}: optimizer state written by '{}' taken by '{}' (the same state tensors)", state_file.string(), st.optimizer,
               s_.optimizer);
}

CheckpointState Checkpointer::resume(Model& model, Optimizer& optimizer, DataPipeline& data) {
  const fs::path cdir = resolve_checkpoint(s_.run_dir);
  const fs::path state_file = cdir / "state.json";
  const CheckpointState st = read_checkpoint_state(cdir);
  // The attention backend holds no weights: a checkpoint of naive_cuda's run resumes with naive_cpu.
  const auto weights_of = [](const std::string& described) {
    const std::size_t at = described.find(" attention=");
    if (at == std::string::npos) return described;
    const std::size_t end = described.find(' ', at + 1);
    return described.substr(0, at) + (end == std::string::npos ? std::string() : described.substr(end));
  };
  if (st.parameters != model.num_params() || weights_of(st.model) != weights_of(model.options().describe())) {
    throw_input_error(state_file.string(), "the checkpoint's model (" + st.model + ", " + std::to_string(st.parameters) +
                                               " parameters) does not match the config's (" + model.options().describe() + ", " +
                                               std::to_string(model.num_params()) + ")");
  }
  const int world = comm_.world(), rank = comm_.rank();
  const auto np = [](int n) { return std::to_string(n) + " rank(s)" + (n > 1 ? " (mpirun -np " + std::to_string(n) + ")" : ""); };
  // Another world size deals the documents anew from where the old ranks stood, which needs the
  // sampler's global sequence (Sampler::reshardable).
  if (st.world != world && !data.sampler().reshardable()) {
    throw_input_error(state_file.string(), "the checkpoint was written by a job of " + std::to_string(st.world) +
                                               " rank(s), this job has " + std::to_string(world) + ": sampler '" + spec_.sampler.name +
                                               "' deals no global sequence of documents (Sampler::reshardable), so its "
                                               "ranks' places in the data cannot be dealt to another world size; resume with " +
                                               np(st.world));
  }
  if (spec_.run.steps > 0 && st.step > spec_.run.steps) {
    throw_input_error(state_file.string(), "the checkpoint is at step " + std::to_string(st.step) + " but run.steps is " +
                                               std::to_string(spec_.run.steps) + ": nothing to resume (set run.steps to " +
                                               std::to_string(st.step) + " or more)");
  }
  const Split split = data.options().split;
  const uint64_t documents = data.source().size(split);
  for (std::size_t r = 0; r < st.cursors.size(); ++r) {
    for (const PendingPiece& p : st.cursors[r].pending) {
      if (p.document >= documents) {
        throw_input_error(state_file.string(), "data_cursors[" + std::to_string(r) + "] holds a piece of document " +
                                                   std::to_string(p.document) + ", but the data has " + std::to_string(documents) +
                                                   " training documents (0 to " + std::to_string(documents == 0 ? 0 : documents - 1) +
                                                   "): the checkpoint was written with other data");
      }
    }
  }
  check_cursor_draws(st, data, spec_.run.grad_accum_steps, state_file);
  // This rank's cursor: its own, or on another world size this rank's part of the old ranks' merged
  // cursors (every rank merges the same cursors alike).
  DataCursor cursor;
  if (st.world == world) {
    cursor = st.cursors[std::size_t(rank)];
  } else {
    const Sampler& sampler = data.sampler();
    const MergedCursors merged = merge_cursors(
        st.cursors, world, [&sampler](uint64_t draw, int r, int w) { return sampler.global_position(draw, r, w); },
        state_file.string());
    cursor = merged.cursor(rank);
    std::size_t pending = 0;
    for (const DataCursor& c : st.cursors) pending += c.pending.size();
    if (rank == 0) {
      spdlog::info("{}: the data cursors of {} rank(s) dealt to {}: every global position below {} was drawn and {} above it; "
                   "{} left over, dealt round-robin before the standard deal goes on from {}; {} pending piece(s) dealt "
                   "round-robin",
                   state_file.string(), st.world, world, merged.record.first, merged.record.drawn.size(),
                   leftover_count(merged.record), merged.record.end, pending);
    }
  }
  if (st.seed != spec_.run.seed) {
    spdlog::warn("{}: the checkpoint was written with run.seed {}, this run has {}: the data order and dropout after the "
                 "checkpoint are not the original run's",
                 state_file.string(), st.seed, spec_.run.seed);
  }
  if (st.config_hash != spec_.config_hash) {
    spdlog::warn("the config differs from the one the checkpoint was written with ({} vs {}): the continued run is "
                 "not the uninterrupted one",
                 spec_.config_hash, st.config_hash);
  }
  std::vector<float> values(std::size_t(model.num_params()));
  load_params(cdir / "model.safetensors", model.table(), values, false);
  model.load_params_from_host(values);
  restore_scaling_state(cdir, model, spec_);
  SafetensorsFile of;
  if (st.shard_state == spec_.shard_state && (!spec_.shard_state || st.world == world)) {
    // The file as it was written: the whole state, or this rank's shard of the same world.
    const fs::path ofile = cdir / st.optimizer_files[std::size_t(spec_.shard_state ? rank : 0)];
    of = read_optimizer_file(ofile);
  } else {
    of.tensors = resplit_optimizer_state(cdir, st, model.num_trainable(), state_file);
  }
  load_optimizer_state(optimizer, st, of, state_file);
  data.restore(cursor);
  spdlog::info("resuming {} from step {}", cdir.string(), st.step);
  return st;
}

}  // namespace ablate
