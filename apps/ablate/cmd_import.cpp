// `ablate import hf DIR --run-dir OUT`: a Hugging Face checkpoint directory (GPT-2, Llama, Qwen3)
// as an ablate run directory whose checkpoint (step 0) `ablate eval`, `sample`, `export` and
// `[model] init_from` read. Its experiment is the checkpoint's [model] (from config.json) on
// ablate's defaults, or on --config's experiment; --set overrides either (not the [model] keys the
// checkpoint fixes). A SentencePiece model beside the weights (tokenizer.model) is kept as
// tokenizer/tokenizer.model; else GPT-2 BPE tokenizer files (vocab.json + merges.txt, or
// tokenizer.json's BPE model) as tokenizer/encoder.json + tokenizer/vocab.bpe.
#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/atomic_file.hpp"
#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/runtime/checkpoint.hpp"
#include "ablate/runtime/hf_checkpoint.hpp"
#include "ablate/runtime/session.hpp"
#include "ablate/runtime/trainer.hpp"
#include "commands.hpp"
#include "json_read.hpp"

namespace ablate::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr std::uintmax_t kMaxTokenizerBytes = std::uintmax_t(256) << 20;

// tokenizer.json's BPE model as GPT-2's two files; false when it has none (another tokenizer type).
bool tokenizer_json_to_gpt2(const fs::path& file, json& encoder, std::string& merges) {
  const std::string text = read_json_text(file, "tokenizer", kMaxTokenizerBytes);
  const json j = json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object() || j["model"].value("type", "") != "BPE") return false;
  const json& m = j["model"];
  if (!m.contains("vocab") || !m["vocab"].is_object() || !m.contains("merges") || !m["merges"].is_array()) {
    throw_input_error(file.string(), "a BPE model without its 'vocab' object and 'merges' list");
  }
  encoder = m["vocab"];
  merges = "#version: 0.2\n";
  for (const json& pair : m["merges"]) {
    if (pair.is_string()) merges += pair.get<std::string>() + "\n";  // "a b"
    else if (pair.is_array() && pair.size() == 2 && pair[0].is_string() && pair[1].is_string()) {
      merges += pair[0].get<std::string>() + " " + pair[1].get<std::string>() + "\n";  // ["a", "b"]
    } else {
      throw_input_error(file.string(), "model.merges holds " + echo_value(pair.dump()) + ", expected \"a b\" or [\"a\", \"b\"]");
    }
  }
  return true;
}

// The checkpoint's tokenizer into <run>/tokenizer: a SentencePiece model (Llama-style
// tokenizer.model) as it is, or GPT-2's BPE files; returns what was kept ("" for nothing).
std::string keep_tokenizer(const fs::path& hf, const fs::path& run_dir) {
  const fs::path out = run_dir / "tokenizer";
  if (fs::is_regular_file(hf / "tokenizer.model")) {
    fs::create_directories(out);
    write_file_atomic(out / "tokenizer.model", read_regular_file(hf / "tokenizer.model", "SentencePiece model", kMaxTokenizerBytes));
    return "tokenizer.model (SentencePiece)";
  }
  if (fs::is_regular_file(hf / "vocab.json") && fs::is_regular_file(hf / "merges.txt")) {
    fs::create_directories(out);
    write_file_atomic(out / "encoder.json", read_regular_file(hf / "vocab.json", "tokenizer vocabulary", kMaxTokenizerBytes));
    write_file_atomic(out / "vocab.bpe", read_regular_file(hf / "merges.txt", "tokenizer merges", kMaxTokenizerBytes));
    return "vocab.json + merges.txt";
  }
  if (fs::is_regular_file(hf / "tokenizer.json")) {
    json encoder;
    std::string merges;
    if (tokenizer_json_to_gpt2(hf / "tokenizer.json", encoder, merges)) {
      fs::create_directories(out);
      write_file_atomic(out / "encoder.json", json_text(encoder, -1) + "\n");
      write_file_atomic(out / "vocab.bpe", merges);
      return "tokenizer.json (BPE)";
    }
    spdlog::warn("{}: tokenizer.json is not a BPE model; no tokenizer kept (token ids only)", hf.string());
  }
  return "";
}

