// `ablate train | eval | export | sample`: training runs and what is done with their checkpoints.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/layer_params.hpp"
#include "ablate/data_util.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/atomic_file.hpp"
#include "ablate/communicator.hpp"
#include "ablate/runtime/defaults.hpp"
#include "ablate/runtime/checkpoint.hpp"
#include "ablate/runtime/evaluation.hpp"
#include "ablate/runtime/hf_checkpoint.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/pipeline.hpp"
#include "ablate/runtime/safetensors.hpp"
#include "ablate/runtime/session.hpp"
#include "ablate/runtime/trainer.hpp"
#include "commands.hpp"
#include "json_read.hpp"
#include "report.hpp"

namespace ablate::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::atomic<bool> g_preempt{false};
void on_preempt_signal(int) { g_preempt.store(true); }

}  // namespace

// Exit code of a run stopped by SIGUSR1 (a scheduler's warning before preemption) after writing its
// checkpoint: EX_TEMPFAIL of sysexits.h, "try again": a job script requeues on it, and
// `ablate train ... --resume` continues.
constexpr int kExitPreempted = 75;

int cmd_train(const Args& args) {
  po::options_description desc("ablate train CONFIG [--set k=v ...] [--run-dir DIR] [--resume [DIR]] [--stop-at STEP]");
  po::positional_options_description pos;
  add_experiment_options(desc, pos);
  desc.add_options()("run-dir", po::value<std::string>(), "run directory (default: runs/<config name>)")(
      "resume", po::value<std::string>()->implicit_value("", "run dir")->value_name("DIR"),
      "continue from the latest checkpoint of the run directory (or of DIR)")(
      "stop-at", int_option("stop-at", 1, 1000000000000),
      "checkpoint and stop after this step (a planned interruption; --resume continues)");
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm, "ablate train CONFIG [--set k=v ...] [--run-dir DIR] [--resume [DIR]]")) return 0;
  Registry registry;
  const Config config = load_experiment(vm, registry);
  TrainOptions options;
  const fs::path config_path = vm["config"].as<std::string>();
  options.run_dir = fs::path("runs") / config_path.stem();
  if (vm.count("run-dir")) options.run_dir = vm["run-dir"].as<std::string>();
  if (vm.count("resume")) {
    options.resume = true;
    const std::string dir = vm["resume"].as<std::string>();
    if (!dir.empty()) {
      if (vm.count("run-dir") && fs::path(dir) != options.run_dir) {
        throw_input_error("--resume", "names " + dir + " but --run-dir names " + options.run_dir.string() + "; give one");
      }
      options.run_dir = dir;
    }
  }
  if (vm.count("stop-at")) {
    options.stop_at = vm["stop-at"].as<int64_t>();
  }
  // SIGUSR1 (Slurm's --signal=B:USR1@90 before a time limit or a preemption): a checkpoint after
  // the step under way, then exit 75.
  options.preempt = &g_preempt;
  ::signal(SIGUSR1, on_preempt_signal);
  const TrainResult result = train(config, registry, options);
  return result.preempted ? kExitPreempted : 0;
}

namespace {

// Progress of a long loop on stderr: a bar redrawn in place on a terminal, else (a log file) a
// line at every tenth of the work, so a long evaluation is never silent.
class Progress {
 public:
  Progress(std::string what, int64_t total) : what_(std::move(what)), total_(std::max<int64_t>(1, total)), tty_(::isatty(2) != 0) {}
  void update(int64_t done) {
    const int64_t tenth = done * 10 / total_;
    const auto now = std::chrono::steady_clock::now();
    if (tty_) {
      if (now - last_ < std::chrono::milliseconds(100) && done < total_) return;
      last_ = now;
      const int filled = int(done * 30 / total_);
      std::fprintf(stderr, "\r%s [%s%s] %lld/%lld", what_.c_str(), std::string(std::size_t(filled), '#').c_str(),
                   std::string(std::size_t(30 - filled), ' ').c_str(), static_cast<long long>(done), static_cast<long long>(total_));
      if (done >= total_) std::fputc('\n', stderr);
    } else if (tenth > reported_) {
      reported_ = tenth;
      std::fprintf(stderr, "%s: %lld/%lld (%lld%%)\n", what_.c_str(), static_cast<long long>(done), static_cast<long long>(total_),
                   static_cast<long long>(done * 100 / total_));
    }
    std::fflush(stderr);
  }