int import_hf(const Args& args) {
  po::options_description desc("ablate import hf DIR --run-dir OUT [--config EXPERIMENT.toml] [--set KEY=VALUE]");
  po::positional_options_description pos;
  desc.add_options()("dir", po::value<std::string>()->required(), "Hugging Face checkpoint directory (config.json + safetensors)")(
      "run-dir", po::value<std::string>()->required(), "the run directory to write (must not hold a run)")(
      "config", po::value<std::string>(), "an experiment whose other sections the run takes (default: ablate's defaults)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override an experiment key: KEY=VALUE (repeatable)");
  pos.add("dir", 1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm, "ablate import hf DIR --run-dir OUT [--config EXPERIMENT.toml] [--set KEY=VALUE]")) return 0;
  const fs::path dir = vm["dir"].as<std::string>(), run_dir = vm["run-dir"].as<std::string>();
  check_output_directory(run_dir, "the run directory");
  if (has_checkpoint(run_dir))
    throw_input_error(run_dir.string(), "already holds a run with checkpoints; import into a new --run-dir");
  const HfCheckpoint hf = read_hf_checkpoint(dir);
  // The checkpoint's [model] keys come last: they are what the weights are.
  std::vector<std::string> sets = vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>();
  for (const std::string& s : sets) {
    for (const auto& [k, v] : hf.model_keys) {
      if (s.rfind("model." + k + "=", 0) == 0)
        throw_input_error("--set " + echo_value(s), "model." + k + " is the checkpoint's (" + v + ")");
    }
  }
  for (const auto& [k, v] : hf.model_keys) sets.push_back("model." + k + "=" + v);
  Registry registry;
  registry.load_directories(Registry::default_search_path());
  const auto load = [&] {
    return vm.count("config") ? Config::load(vm["config"].as<std::string>(), sets, registry)
                              : Config::parse("", (dir / "config.json").string(), sets, registry);
  };
  Config config = load();
  RunSpec spec = RunSpec::from(config);
  // Windows no longer than the model's positions, unless the command line chose them.
  const int64_t positions = spec.model.keys.get_int("max_seq_len");
  const bool seq_len_set =
      std::any_of(sets.begin(), sets.end(), [](const std::string& s) { return s.rfind("batching.seq_len=", 0) == 0; });
  if (!seq_len_set && spec.seq_len > positions) {
    sets.push_back("batching.seq_len=" + std::to_string(positions));
    config = load();
    spec = RunSpec::from(config);
  }
  RunContext run;  // the model is only written out: on run.device's default, with the config's seed
  run.seed = spec.run.seed;
  const std::unique_ptr<Model> made = Session(spec, registry, run).model(0);
  Model& model = *made;
  model.load_params_from_host(hf_parameters(hf, model));
  fs::create_directories(run_dir);
  const std::string tokenizer = keep_tokenizer(dir, run_dir);
  write_initial_checkpoint(run_dir, spec, model,
                           {{"format", "huggingface"},
                            {"dir", fs::absolute(dir).lexically_normal().string()},
                            {"model_type", hf.model_type},
                            {"architecture", hf.architecture},
                            {"tokenizer", tokenizer}});
  write_file_atomic(run_dir / "config.toml", spec.config_toml);
  std::cout << "imported " << dir.string() << " (" << (hf.architecture.empty() ? hf.model_type : hf.architecture) << ", "
            << model.num_params() << " parameters) into " << run_dir.string() << "\n"
            << hf_model_toml(hf)
            << (tokenizer.empty() ? "" : "tokenizer: " + tokenizer + " -> " + (run_dir / "tokenizer").string() + "\n");
  return 0;
}

}  // namespace

int cmd_import(const Args& args) {
  return dispatch("import", args,
                  {{"hf", import_hf, "ablate import hf DIR --run-dir OUT [--config EXPERIMENT.toml] [--set KEY=VALUE]"}});
}

}  // namespace ablate::cli