 private:
  std::string what_;
  int64_t total_;
  bool tty_;
  int64_t reported_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

Batch window_batch(const std::vector<int32_t>& tokens, int64_t first, int64_t rows, int64_t T) {
  Batch b;
  b.reset(int32_t(rows), int32_t(T));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = (first + r) * (T + 1);
    for (int64_t t = 0; t < T; ++t) {
      const std::size_t i = std::size_t(r * T + t);
      b.tokens[i] = tokens[std::size_t(base + t)];
      b.targets[i] = tokens[std::size_t(base + t + 1)];
      b.positions[i] = int32_t(t);
      b.segment_ids[i] = 1;
    }
    b.segments.push_back({0, int32_t(T)});
    b.row_segments[std::size_t(r + 1)] = int32_t(b.segments.size());
  }
  return b;
}

// Where a batch of windows whose loss is not finite first goes wrong: the first logit that is NaN or
// infinite (window, position, vocabulary entry), else the first position whose loss is not finite
// (every logit finite, their spread too wide for the softmax).
std::string first_nonfinite_position(Model& model, const Batch& b, int64_t first_window, int64_t T) {
  std::vector<float> losses, logits;
  model.forward(b, &losses, &logits);
  const int64_t positions = int64_t(losses.size());
  const int64_t width = positions > 0 ? int64_t(logits.size()) / positions : 0;
  const int64_t vocab = model.options().vocab_size;
  const auto place = [&](int64_t position) {
    return "window " + std::to_string(first_window + position / T) + ", position " + std::to_string(position % T) + " (shard token " +
           std::to_string((first_window + position / T) * (T + 1) + position % T) + ")";
  };
  for (int64_t i = 0; i < positions; ++i) {
    for (int64_t v = 0; v < std::min(width, vocab); ++v) {
      const float x = logits[std::size_t(i * width + v)];
      if (!std::isfinite(x)) {
        return "the first non-finite logit is at " + place(i) + ", vocabulary entry " + std::to_string(v) + " (" +
               (std::isnan(x) ? "nan"
                : x > 0       ? "inf"
                              : "-inf") +
               ")";
      }
    }
  }
  for (int64_t i = 0; i < positions; ++i) {
    if (!std::isfinite(losses[std::size_t(i)])) {
      return "every logit is finite; the first non-finite position loss is at " + place(i);
    }
  }
  return "no position's loss or logit is non-finite on its own; their sum overflows";
}

}  // namespace

// `ablate eval --eval LABEL`: the run's [[eval]] table of that label (enabled during training or
// not) scored on the checkpoint; its metrics printed, and with --details its per-item records.
static int eval_task(LoadedModel& lm, Registry& registry, const po::variables_map& vm) {
  RunContext run = lm.spec->context();
  run.threads = use_cpu_threads(vm.count("threads") ? int(vm["threads"].as<int64_t>()) : lm.spec->run.threads);
  const std::string label = vm["eval"].as<std::string>();
  const Session session(*lm.spec, registry, run);
  std::vector<EvalTask> tasks = session.evals(label, "--eval");
  auto source = session.data_source();
  auto single = session.one_process_communicator();
  ModelEvalView view(*lm.model, *source, *single, lm.spec->batch_size * lm.spec->seq_len);
  EvalTask& task = tasks.front();
  task.enabled = true;
  prepare_eval_tasks(tasks, view);
  const bool details = vm.count("details") > 0;
  if (details) check_output_file(vm["details"].as<std::string>(), "evaluation details");
  const EvalResult& r = run_eval_task(task, view, lm.state.step, nullptr, details);
  if (details) {
    std::string text;
    for (const std::string& line : r.details) text += line + "\n";
    write_file_atomic(vm["details"].as<std::string>(), text);
  }
  if (vm.count("json")) {
    json metrics = json::object();
    for (const EvalMetric& m : r.metrics) metrics[m.name] = std::isfinite(m.value) ? json(m.value) : json(nullptr);
    std::cout << json_text(json{{"eval", task.label},
                                {"evaluator", task.name},
                                {"primary", task.primary},
                                {"higher_is_better", task.higher_is_better},
                                {"metrics", metrics},
                                {"step", lm.state.step},
                                {"time_s", task.seconds},
                                {"checkpoint", lm.dir.string()}},
                           2)
              << "\n";
  } else {
    std::printf("%s (%s) at step %lld:", task.label.c_str(), task.name.c_str(), static_cast<long long>(lm.state.step));
    for (const EvalMetric& m : r.metrics) std::printf(" %s %.6g", m.name.c_str(), m.value);
    std::printf("\n");
  }
  return 0;
}

int cmd_eval(const Args& args) {
  const char* usage = "ablate eval --checkpoint DIR (--tokens SHARD.bin [--seq-len T] | --eval LABEL [--details FILE]) [--json]";
  po::options_description desc(usage);
  desc.add_options()("checkpoint", po::value<std::string>()->required(), "checkpoint or run directory")(
      "tokens", po::value<std::string>(), "llm.c-format token shard: its mean next-token loss")(
      "eval", po::value<std::string>()->value_name("LABEL"), "the run's [[eval]] of this label, enabled during training or not")(
      "details", po::value<std::string>()->value_name("FILE"), "with --eval: write each item's scores to FILE (JSON Lines)")(
      "set", po::value<std::vector<std::string>>()->composing()->value_name("eval.LABEL.KEY=VALUE"),
      "with --eval: change a key of the run's [[eval]] tables (another task file: eval.LABEL.path=FILE)")(
      "seq-len", int_option("seq-len", 1, 16777216), "window length T (default: the run's batching.seq_len)")(
      "batch", int_option("batch", 1, 65536)->default_value(8), "windows per forward pass")(
      "threads", int_option("threads", 0, 4096), "CPU threads (0 = every core; default: the run's run.threads)")("json", "print JSON")(
      "allow-nonfinite", "read a checkpoint whose weights hold NaN or inf, and report a loss that is not finite (forensics; warns)");
  po::variables_map vm;
  if (parse_or_help(args, desc, {}, vm, usage)) return 0;
  if (vm.count("tokens") == vm.count("eval")) {
    throw_input_error(vm.count("eval") ? "--eval" : "ablate eval",
                      vm.count("eval") ? "and --tokens both given: choose one" : "give --tokens SHARD.bin or --eval LABEL");
  }
  if (vm.count("details") && !vm.count("eval")) throw_input_error("--details", "needs --eval LABEL");
  // Only the evaluations may change: the model and its data are the checkpoint's.
  const std::vector<std::string> sets = vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>();
  for (const std::string& set : sets) {
    if (set.rfind("eval.", 0) != 0 || !vm.count("eval")) {
      throw_input_error("--set " + set, "ablate eval changes only the run's [[eval]] keys, with --eval (eval.LABEL.KEY=VALUE); "
                                        "the model and data are the checkpoint's");
    }
  }
  Registry registry;
  registry.load_directories(Registry::default_search_path());
  LoadedModel lm = load_model(vm["checkpoint"].as<std::string>(), registry, vm.count("allow-nonfinite") > 0, sets);
  if (vm.count("eval")) return eval_task(lm, registry, vm);
  const int threads = use_cpu_threads(vm.count("threads") ? int(vm["threads"].as<int64_t>()) : lm.spec->run.threads);
  const int64_t T = vm.count("seq-len") ? vm["seq-len"].as<int64_t>() : lm.spec->seq_len;
  if (T < 1 || T > lm.model->options().max_seq_len) {
    throw_input_error("--seq-len", std::to_string(T) + " is outside 1.." + std::to_string(lm.model->options().max_seq_len));
  }
  const std::vector<int32_t> tokens = read_token_shard(vm["tokens"].as<std::string>());
  for (int32_t t : tokens) {
    if (t >= lm.model->options().vocab_size) {
      throw_input_error(vm["tokens"].as<std::string>(), "token " + std::to_string(t) + " is outside the model's vocabulary of " +
                                                            std::to_string(lm.model->options().vocab_size));
    }
  }
  const int64_t windows = int64_t(tokens.size()) / (T + 1);
  if (windows == 0) {
    throw_input_error(vm["tokens"].as<std::string>(),
                      "holds " + std::to_string(tokens.size()) + " tokens, fewer than one window of " + std::to_string(T + 1));
  }
  // No more rows than windows; and the rows' activations (logits included) within the memory budget.
  const int64_t per = std::min(vm["batch"].as<int64_t>(), windows);
  if (per * T > kMaxBatchPositions) {
    throw_input_error("--batch", std::to_string(per) + " windows of " + std::to_string(T) + " tokens are " + std::to_string(per * T) +
                                     " positions per forward pass; expected at most " + std::to_string(kMaxBatchPositions));
  }
  const int64_t budget = lm.spec->memory_budget_bytes();
  const auto need = [&](int64_t rows) { return lm.model->activation_bytes(rows, T) + rows * T * 16; };
  if (budget > 0 && need(per) > budget) {
    int64_t fits = per;
    while (fits > 1 && need(fits) > budget) fits /= 2;
    throw_input_error("--batch", std::to_string(per) + " windows of " + std::to_string(T) + " tokens need " +
                                     std::to_string(need(per) >> 20) + " MiB of activations, more than the " +
                                     std::to_string(budget >> 20) + " MiB budget; --batch " + std::to_string(fits) + " fits");
  }
  double sum = 0;
  int64_t count = 0;
  const bool allow_nonfinite = vm.count("allow-nonfinite") > 0;
  spdlog::info("eval: {} windows of {} tokens, {} per forward pass, {} thread(s)", windows, T, per, threads);
  Progress progress("eval", windows);
  for (int64_t w = 0; w < windows; w += per) {
    const int64_t rows = std::min(per, windows - w);
    const Batch b = window_batch(tokens, w, rows, T);
    const double part = lm.model->forward(b);
    // The first batch whose loss is not finite is located once (a second forward pass keeping the
    // logits): refused, or with --allow-nonfinite warned about and the rest summed as they are.
    if (!std::isfinite(part) && std::isfinite(sum)) {
      const std::string where = first_nonfinite_position(*lm.model, b, w, T);
      if (!allow_nonfinite) {
        throw_input_error(lm.dir.string(),
                          "the evaluation loss is not finite: " + where +
                              " (the weights overflow in the forward pass; --allow-nonfinite reports the loss anyway)");
      }
      spdlog::warn("eval: the loss is not finite: {} (reported anyway: --allow-nonfinite)", where);
    }
    sum += part;
    count += rows * T;
    progress.update(w + rows);
  }
  const double loss = sum / double(count);
  if (vm.count("json")) {
    std::cout << json_text(
                     json{{"loss", loss}, {"tokens", count}, {"windows", windows}, {"seq_len", T}, {"checkpoint", lm.dir.string()}}, 2)
              << "\n";
  } else {
    std::printf("loss %.6f over %lld tokens (%lld windows of %lld), perplexity %.3f\n", loss, static_cast<long long>(count),
                static_cast<long long>(windows), static_cast<long long>(T), std::exp(loss));
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Export to a Hugging Face transformers directory.

namespace {

struct Exporter {
  const Model& model;
  const std::vector<float>& data;
  SafetensorsFile out;

  const ParamSlice& slice(const std::string& name) const {
    const ParamSlice* s = model.table().find(name);
    if (s == nullptr) throw_runtime_error("export", "the model has no parameter '" + name + "'");
    return *s;
  }
  bool has(const std::string& name) const { return model.table().find(name) != nullptr; }
  // Rows [0, rows) of a (rows_total, cols) parameter, optionally transposed (Conv1D layout).
  void put(const std::string& hf, const std::vector<std::string>& ours, bool transpose = false, int64_t rows = -1) {
    std::vector<float> rows_cat;
    int64_t cols = 0, total_rows = 0;
    for (const std::string& name : ours) {
      const ParamSlice& s = slice(name);
      cols = s.shape.size() == 2 ? s.shape[1] : 1;
      const int64_t r = rows >= 0 ? rows : s.shape[0];
      rows_cat.insert(rows_cat.end(), data.begin() + s.offset, data.begin() + s.offset + r * cols);
      total_rows += r;
    }
    NamedTensor t;
    t.name = hf;
    t.dtype = DType::f32;
    const bool vector = slice(ours[0]).shape.size() == 1;
    std::vector<float> v = rows_cat;
    if (vector) {
      t.shape = {total_rows};
    } else if (transpose) {
      t.shape = {cols, total_rows};
      for (int64_t i = 0; i < total_rows; ++i)
        for (int64_t j = 0; j < cols; ++j) v[std::size_t(j * total_rows + i)] = rows_cat[std::size_t(i * cols + j)];
    } else {
      t.shape = {total_rows, cols};
    }
    t.bytes.resize(v.size() * 4);
    std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
    out.tensors.push_back(std::move(t));
  }
  // Every tensor of the name table (hf_tensors), zeros for a GPT-2 bias the model has not.
  void put_all(const std::vector<HfTensor>& tensors) {
    for (const HfTensor& t : tensors) {
      if (t.zeros > 0 && !has(t.ours[0])) zeros(t.hf, t.zeros);
      else put(t.hf, t.ours, t.transpose, t.rows);
    }
  }
  void zeros(const std::string& hf, int64_t n) {
    NamedTensor t;
    t.name = hf;
    t.shape = {n};
    t.bytes.assign(std::size_t(n) * 4, 0);
    out.tensors.push_back(std::move(t));
  }
};

}  // namespace

// The run's end-of-document token as config.json's bos and eos ids, and the directory of its GPT-2
// tokenizer files (empty when it has none): both from the data source, which may be gone (shards on
// another machine): then the ids stay null and export says so.
static fs::path describe_tokens(const RunSpec& spec, Registry& registry, json& cfg, bool with_tokenizer) {
  std::shared_ptr<DataSource> source;
  try {
    source = Session(spec, registry, RunContext{}).data_source();
  } catch (const Error& e) {
    if (with_tokenizer) {
      // Moved or damaged data, or tokenizer files that do not belong together (the source checks
      // vocab.bpe against encoder.json as it opens them).
      throw_input_error("export", std::string("cannot open the run's data source, which holds its tokenizer and end-of-text id (") +
                                      e.what() + "); repair or reach its files, or pass --no-tokenizer to export the weights alone");
    }
    spdlog::warn("export --no-tokenizer: the run's data source cannot be opened here ({}); config.json has no bos/eos ids", e.what());
    return {};
  }
  if (source->eot_token() >= 0) cfg["bos_token_id"] = cfg["eos_token_id"] = source->eot_token();
  const fs::path dir = source->gpt2_tokenizer_dir();
  if (dir.empty() || !with_tokenizer) return {};
  if (!fs::is_regular_file(dir / "encoder.json") || !fs::is_regular_file(dir / "vocab.bpe")) {
    throw_input_error(dir.string(), "has no encoder.json and vocab.bpe: Hugging Face's GPT-2 tokenizer needs both (the "
                                    "merges); add them, or pass --no-tokenizer to export the weights alone");
  }
  return dir;
}

// `out` must not be (or lie inside) the run's checkpoints: a checkpoint's files would be
// overwritten, or removed with it when the run's retention drops that checkpoint.
static void require_export_target(const fs::path& out, const fs::path& checkpoint_dir) {
  check_output_directory(out, "the export directory");
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(fs::absolute(out), ec);
  const fs::path ckpt = fs::weakly_canonical(checkpoint_dir, ec);
  const fs::path root = ckpt.parent_path().filename() == "checkpoints" ? ckpt.parent_path() : ckpt;
  const auto inside = [](const fs::path& p, const fs::path& dir) {
    const auto [d, q] = std::mismatch(dir.begin(), dir.end(), p.begin(), p.end());
    return d == dir.end();
  };
  if (!ec && inside(target, root)) {
    throw_input_error("--out", out.string() + " is inside " + root.string() +
                                   ", where the run keeps its checkpoints: export to a directory outside it");
  }
}

// GPT-2's tokenizer as transformers' GPT2Tokenizer reads it: vocab.json and merges.txt are the
// encoder.json and vocab.bpe the shards were made with; <|endoftext|> begins and ends documents.
static void write_gpt2_tokenizer(const fs::path& from, int64_t max_len, const fs::path& out) {
  const std::string encoder = read_regular_file(from / "encoder.json", "GPT-2 tokenizer file", kMaxTokenizerBytes);
  const std::string merges = read_regular_file(from / "vocab.bpe", "GPT-2 tokenizer file", kMaxTokenizerBytes);
  write_file_atomic(out / "vocab.json", encoder);
  write_file_atomic(out / "merges.txt", merges);
  const json special = {{"bos_token", "<|endoftext|>"}, {"eos_token", "<|endoftext|>"}, {"unk_token", "<|endoftext|>"}};
  json config = special;
  config["tokenizer_class"] = "GPT2Tokenizer";
  config["model_max_length"] = max_len;
  config["add_prefix_space"] = false;
  write_file_atomic(out / "tokenizer_config.json", config.dump(2) + "\n");
  write_file_atomic(out / "special_tokens_map.json", special.dump(2) + "\n");
  spdlog::info("export: GPT-2 tokenizer from {} written beside the weights", from.string());
}

// GPT2LMHeadModel: the tensors (Conv1D matrices transposed, q/k/v joined as c_attn; zeros for the
// biases of a model without them) and config.json.
json export_gpt2(Exporter& ex, const ModelOptions& o) {
  const int64_t V = o.vocab_size, L = o.n_layers;
  json cfg;
  ex.put_all(hf_tensors("gpt2", o));
  cfg = {{"architectures", {"GPT2LMHeadModel"}},
         {"model_type", "gpt2"},
         {"vocab_size", V},
         {"n_positions", o.max_seq_len},
         {"n_ctx", o.max_seq_len},
         {"n_embd", o.d_model},
         {"n_layer", L},
         {"n_head", o.n_heads},
         {"n_inner", o.mlp_hidden},
         {"activation_function", "gelu_new"},
         {"layer_norm_epsilon", o.norm_epsilon()},
         {"resid_pdrop", 0.0},
         {"embd_pdrop", 0.0},
         {"attn_pdrop", 0.0},
         {"scale_attn_weights", true},
         {"tie_word_embeddings", o.tie_embeddings},
         {"bos_token_id", nullptr},
         {"eos_token_id", nullptr},
         {"torch_dtype", "float32"}};
  return cfg;
}

// LlamaForCausalLM, or Qwen3ForCausalLM for a model with qk_norm: the tensors and config.json.
json export_llama(Exporter& ex, const ModelOptions& o) {
  const int64_t V = o.vocab_size, L = o.n_layers;
  const auto rope = o.layer_own.find(o.position);  // [model.rope] theta
  const double theta = layer_params::read_rope_theta(rope != o.layer_own.end() ? rope->second : Params{});
  json cfg;
  ex.put_all(hf_tensors("llama", o));
  cfg = {{"architectures", {o.qk_norm ? "Qwen3ForCausalLM" : "LlamaForCausalLM"}},
         {"model_type", o.qk_norm ? "qwen3" : "llama"},
         {"vocab_size", V},
         {"hidden_size", o.d_model},
         {"intermediate_size", o.mlp_hidden},
         {"num_hidden_layers", L},
         {"num_attention_heads", o.n_heads},
         {"num_key_value_heads", o.n_kv_heads},
         {"head_dim", o.head_dim},
         {"max_position_embeddings", o.max_seq_len},
         {"rms_norm_eps", o.norm_epsilon()},
         {"rope_theta", theta},
         {"hidden_act", "silu"},
         {"attention_bias", o.bias},
         {"mlp_bias", o.bias},
         {"attention_dropout", 0.0},
         {"tie_word_embeddings", o.tie_embeddings},
         {"bos_token_id", nullptr},
         {"eos_token_id", nullptr},
         {"torch_dtype", "float32"}};
  return cfg;
}

// ---------------------------------------------------------------------------------------------
// Adapters: merged into the weights (--format hf --merge), or written for PEFT (--format peft).

namespace {

// The adapted projections of a LoRA run: each lora_A (rank, in) and lora_B (out, rank) slice with
// the weight (out, in) it adapts.
struct LoraSite {
  int64_t block = 0;
  std::string target;  // q, k, v, o
  const ParamSlice *a = nullptr, *b = nullptr, *weight = nullptr;
};

std::vector<LoraSite> lora_sites(const Model& model) {
  std::vector<LoraSite> out;
  const ParamTable& t = model.table();
  for (const ParamSlice& s : t.slices) {
    const std::string suffix = ".lora_A";
    if (s.name.size() <= suffix.size() || s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    const std::string prefix = s.name.substr(0, s.name.size() - suffix.size());  // blocks.L.attn.q
    LoraSite site;
    site.a = &s;
    site.b = t.find(prefix + ".lora_B");
    site.weight = t.find(prefix + ".weight");
    if (site.b == nullptr || site.weight == nullptr) throw_runtime_error("export", "adapter '" + prefix + "' is incomplete");
    const std::size_t dot = prefix.rfind('.');
    site.target = prefix.substr(dot + 1);
    site.block = std::stoll(prefix.substr(std::string("blocks.").size(), prefix.find('.', 7) - 7));
    out.push_back(site);
  }
  return out;
}

// W += scale * B A for every adapted projection (what PEFT's merge_and_unload computes).
void merge_lora(const Model& model, std::vector<float>& values) {
  const ModelOptions& o = model.options();
  const layer_params::LoraKeys k = layer_params::read_lora_keys(o.adapter_own);
  const double scale = k.alpha / double(k.rank);
  for (const LoraSite& s : lora_sites(model)) {
    const int64_t r = s.a->shape[0], in = s.a->shape[1], out = s.b->shape[0];
    const float* A = values.data() + s.a->offset;
    const float* B = values.data() + s.b->offset;
    float* W = values.data() + s.weight->offset;
    for (int64_t i = 0; i < out; ++i) {
      for (int64_t j = 0; j < in; ++j) {
        double d = 0.0;
        for (int64_t k = 0; k < r; ++k) d += double(B[i * r + k]) * double(A[k * in + j]);
        W[i * in + j] = float(double(W[i * in + j]) + scale * d);
      }
    }
  }
}

NamedTensor f32_tensor(std::string name, std::vector<int64_t> shape, const std::vector<float>& v) {
  NamedTensor t;
  t.name = std::move(name);
  t.dtype = DType::f32;
  t.shape = std::move(shape);
  t.bytes.resize(v.size() * 4);
  std::memcpy(t.bytes.data(), v.data(), t.bytes.size());
  return t;
}

std::vector<float> rows_of(const std::vector<float>& values, const ParamSlice& s) {
  return {values.begin() + s.offset, values.begin() + s.offset + s.numel()};
}

// PEFT's adapter_config.json and adapter_model.safetensors. Llama/Qwen3: one adapter per
// projection (q_proj, k_proj, v_proj, o_proj), as trained. GPT-2 keeps q, k and v in one Conv1D
// (c_attn): its adapter is the trained ones side by side, A = [A_q; A_k; A_v] (m r, C) and B
// block-diagonal (3C, m r) for the m adapted ones, the same function; every adapter is padded with
// zeros to PEFT's one rank R = m r and alpha scaled to alpha R / r, so each keeps its scale.
std::pair<json, SafetensorsFile> peft_adapter(const Model& model, const std::vector<float>& values, bool gpt2,
                                              const std::string& base) {
  const ModelOptions& o = model.options();
  const layer_params::LoraKeys k = layer_params::read_lora_keys(o.adapter_own);
  const int64_t r = k.rank, C = o.d_model;
  SafetensorsFile f;
  f.metadata["format"] = "pt";
  const std::vector<LoraSite> sites = lora_sites(model);
  int64_t R = r;
  std::vector<std::string> modules;
  std::string pattern;
  if (!gpt2) {
    for (const LoraSite& s : sites) {
      const std::string h = "base_model.model.model.layers." + std::to_string(s.block) + ".self_attn." + s.target + "_proj";
      f.tensors.push_back(f32_tensor(h + ".lora_A.weight", s.a->shape, rows_of(values, *s.a)));
      f.tensors.push_back(f32_tensor(h + ".lora_B.weight", s.b->shape, rows_of(values, *s.b)));
      const std::string m = s.target + "_proj";
      if (std::find(modules.begin(), modules.end(), m) == modules.end()) modules.push_back(m);
    }
  } else {
    int64_t m = 0;
    for (const std::string& t : o.adapter_targets) m += t != "o" ? 1 : 0;
    R = std::max<int64_t>(m, 1) * r;
    for (int64_t l = 0; l < o.n_layers; ++l) {
      const std::string h = "base_model.model.transformer.h." + std::to_string(l) + ".attn.";
      std::vector<float> A(std::size_t(R * C), 0.0f), B(std::size_t(3 * C * R), 0.0f);
      int64_t slot = 0;
      bool qkv = false;
      for (const char* t : {"q", "k", "v"}) {
        const auto it = std::find_if(sites.begin(), sites.end(), [&](const LoraSite& s) { return s.block == l && s.target == t; });
        const int64_t part = std::string(t) == "q" ? 0 : std::string(t) == "k" ? 1 : 2;
        if (it == sites.end()) continue;
        qkv = true;
        for (int64_t k = 0; k < r; ++k)
          for (int64_t j = 0; j < C; ++j) A[std::size_t((slot * r + k) * C + j)] = values[std::size_t(it->a->offset + k * C + j)];
        for (int64_t i = 0; i < C; ++i)
          for (int64_t k = 0; k < r; ++k)
            B[std::size_t((part * C + i) * R + slot * r + k)] = values[std::size_t(it->b->offset + i * r + k)];
        ++slot;
      }
      if (qkv) {
        f.tensors.push_back(f32_tensor(h + "c_attn.lora_A.weight", {R, C}, A));
        f.tensors.push_back(f32_tensor(h + "c_attn.lora_B.weight", {3 * C, R}, B));
      }
      const auto o_site = std::find_if(sites.begin(), sites.end(), [&](const LoraSite& s) { return s.block == l && s.target == "o"; });
      if (o_site != sites.end()) {
        std::vector<float> Ao(std::size_t(R * C), 0.0f), Bo(std::size_t(C * R), 0.0f);
        std::copy_n(values.begin() + o_site->a->offset, r * C, Ao.begin());
        for (int64_t i = 0; i < C; ++i)
          for (int64_t k = 0; k < r; ++k) Bo[std::size_t(i * R + k)] = values[std::size_t(o_site->b->offset + i * r + k)];
        f.tensors.push_back(f32_tensor(h + "c_proj.lora_A.weight", {R, C}, Ao));
        f.tensors.push_back(f32_tensor(h + "c_proj.lora_B.weight", {C, R}, Bo));
      }
    }
    // The attention's c_proj, not the MLP's (which has the same name).
    std::string alts;
    if (m > 0) alts = "c_attn";
    if (std::find(o.adapter_targets.begin(), o.adapter_targets.end(), "o") != o.adapter_targets.end())
      alts += alts.empty() ? "c_proj" : "|c_proj";
    pattern = ".*\\.attn\\.(" + alts + ")";
  }
  json cfg = {{"peft_type", "LORA"},
              {"task_type", "CAUSAL_LM"},
              {"r", R},
              {"lora_alpha", k.alpha * double(R) / double(r)},
              {"lora_dropout", k.dropout},
              {"bias", "none"},
              {"fan_in_fan_out", gpt2},
              {"use_rslora", false},
              {"init_lora_weights", true},
              {"inference_mode", true},
              {"modules_to_save", nullptr},
              {"base_model_name_or_path", base.empty() ? json(nullptr) : json(base)}};
  if (gpt2) cfg["target_modules"] = pattern;
  else cfg["target_modules"] = modules;
  return {cfg, std::move(f)};
}

}  // namespace

int cmd_export(const Args& args) {
  const char* usage = "ablate export --checkpoint DIR --format hf|peft --out DIR [--merge]";
  po::options_description desc(usage);
  desc.add_options()("checkpoint", po::value<std::string>()->required(), "checkpoint or run directory")(
      "format", po::value<std::string>()->default_value("hf"),
      "hf (Hugging Face transformers), or peft (a LoRA run's adapters alone, for PEFT to load onto the base model)")(
      "merge", "hf: fold a LoRA run's adapters into the weights they adapt (W + alpha/rank B A)")(
      "out", po::value<std::string>()->required(), "output directory")(
      "no-tokenizer", "export the weights alone, without the run's tokenizer files (also when its data is not reachable)");
  po::variables_map vm;
  if (parse_or_help(args, desc, {}, vm, usage)) return 0;
  const std::string format = vm["format"].as<std::string>();
  if (format != "hf" && format != "peft") throw_input_error("--format", "'" + format + "': expected hf or peft");
  const bool merge = vm.count("merge") > 0;
  if (merge && format != "hf") throw_input_error("--merge", "goes with --format hf (peft writes the adapters themselves)");
  Registry registry;
  registry.load_directories(Registry::default_search_path());
  LoadedModel lm = load_model(vm["checkpoint"].as<std::string>(), registry);
  const fs::path out = vm["out"].as<std::string>();
  require_export_target(out, lm.dir);
  const ModelOptions& o = lm.model->options();
  if (o.adapter.empty() && (merge || format == "peft")) {
    throw_input_error(merge ? "--merge" : "--format", lm.dir.string() + " was trained without an [adapter]: there is " +
                                                          (merge ? "nothing to merge" : "no adapter to write") +
                                                          "; export it with --format hf");
  }
  if (!o.adapter.empty() && format == "hf" && !merge) {
    throw_input_error("--format", lm.dir.string() + " trained " + o.adapter +
                                      " adapters on a frozen base: --format hf --merge "
                                      "folds them into the weights, --format peft writes them alone");
  }
  std::vector<float> values;
  lm.model->copy_params_to_host(values);
  // The Hugging Face families have the built-in embedding, projections and classifier (and, for
  // Qwen3's qk-norm, rmsnorm): a model with a plugin's in their place has no family to go to.
  const bool builtin = o.embedding == defaults::embedding && o.linear == defaults::linear && o.classifier == defaults::classifier &&
                       (!o.qk_norm || o.qk_norm_layer == defaults::qk_norm_layer);
  const bool gpt2 =
      builtin && o.norm == "layernorm" && o.mlp == "gelu_mlp" && o.position == "learned" && !o.qk_norm && o.n_kv_heads == o.n_heads;
  const bool llama = builtin && o.norm == "rmsnorm" && o.mlp == "swiglu_mlp" && o.position == "rope";
  if (format == "peft" && (gpt2 || llama)) {
    auto [cfg, file] = peft_adapter(*lm.model, values, gpt2, lm.spec->model.init_from);
    fs::create_directories(out);
    write_safetensors(out / "adapter_model.safetensors", file);
    write_file_atomic(out / "adapter_config.json", cfg.dump(2) + "\n");
    spdlog::info("exported {}'s adapters ({} tensors, PEFT rank {}) to {}", lm.dir.string(), file.tensors.size(),
                 cfg["r"].get<int64_t>(), out.string());
    return 0;
  }
  if (merge) merge_lora(*lm.model, values);
  Exporter ex{*lm.model, values, {}};
  json cfg;
  if (gpt2) {
    cfg = export_gpt2(ex, o);
  } else if (llama) {
    cfg = export_llama(ex, o);
  } else {
    throw_input_error(lm.dir.string(), "this model (" + o.describe() +
                                           ") is neither GPT-2-shaped (layernorm, gelu_mlp, learned positions, no GQA or "
                                           "qk_norm) nor Llama/Qwen3-shaped (rmsnorm, swiglu_mlp, rope), each with the "
                                           "built-in embedding_layer, projection_layer and classifier_layer (its are " +
                                           o.embedding + ", " + o.linear + ", " + o.classifier +
                                           "): no Hugging Face architecture loads it as it is");
  }
  const fs::path tokenizer = describe_tokens(*lm.spec, registry, cfg, vm.count("no-tokenizer") == 0);
  fs::create_directories(out);
  ex.out.metadata["format"] = "pt";
  write_safetensors(out / "model.safetensors", ex.out);
  write_file_atomic(out / "config.json", cfg.dump(2) + "\n");
  if (!tokenizer.empty()) write_gpt2_tokenizer(tokenizer, o.max_seq_len, out);
  spdlog::info("exported {} ({}, {} tensors) to {}", lm.dir.string(), cfg["architectures"][0].get<std::string>(),
               ex.out.tensors.size(), out.string());
  return 0;
}

// ---------------------------------------------------------------------------------------------

int cmd_sample(const Args& args) {
  po::options_description desc("ablate sample --checkpoint DIR --prompt TEXT [--tokens N] [--top-k K] [--temperature X]");
  desc.add_options()("checkpoint", po::value<std::string>()->required(), "checkpoint or run directory")(
      "prompt", po::value<std::string>()->default_value(""), "text in the data source's text form (empty: start a document)")(
      "tokens", int_option("tokens", 0, 16777216)->default_value(64), "tokens to generate")(
      "top-k", int_option("top-k", 0, 2147483647)->default_value(0), "sample among the K most likely tokens (0 = all)")(
      "temperature", float_option("temperature", 0.0, 1e6)->default_value(1.0),
      "softmax temperature (0 = greedy)")("seed", int_option("seed", 0, INT64_MAX)->default_value(0), "sampling seed")(
      "stop-at-eot", po::value<bool>()->default_value(true, "on")->implicit_value(true, "on")->value_name("on|off"),
      "stop at the end-of-document token (--stop-at-eot=off: generate all --tokens)")(
      "allow-nonfinite", "read a checkpoint whose weights hold NaN or inf (forensics; warns)");
  po::variables_map vm;
  if (parse_or_help(args, desc, {}, vm, "ablate sample --checkpoint DIR --prompt TEXT [--tokens N] [--top-k K] [--temperature X]"))
    return 0;
  const double temperature = vm["temperature"].as<double>();
  Registry registry;
  registry.load_directories(Registry::default_search_path());
  LoadedModel lm = load_model(vm["checkpoint"].as<std::string>(), registry, vm.count("allow-nonfinite") > 0);
  auto source = Session(*lm.spec, registry, RunContext{}).data_source();
  std::vector<int32_t> ctx = source->encode(vm["prompt"].as<std::string>());
  const bool from_start = ctx.empty();
  if (ctx.empty() && source->eot_token() >= 0) ctx.push_back(source->eot_token());
  if (ctx.empty()) throw_input_error("--prompt", "is empty and the data source has no end-of-document token to start from");
  const std::size_t prompt_len = ctx.size();
  const ModelOptions& o = lm.model->options();
  std::mt19937_64 rng(uint64_t(vm["seed"].as<int64_t>()));
  std::vector<float> logits;
  const int64_t k = vm["top-k"].as<int64_t>();
  for (int64_t n = 0; n < vm["tokens"].as<int64_t>(); ++n) {
    const int64_t start = std::max<int64_t>(0, int64_t(ctx.size()) - o.max_seq_len);
    const int64_t T = int64_t(ctx.size()) - start;
    Batch b;
    b.reset(1, int32_t(T));
    for (int64_t t = 0; t < T; ++t) {
      b.tokens[std::size_t(t)] = ctx[std::size_t(start + t)];
      b.positions[std::size_t(t)] = int32_t(t);
      b.segment_ids[std::size_t(t)] = 1;
    }
    b.segments.push_back({0, int32_t(T)});
    b.row_segments[1] = 1;
    lm.model->forward(b, nullptr, &logits);
    const float* last = logits.data() + (T - 1) * o.vocab_padded;
    std::vector<int32_t> ids(std::size_t(o.vocab_size));
    for (int32_t i = 0; i < int32_t(ids.size()); ++i) ids[std::size_t(i)] = i;
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t c) { return last[a] > last[c] || (last[a] == last[c] && a < c); });
    int32_t next = ids[0];
    if (temperature > 0) {
      const std::size_t keep = k > 0 ? std::min<std::size_t>(std::size_t(k), ids.size()) : ids.size();
      std::vector<double> w(keep);
      for (std::size_t i = 0; i < keep; ++i) w[i] = std::exp((double(last[ids[i]]) - double(last[ids[0]])) / temperature);
      std::discrete_distribution<std::size_t> pick(w.begin(), w.end());
      next = ids[pick(rng)];
    }
    ctx.push_back(next);
    if (next == source->eot_token() && vm["stop-at-eot"].as<bool>()) break;
  }
  // Prompt and continuation decoded as one sequence: sources that speak token ids separate every id
  // (the prompt's last and the first generated must not run together), text sources join bytes.
  const std::vector<int32_t> shown(ctx.begin() + (from_start ? std::ptrdiff_t(prompt_len) : 0), ctx.end());
  std::cout << source->decode(shown) << "\n";
  return 0;
}

}  // namespace ablate::cli
