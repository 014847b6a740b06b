// Experiment configuration: parse (TOML++), apply --set overrides typed by the schemas, load the
// [plugins] paths, validate every section and sub-table, fill defaults, print back as TOML.
#include "ablate/runtime/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "ablate/error.hpp"
#include "ablate/file_check.hpp"
#include "ablate/version.hpp"
#include "ablate/runtime/registry.hpp"

namespace ablate {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Core's sections.

// [run] and [model].
static void add_run_and_model_sections(std::vector<SectionSpec>& s) {
  using namespace param;
  s.push_back({"run", "what to run and where", {
      integer("steps", 100, "optimizer steps to train").within(1, 1e12),
      integer("seed", 1337, "seed of every random choice (init, data order, dropout)").at_least(0),
      string("device", "cpu", "where to train").one_of({"cpu", "cuda"}),
      string("dtype", "fp32", "compute precision: fp32; tf32 (cuda: fp32 values, matrix products on TF32 tensor cores); "
             "bf16 (cuda: matrix products of bf16 operands accumulated in fp32; the activations only products read "
             "held in bf16, fp32 master weights, gradients, optimizer state and residual stream; MFU against the bf16 peak)")
          .one_of({"fp32", "tf32", "bf16"}),
      integer("threads", 0, "CPU threads (0 = all cores)").within(0, 4096),
      string("recompute", "none", "activations backward recomputes instead of keeping them from forward: none; mlp "
             "(the MLP's saved values: its hidden activations); block (everything inside a block but its input, "
             "one extra forward pass of the blocks); the same losses and gradients bit for bit")
          .one_of({"none", "mlp", "block"}),
      floating("memory_budget_gib", 0.0, "memory the run may use on the CPU, GiB (0 = the machine's physical memory); "
               "doctor and tune measure headroom against it").within(0.0, 1048576.0),
      integer("grad_accum_steps", 1, "micro-batches per optimizer step").within(1, 65536),
      integer("eval_every", 0, "evaluate on the validation split every N steps (0 = only at the end)").within(0, 1e12),
      integer("eval_batches", 8, "validation batches per evaluation (0 = no validation)").within(0, 1000000),
      integer("profile_steps", 0, "time every op of the last N steps, the device synchronised around each (slows "
              "those steps); writes profile.json and a table to the log").within(0, 1e12),
      floating("bucket_mb", 25.0, "data parallel: gradients are reduced in buckets of this many MB as the backward pass "
               "finishes them (0 = one reduction after the backward pass)").within(0.0, 1048576.0),
      string("communicator", "auto", "how ranks exchange gradients: a communicator plugin, or auto (mpi or nccl "
             "when a launcher started several ranks, else single)"),
    }, Kind::communicator, "communicator", false, "auto"});
  s.push_back({"model", "the decoder-only transformer", {
      integer("d_model", 128, "model width").within(1, 65536),
      integer("n_layers", 4, "transformer blocks").within(1, 4096),
      integer("n_heads", 4, "query heads").within(1, 4096),
      integer("n_kv_heads", 0, "key/value heads for GQA (0 = n_heads)").within(0, 4096),
      integer("vocab_size", 0, "vocabulary (0 = the data source's; token ids are 32-bit)").within(0, 2147483647),
      integer("vocab_multiple", 1, "pad the vocabulary up to a multiple of this").within(1, 65536),
      integer("max_seq_len", 1024, "longest sequence (learned position table size)").within(1, 16777216),
      string("norm", "layernorm", "normalisation layer: a layer component of role norm (layernorm, rmsnorm, or a plugin's)"),
      string("mlp", "gelu_mlp", "feed-forward layer: a layer component of role mlp (gelu_mlp, swiglu_mlp, or a plugin's)"),
      integer("mlp_hidden", 0, "MLP hidden size (0 = 4*d for gelu_mlp, 8/3*d rounded up to 64 for swiglu_mlp)").within(0, 1048576),
      string("position", "learned", "position encoding: a layer component of role position (learned, rope, or a plugin's)"),
      floating("rope_theta", 10000.0, "RoPE base").at_least(1.0),
      boolean("qk_norm", false, "per-head RMSNorm of q and k before RoPE"),
      boolean("bias", true, "biases in linear layers and norms"),
      boolean("tie_embeddings", true, "share the token embedding with the LM head"),
      floating("dropout", 0.0, "dropout probability").within(0.0, 0.99),
      floating("norm_eps", 0.0, "epsilon of every norm (0 = 1e-5 for layernorm, 1e-6 for rmsnorm; qk_norm uses 1e-6 or this)")
          .within(0.0, 0.1),
      string("init_from", "", "start from these weights (fresh optimizer and schedule): an ablate run or checkpoint "
                              "directory, or a Hugging Face checkpoint directory (config.json + safetensors)").path(),
    }, std::nullopt, "", false, "", {"norm", "mlp", "position"}});
}

// The data pipeline ([data], [sampler], [batching]) and the attention backend.
static void add_pipeline_sections(std::vector<SectionSpec>& s) {
  using namespace param;
  s.push_back({"data", "where documents come from and how they are prefetched", {
      string("name", "synthetic_probes", "the data source (a data_source plugin)"),
      integer("workers", 1, "prefetch worker threads (0 = read in the training thread)").within(0, 256),
      integer("prefetch", 4, "batches queued ahead of the trainer").within(1, 1024),
      boolean("debug_stats", false, "print a per-stage pipeline table periodically and name the bottleneck"),
      integer("debug_every", 100, "batches between two debug_stats tables").within(1, 1e12),
    }, Kind::data_source, "name", false, "synthetic_probes"});
  s.push_back({"sampler", "the order documents are drawn in, and which rank draws which", {
      string("name", "shuffled", "the sampler (a sampler plugin)"),
    }, Kind::sampler, "name", false, "shuffled"});
  s.push_back({"batching", "how documents become batches", {
      string("name", "packed", "the batcher (a batcher plugin): padded, bucketed, packed"),
      integer("batch_size", 8, "rows per micro-batch (B)").within(1, 1048576),
      integer("seq_len", 256, "positions per row (T)").within(2, 16777216),
      boolean("append_eot", true, "end every document with the source's end-of-document token"),
      string("long_documents", "split", "documents longer than a row: split into several rows, or truncate").one_of({"split", "truncate"}),
    }, Kind::batcher, "name", false, "packed"});
  s.push_back({"attention", "the attention backend", {
      string("name", "naive_cpu", "the attention backend (an attention plugin)"),
    }, Kind::attention, "name", false, "naive_cpu"});
}

// The optimizer, the schedule, the loggers, checkpoints, metrics and plugin paths.
static void add_training_sections(std::vector<SectionSpec>& s) {
  using namespace param;
  s.push_back({"optimizer", "the optimizer and its common hyper-parameters", {
      string("name", "adamw", "the optimizer (an optimizer plugin)"),
      floating("lr", 6e-4, "peak learning rate").at_least(0.0),
      floating("weight_decay", 0.1, "decoupled weight decay (matrices and embeddings)").at_least(0.0),
      floating("beta1", 0.9, "first moment decay").within(0.0, 0.999999),
      floating("beta2", 0.95, "second moment decay").within(0.0, 0.999999),
      floating("eps", 1e-8, "added to the square root of the second moment").at_least(0.0),
      floating("grad_clip", 1.0, "clip the global gradient norm to this (0 = off)").at_least(0.0),
      boolean("shard_state", false, "ZeRO-1 in data parallel: each rank keeps and updates only its shard of the "
              "optimizer state (gradients reduce-scattered, parameters all-gathered)"),
    }, Kind::optimizer, "name", false, "adamw"});
  s.push_back({"schedule", "the learning-rate schedule (a schedule plugin: constant, cosine, linear, wsd)", {
      string("name", "cosine", "the schedule after warmup (a schedule plugin)"),
      integer("warmup_steps", 0, "linear warmup from 0 to lr over this many steps").within(0, 1e12),
      floating("min_lr_ratio", 0.1, "floor of the decay as a fraction of lr").within(0.0, 1.0),
    }, Kind::schedule, "name", false, "cosine"});
  s.push_back({"logging", "where metrics go", {
      string_list("sinks", {"console", "jsonl"}, "logger plugins to send metrics to (console, jsonl, csv, tensorboard, mlflow)"),
      integer("every", 1, "log every N steps").within(1, 1e12),
    }, Kind::logger, "sinks", true, ""});
  s.push_back({"adapter", "fine-tuning with adapters: the base model frozen, only the adapters train (docs/finetuning.md)", {
      string("name", "", "the adapter (a layer plugin of role adapter: lora)"),
      integer("rank", 8, "LoRA rank r: A is (r, in), B (out, r)").within(1, 65536),
      floating("alpha", 16.0, "LoRA alpha: the adapter's output is scaled by alpha / rank").at_least(0.0),
      floating("dropout", 0.0, "dropout on the adapter's input while training").within(0.0, 0.99),
      string_list("targets", {"q", "v"}, "the linear layers that get an adapter: q, k, v, o (the attention's projections)"),
      string("base_dtype", "fp32", "how the frozen base's linear and MLP weights are held: fp32, or nf4 (4-bit NormalFloat, "
             "blocks of 64 with an fp32 scale each, dequantized for each product)").one_of({"fp32", "nf4"}),
    }, Kind::layer, "name", false, ""});
  s.push_back({"checkpoint", "saving and resuming", {
      integer("every", 0, "save every N steps (0 = only at the end)").within(0, 1e12),
      integer("keep", 2, "checkpoints kept (older ones are deleted)").within(1, 1000000),
    }, std::nullopt, "", false, ""});
  s.push_back({"metrics", "how throughput and utilisation are computed", {
      floating("peak_tflops", 0.0, "peak TFLOP/s for MFU (0 = from the device table or a CPU measurement)").at_least(0.0),
    }, std::nullopt, "", false, ""});
  s.push_back({"plugins", "where to find plugin libraries beyond the default search path", {
      string_list("paths", {}, "directories of plugin libraries (relative to the experiment file)"),
    }, std::nullopt, "", false, ""});
}

const std::vector<SectionSpec>& section_specs() {
  static const std::vector<SectionSpec> specs = [] {
    std::vector<SectionSpec> s;
    add_run_and_model_sections(s);
    add_pipeline_sections(s);
    add_training_sections(s);
    return s;
  }();
  return specs;
}

// The kind whose registrations' keys a section's sub-tables hold: the section's own kind, or for
// [model] the layers its keys name.
static std::optional<Kind> sub_table_kind(const SectionSpec& spec) {
  if (spec.kind) return spec.kind;
  if (!spec.layer_keys.empty()) return Kind::layer;
  return std::nullopt;
}

const SectionSpec* find_section_spec(std::string_view name) {
  for (const SectionSpec& s : section_specs()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const Schema& eval_entry_keys() {
  using namespace param;
  static const Schema keys = {
      string("name", "", "the evaluator (an evaluator plugin: multiple_choice, heldout_loss, generate_match)"),
      string("label", "", "what its metrics are called: eval/<label>/<metric> (default: the evaluator's name); "
             "lower-case letters, digits and '_', one per [[eval]]"),
      integer("every", 0, "steps between its evaluations (0 = with the validation loss, every run.eval_every steps, "
              "and at the last step)").within(0, 1e12),
      boolean("enabled", true, "run it during training (a disabled one is neither read nor run there; `ablate eval "
              "--eval LABEL` runs it on a checkpoint either way)"),
  };
  return keys;
}

// ---------------------------------------------------------------------------------------------

namespace {

struct ResolvedEval {
  std::string label;
  std::map<std::string, Value, std::less<>> common, own;
};

bool valid_eval_label(const std::string& label) {
  if (label.empty() || label.size() > 64) return false;
  return std::all_of(label.begin(), label.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

// The label of an [[eval]] table as written (its `label`, else its `name`), "" when neither is a string.
std::string written_eval_label(const toml::table& entry) {
  for (const char* key : {"label", "name"}) {
    if (const toml::node* n = entry.get(key); n != nullptr && n->is_string() && !n->as_string()->get().empty()) {
      return n->as_string()->get();
    }
  }
  return "";
}

struct ResolvedSection {
  std::map<std::string, Value, std::less<>> keys;
  std::map<std::string, std::map<std::string, Value, std::less<>>, std::less<>> impls;
  std::set<std::string, std::less<>> written;  // implementations whose sub-table the experiment gave
};

const ParamSpec* find_param(const Schema& schema, std::string_view key) {
  for (const ParamSpec& p : schema) {
    if (p.name == key) return &p;
  }
  return nullptr;
}

std::vector<std::string> schema_names(const Schema& schema) {
  std::vector<std::string> out;
  for (const ParamSpec& p : schema) out.push_back(p.name);
  return out;
}

std::string node_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "a list";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an int";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a bool";
    default: return "a date/time";
  }
}

std::string node_text(const toml::node& n) {
  if (n.is_table()) return "{...}";
  std::ostringstream os;
  n.visit([&](auto&& v) { os << toml::toml_formatter{v}; });
  std::string s = os.str();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// A path value made absolute against the working directory (see ParamSpec::is_path).
std::string absolute_if_path(const std::string& v, const ParamSpec& spec) {
  if (!spec.is_path || v.empty() || fs::path(v).is_absolute()) return v;
  if (std::find(spec.path_words.begin(), spec.path_words.end(), v) != spec.path_words.end()) return v;
  std::error_code ec;
  const fs::path abs = fs::absolute(v, ec);
  return ec ? v : abs.lexically_normal().string();
}

class Validator {
 public:
  Validator(std::string source, Registry& registry, const std::map<std::string, std::string>& origins)
      : source_(std::move(source)), registry_(registry), origins_(origins) {}

  std::string where(const toml::source_region& region, const std::string& path) const {
    auto it = origins_.find(path);
    if (it != origins_.end()) return it->second;
    if (region.begin.line == 0) return source_;
    return source_ + ":" + std::to_string(region.begin.line) + ":" + std::to_string(region.begin.column);
  }

  [[noreturn]] void fail(const toml::source_region& region, const std::string& path, const std::string& msg) const {
    throw_input_error(where(region, path), path.empty() ? msg : path + ": " + msg);
  }

  Value check(const toml::node& node, const ParamSpec& spec, const std::string& path) const {
    auto mismatch = [&]() {
      fail(node.source(), path, "expected " + spec.expectation() + ", got " + node_type_name(node) + " " + node_text(node));
    };
    auto range = [&](double v, const toml::node& at) {
      if ((spec.min && v < *spec.min) || (spec.max && v > *spec.max) || !std::isfinite(v)) {
        fail(at.source(), path, node_text(at) + " is out of range; expected " + spec.expectation());
      }
    };
    auto choice = [&](const std::string& v, const toml::node& at) {
      if (!spec.choices.empty() && std::find(spec.choices.begin(), spec.choices.end(), v) == spec.choices.end()) {
        fail(at.source(), path, "\"" + v + "\" is not allowed" + did_you_mean(v, spec.choices) + " (expected " +
                                    spec.expectation() + ")");
      }
    };
    switch (spec.type) {
      case ParamType::boolean:
        if (!node.is_boolean()) mismatch();
        return node.as_boolean()->get();
      case ParamType::integer: {
        if (!node.is_integer()) mismatch();
        const int64_t v = node.as_integer()->get();
        range(double(v), node);
        return v;
      }
      case ParamType::floating: {
        if (!node.is_number()) mismatch();
        const double v = node.is_integer() ? double(node.as_integer()->get()) : node.as_floating_point()->get();
        range(v, node);
        return v;
      }
      case ParamType::string: {
        if (!node.is_string()) mismatch();
        const std::string v = node.as_string()->get();
        choice(v, node);
        return absolute_if_path(v, spec);
      }
      case ParamType::int_list:
      case ParamType::float_list:
      case ParamType::string_list: {
        if (!node.is_array()) mismatch();
        std::vector<int64_t> ints;
        std::vector<double> floats;
        std::vector<std::string> strings;
        for (const toml::node& el : *node.as_array()) {
          if (spec.type == ParamType::int_list) {
            if (!el.is_integer()) mismatch();
            ints.push_back(el.as_integer()->get());
            range(double(ints.back()), el);
          } else if (spec.type == ParamType::float_list) {
            if (!el.is_number()) mismatch();
            floats.push_back(el.is_integer() ? double(el.as_integer()->get()) : el.as_floating_point()->get());
            range(floats.back(), el);
          } else {
            if (!el.is_string()) mismatch();
            strings.push_back(el.as_string()->get());
            choice(strings.back(), el);
            strings.back() = absolute_if_path(strings.back(), spec);
          }
        }
        if (spec.type == ParamType::int_list) return ints;
        if (spec.type == ParamType::float_list) return floats;
        return strings;
      }
    }
    mismatch();
    return {};
  }

  // Validates one table against a schema; unknown keys are errors with suggestions.
  std::map<std::string, Value, std::less<>> check_table(const toml::table& table, const Schema& schema,
                                                         const std::string& path, const std::string& hint_impl,
                                                         const Schema* hint_schema, bool skip_tables = false) const {
    std::map<std::string, Value, std::less<>> out;
    for (auto&& [key, node] : table) {
      if (skip_tables && node.is_table()) continue;  // implementation sub-tables are checked apart
      const std::string k(key.str());
      const std::string kpath = path + "." + k;
      const ParamSpec* spec = find_param(schema, k);
      if (spec == nullptr) {
        std::string msg = kpath + ": unknown key '" + k + "' in [" + path + "]";
        if (hint_schema != nullptr && find_param(*hint_schema, k) != nullptr) {
          msg += "; '" + k + "' belongs in [" + path + "." + hint_impl + "]";
        } else {
          msg += did_you_mean(k, schema_names(schema));
        }
        msg += " (valid keys: " + join(schema_names(schema)) + ")";
        throw_input_error(where(key.source(), kpath), msg);
      }
      out[k] = check(node, *spec, kpath);
    }
    for (const ParamSpec& p : schema) {
      if (out.find(p.name) == out.end()) out[p.name] = p.default_value;
    }
    return out;
  }

  ResolvedSection check_section(const SectionSpec& spec, const toml::table* table) const {
    ResolvedSection res;
    const std::string& path = spec.name;
    // Core keys first (every non-table entry), so a misspelled key is reported even when the
    // implementation is not named yet. The hint says where an implementation's key belongs.
    const ComponentInfo* hint = nullptr;
    if (spec.kind && !spec.selector_is_list && table != nullptr) {
      if (const toml::node* sel = table->get(spec.selector); sel != nullptr && sel->is_string()) {
        hint = registry_.find(*spec.kind, sel->as_string()->get());
      }
    } else if (spec.kind && !spec.selector_is_list && !spec.default_selection.empty()) {
      hint = registry_.find(*spec.kind, spec.default_selection);
    }
    const toml::table empty;
    res.keys = check_table(table ? *table : empty, spec.keys, path, hint ? hint->name : "",
                           hint ? &hint->schema : nullptr, /*skip_tables=*/true);
    // Selected implementation(s), validated against the registry.
    std::vector<std::string> selected;
    if (spec.kind) {
      const toml::node* sel = table ? table->get(spec.selector) : nullptr;
      const std::string sel_path = path + "." + spec.selector;
      auto check_name = [&](const std::string& name, const toml::node& at) {
        if (*spec.kind == Kind::communicator && name == kAutoCommunicator) return;  // resolved by the trainer
        if (registry_.find(*spec.kind, name) == nullptr) {
          const std::vector<std::string> valid = registry_.names(*spec.kind);
          fail(at.source(), sel_path, "unknown " + std::string(to_string(*spec.kind)) + " '" + name + "'" +
                                          did_you_mean(name, valid) + " (valid: " +
                                          (valid.empty() ? std::string("none loaded") : join(valid)) + ")" +
                                          registry_.not_loaded_note(name));
        }
      };
      if (sel != nullptr) {
        if (spec.selector_is_list) {
          if (!sel->is_array()) fail(sel->source(), sel_path, "expected a list of string, got " + node_type_name(*sel));
          for (const toml::node& el : *sel->as_array()) {
            if (!el.is_string()) fail(el.source(), sel_path, "expected a list of string, got an element " + node_text(el));
            check_name(el.as_string()->get(), el);
            selected.push_back(el.as_string()->get());
          }
        } else {
          if (!sel->is_string()) fail(sel->source(), sel_path, "expected a string, got " + node_type_name(*sel) + " " + node_text(*sel));
          check_name(sel->as_string()->get(), *sel);
          selected.push_back(sel->as_string()->get());
        }
      } else if (spec.selector_is_list) {
        // The schema's default list; the names are checked when the components are made, so a
        // config can be read where those plugins are not loaded.
        for (const ParamSpec& p : spec.keys) {
          if (p.name == spec.selector) selected = std::get<std::vector<std::string>>(p.default_value);
        }
      } else if (!spec.default_selection.empty()) {
        toml::value<std::string> def(spec.default_selection);
        check_name(spec.default_selection, def);
        selected.push_back(spec.default_selection);
      } else if (table != nullptr && !spec.selector_is_list) {
        const std::vector<std::string> valid = registry_.names(*spec.kind);
        fail(table->source(), path, "missing key '" + spec.selector + "': choose a " + std::string(to_string(*spec.kind)) +
                                        " (valid: " + (valid.empty() ? std::string("none loaded") : join(valid)) + ")");
      }
    }
    if (spec.kind) {
      if (spec.selector_is_list) {
        res.keys[spec.selector] = selected;
      } else {
        res.keys[spec.selector] = selected.empty() ? std::string() : selected.front();
      }
    }
    check_sub_tables(spec, table, res);
    if (spec.kind && selected.size() == 1 && *spec.kind == Kind::communicator && selected[0] == kAutoCommunicator) {
      selected = registry_.names(*spec.kind);  // any of them may be chosen: resolve every one's keys
    }
    for (const std::string& name : selected) {
      if (res.impls.find(name) == res.impls.end()) {
        res.impls[name] = check_table(toml::table{}, registry_.find(*spec.kind, name)->schema, path + "." + name, "", nullptr);
      }
    }
    return res;
  }

  // Sub-tables: one per implementation (or per layer of [model]), every one present validated; and
  // the chosen layers' keys, their defaults where [model.<layer>] is not given (a name no
  // registration has is refused where the model makes the layer, with the layers of that role).
  void check_sub_tables(const SectionSpec& spec, const toml::table* table, ResolvedSection& res) const {
    const std::string& path = spec.name;
    const std::optional<Kind> sub_kind = sub_table_kind(spec);
    if (table != nullptr) {
      for (auto&& [key, node] : *table) {
        if (!node.is_table()) continue;
        const std::string impl(key.str());
        const std::string ipath = path + "." + impl;
        if (!sub_kind) {
          throw_input_error(where(key.source(), ipath), "[" + path + "] has no sub-tables; unexpected table [" + ipath + "]" +
                                                            did_you_mean(impl, schema_names(spec.keys)));
        }
        const ComponentInfo* info = registry_.find(*sub_kind, impl);
        if (info == nullptr) {
          const std::vector<std::string> valid = registry_.names(*sub_kind);
          throw_input_error(where(key.source(), ipath),
                            "[" + ipath + "]: no " + std::string(to_string(*sub_kind)) + " named '" + impl + "'" +
                                did_you_mean(impl, valid) + " (valid: " +
                                (valid.empty() ? std::string("none loaded") : join(valid)) + ")");
        }
        res.impls[impl] = check_table(*node.as_table(), info->schema, ipath, "", nullptr);
        res.written.insert(impl);
      }
    }
    for (const std::string& key : spec.layer_keys) {
      const std::string& name = std::get<std::string>(res.keys.at(key));
      const ComponentInfo* info = registry_.find(Kind::layer, name);
      if (info != nullptr && res.impls.find(name) == res.impls.end()) {
        res.impls[name] = check_table(toml::table{}, info->schema, path + "." + name, "", nullptr);
      }
    }
  }

 private:
  std::string source_;
  Registry& registry_;
  const std::map<std::string, std::string>& origins_;
};

// The [[eval]] tables: each names a registered evaluator, has a label no other has, and its other
// keys are the evaluator's (checked against its schema, defaults filled in).
std::vector<ResolvedEval> check_evals(const Validator& v, const Registry& registry, const toml::node* node) {
  std::vector<ResolvedEval> out;
  if (node == nullptr) return out;
  const toml::array* entries = node->as_array();
  if (entries == nullptr) v.fail(node->source(), "eval", "expected [[eval]] tables (an array of tables), got " + node_type_name(*node));
  for (std::size_t i = 0; i < entries->size(); ++i) {
    const toml::node& el = *entries->get(i);
    const std::string at = "eval[" + std::to_string(i) + "]";
    if (!el.is_table()) v.fail(el.source(), at, "expected a table ([[eval]]), got " + node_type_name(el) + " " + node_text(el));
    const toml::table& entry = *el.as_table();
    const toml::node* name = entry.get("name");
    const std::vector<std::string> valid = registry.names(Kind::evaluator);
    const std::string valid_text = " (valid: " + (valid.empty() ? std::string("none loaded") : join(valid)) + ")";
    if (name == nullptr) v.fail(entry.source(), at, "missing key 'name': choose an evaluator" + valid_text);
    if (!name->is_string()) v.fail(name->source(), at + ".name", "expected a string, got " + node_type_name(*name) + " " + node_text(*name));
    const std::string plugin = name->as_string()->get();
    const ComponentInfo* info = registry.find(Kind::evaluator, plugin);
    if (info == nullptr) {
      v.fail(name->source(), at + ".name", "unknown evaluator '" + plugin + "'" + did_you_mean(plugin, valid) + valid_text +
                                             registry.not_loaded_note(plugin));
    }
    std::string label = written_eval_label(entry);
    const std::string path = "eval." + (valid_eval_label(label) ? label : at);
    Schema schema = eval_entry_keys();
    schema.insert(schema.end(), info->schema.begin(), info->schema.end());
    std::map<std::string, Value, std::less<>> keys = v.check_table(entry, schema, path, "", nullptr);
    if (std::get<std::string>(keys["label"]).empty()) keys["label"] = plugin;
    label = std::get<std::string>(keys["label"]);
    const toml::node* label_node = entry.get("label");
    const toml::source_region region = label_node ? label_node->source() : entry.source();
    if (!valid_eval_label(label)) {
      v.fail(region, at + ".label", "\"" + label + "\" is not a label: expected 1 to 64 lower-case letters, digits or '_' "
                                  "(it names the metrics eval/<label>/<metric>)");
    }
    for (const ResolvedEval& e : out) {
      if (e.label == label) {
        v.fail(region, at + ".label", "\"" + label + "\" is the label of another [[eval]] too; give each its own `label`");
      }
    }
    ResolvedEval r;
    r.label = label;
    for (auto& [k, v] : keys) (find_param(eval_entry_keys(), k) ? r.common : r.own)[k] = v;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const SectionSpec& s : section_specs()) out.push_back(s.name);
  return out;
}

// --set: find the spec a path names, or fail with a suggestion.
const ParamSpec* override_spec(const std::vector<std::string>& parts, const std::string& origin, const Registry& registry,
                               ParamSpec& selector_spec) {
  const SectionSpec* sec = find_section_spec(parts[0]);
  if (sec == nullptr) {
    throw_input_error(origin, "unknown section '" + parts[0] + "'" + did_you_mean(parts[0], section_names()) +
                                  " (sections: " + join(section_names()) + ")");
  }
  if (parts.size() == 2) {
    const ParamSpec* p = find_param(sec->keys, parts[1]);
    if (p == nullptr) {
      throw_input_error(origin, "unknown key '" + parts[1] + "' in [" + parts[0] + "]" +
                                    did_you_mean(parts[1], schema_names(sec->keys)) +
                                    " (valid keys: " + join(schema_names(sec->keys)) + ")");
    }
    if (sec->kind && parts[1] == sec->selector && sec->selector_is_list) {
      selector_spec = param::string_list(parts[1], {}, "");
      return &selector_spec;
    }
    return p;
  }
  if (const std::optional<Kind> kind = sub_table_kind(*sec); parts.size() == 3 && kind) {
    const ComponentInfo* info = registry.find(*kind, parts[1]);
    if (info == nullptr) {
      const std::vector<std::string> valid = registry.names(*kind);
      throw_input_error(origin, "no " + std::string(to_string(*kind)) + " named '" + parts[1] + "'" +
                                    did_you_mean(parts[1], valid) + " (valid: " + join(valid) + ")");
    }
    const ParamSpec* p = find_param(info->schema, parts[2]);
    if (p == nullptr) {
      throw_input_error(origin, "unknown key '" + parts[2] + "' in [" + parts[0] + "." + parts[1] + "]" +
                                    did_you_mean(parts[2], schema_names(info->schema)) +
                                    " (valid keys: " + join(schema_names(info->schema)) + ")");
    }
    return p;
  }
  throw_input_error(origin, "expected section.key=value or section.implementation.key=value");
}

std::unique_ptr<toml::node> parse_override_value(const std::string& text, const ParamSpec& spec, const std::string& origin) {
  toml::table parsed;
  bool ok = true;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    ok = false;
  }
  const toml::node* v = ok ? parsed.get("v") : nullptr;
  auto bad = [&]() -> std::unique_ptr<toml::node> {
    throw_input_error(origin, "'" + text + "' is not " + spec.expectation());
  };
  switch (spec.type) {
    case ParamType::string:
      if (v && v->is_string()) return std::make_unique<toml::value<std::string>>(v->as_string()->get());
      return std::make_unique<toml::value<std::string>>(text);  // bare words need no quotes on a command line
    case ParamType::boolean:
      if (v && v->is_boolean()) return std::make_unique<toml::value<bool>>(v->as_boolean()->get());
      return bad();
    case ParamType::integer:
      if (v && v->is_integer()) return std::make_unique<toml::value<int64_t>>(v->as_integer()->get());
      return bad();
    case ParamType::floating:
      if (v && v->is_integer()) return std::make_unique<toml::value<double>>(double(v->as_integer()->get()));
      if (v && v->is_floating_point()) return std::make_unique<toml::value<double>>(v->as_floating_point()->get());
      return bad();
    default:
      break;
  }
  // Lists: TOML syntax, or for strings a bare comma-separated list ("console,jsonl").
  if (v && v->is_array()) return std::make_unique<toml::array>(*v->as_array());
  if (spec.type == ParamType::string_list) {
    auto arr = std::make_unique<toml::array>();
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (!item.empty()) arr->push_back(item);
    }
    return arr;
  }
  if (v && v->is_number()) {  // a single number for a list of numbers
    auto arr = std::make_unique<toml::array>();
    if (v->is_integer()) arr->push_back(v->as_integer()->get());
    else arr->push_back(v->as_floating_point()->get());
    return arr;
  }
  return bad();
}

// --set eval.<label>.<key>=value: the [[eval]] table of that label (its `label`, else its `name`),
// typed by the common [[eval]] keys or its evaluator's schema.
void apply_eval_override(toml::table& root, const std::vector<std::string>& parts, const std::string& text,
                         const std::string& origin, const Registry& registry) {
  toml::array* entries = root["eval"].as_array();
  std::vector<std::string> labels;
  toml::table* entry = nullptr;
  for (std::size_t i = 0; entries != nullptr && i < entries->size(); ++i) {
    toml::table* t = entries->get(i)->as_table();
    if (t == nullptr) continue;
    labels.push_back(written_eval_label(*t));
    if (labels.back() == parts[1]) entry = t;
  }
  if (parts.size() != 3) throw_input_error(origin, "expected eval.<label>.key=value");
  if (entry == nullptr) {
    throw_input_error(origin, "the experiment has no [[eval]] labelled '" + parts[1] + "'" + did_you_mean(parts[1], labels) +
                                  (labels.empty() ? std::string(" (it has no [[eval]] table: add one to the file)")
                                                  : " (labels: " + join(labels) + ")"));
  }
  const ParamSpec* spec = find_param(eval_entry_keys(), parts[2]);
  const toml::node* name = entry->get("name");
  const ComponentInfo* info = name && name->is_string() ? registry.find(Kind::evaluator, name->as_string()->get()) : nullptr;
  if (spec == nullptr && info != nullptr) spec = find_param(info->schema, parts[2]);
  if (spec == nullptr) {
    std::vector<std::string> keys = schema_names(eval_entry_keys());
    if (info != nullptr) for (const std::string& k : schema_names(info->schema)) keys.push_back(k);
    throw_input_error(origin, "unknown key '" + parts[2] + "' in [[eval]] '" + parts[1] + "'" + did_you_mean(parts[2], keys) +
                                  " (valid keys: " + join(keys) + ")");
  }
  std::unique_ptr<toml::node> value = parse_override_value(text, *spec, origin);
  if (auto* arr = dynamic_cast<toml::array*>(value.get())) {
    entry->insert_or_assign(parts[2], std::move(*arr));
  } else {
    value->visit([&](auto&& v) {
      using V = std::decay_t<decltype(v)>;
      if constexpr (toml::is_value<V>) entry->insert_or_assign(parts[2], v.get());
    });
  }
}

void apply_override(toml::table& root, const std::string& assignment, const Registry& registry,
                    std::map<std::string, std::string>& origins) {
  const std::string origin = "--set " + assignment;
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) throw_input_error(origin, "expected section.key=value");
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '.')) parts.push_back(part);
  if (!parts.empty() && parts[0] == "eval") {
    apply_eval_override(root, parts, text, origin, registry);
    origins[path] = origin;
    return;
  }
  if (parts.size() < 2 || parts.size() > 3) throw_input_error(origin, "expected section.key=value or section.implementation.key=value");
  ParamSpec selector_spec;
  const ParamSpec* spec = override_spec(parts, origin, registry, selector_spec);
  std::unique_ptr<toml::node> value = parse_override_value(text, *spec, origin);
  toml::table* t = &root;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* child = t->get(parts[i]);
    if (child == nullptr) {
      t->insert(parts[i], toml::table{});
      child = t->get(parts[i]);
    }
    if (!child->is_table()) throw_input_error(origin, "'" + parts[i] + "' is not a table in the experiment file");
    t = child->as_table();
  }
  if (auto* arr = dynamic_cast<toml::array*>(value.get())) {
    t->insert_or_assign(parts.back(), std::move(*arr));
  } else {
    value->visit([&](auto&& v) {
      using V = std::decay_t<decltype(v)>;
      if constexpr (toml::is_value<V>) t->insert_or_assign(parts.back(), v.get());
    });
  }
  origins[path] = origin;
}

}  // namespace

uint64_t fnv1a(std::string_view s) noexcept {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// ---------------------------------------------------------------------------------------------

struct Config::Impl {
  std::string source;
  std::map<std::string, ResolvedSection, std::less<>> sections;
  std::vector<ResolvedEval> evals;
};

Config::Config() : impl_(std::make_unique<Impl>()) {}
Config::Config(Config&&) noexcept = default;
Config& Config::operator=(Config&&) noexcept = default;
Config::~Config() = default;

Config Config::load(const fs::path& file, const std::vector<std::string>& overrides, Registry& registry) {
  // Only a regular file is read: a directory would read as empty (the all-defaults experiment), a
  // FIFO would wait forever and a device like /dev/zero would never end. Experiment files are a
  // few KB of TOML.
  const std::string text = read_regular_file(file, "experiment file", kMaxExperimentBytes);
  return parse(text, file.string(), overrides, registry, file.parent_path());
}

Config Config::parse(std::string_view text, const std::string& source_name, const std::vector<std::string>& overrides,
                     Registry& registry, const fs::path& base_dir) {
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw_input_error(source_name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column),
                      "TOML syntax error: " + std::string(e.description()));
  }
  std::map<std::string, std::string> origins;
  Validator validator(source_name, registry, origins);

  // Top level: only known sections, each a table.
  for (auto&& [key, node] : root) {
    const std::string k(key.str());
    if (k == "eval") continue;  // [[eval]] tables: checked with the evaluators loaded
    if (find_section_spec(k) == nullptr) {
      throw_input_error(validator.where(key.source(), k),
                        "unknown section [" + k + "]" + did_you_mean(k, section_names()) + " (sections: " + join(section_names()) + ")");
    }
    if (!node.is_table()) {
      throw_input_error(validator.where(key.source(), k), "'" + k + "' must be a table ([" + k + "]), got " + node_type_name(node));
    }
  }

  // [plugins] paths first: the plugins they hold may be what the rest of the file names. Overrides
  // of plugins.paths apply before loading; overrides naming plugin sub-tables apply after.
  std::vector<std::string> deferred;
  for (const std::string& o : overrides) {
    if (o.rfind("plugins.", 0) == 0) apply_override(root, o, registry, origins);
    else deferred.push_back(o);
  }
  if (const toml::table* plugins = root["plugins"].as_table()) {
    if (const toml::node* paths = plugins->get("paths")) {
      const Value v = validator.check(*paths, *find_param(find_section_spec("plugins")->keys, "paths"), "plugins.paths");
      std::vector<fs::path> dirs;
      for (const std::string& p : std::get<std::vector<std::string>>(v)) {
        fs::path dir(p);
        if (dir.is_relative() && !base_dir.empty()) dir = base_dir / dir;
        std::error_code ec;
        if (!fs::is_directory(dir, ec)) {
          validator.fail(paths->source(), "plugins.paths", "'" + dir.string() + "' is not a directory");
        }
        dirs.push_back(dir);
      }
      registry.load_directories(dirs);
    }
  }
  for (const std::string& o : deferred) apply_override(root, o, registry, origins);

  Config cfg;
  cfg.impl_->source = source_name;
  for (const SectionSpec& spec : section_specs()) {
    const toml::table* table = root[spec.name].as_table();
    if (table == nullptr && spec.kind && spec.default_selection.empty() && !spec.selector_is_list) {
      continue;  // a component section with no default implementation is absent until asked for
    }
    cfg.impl_->sections[spec.name] = validator.check_section(spec, table);
  }
  cfg.impl_->evals = check_evals(validator, registry, root.get("eval"));
  // Products of keys: a micro-batch's positions are indexed with 32 bits and every batch buffer
  // holds batch_size x seq_len of them, so a product past that is refused before anything is sized.
  if (auto it = cfg.impl_->sections.find("batching"); it != cfg.impl_->sections.end()) {
    const int64_t b = std::get<int64_t>(it->second.keys.at("batch_size"));
    const int64_t t = std::get<int64_t>(it->second.keys.at("seq_len"));
    if (b * t > kMaxBatchPositions) {
      const toml::node* at = root.at_path("batching.batch_size").node();
      validator.fail(at ? at->source() : toml::source_region{}, "batching.batch_size",
                     "batch_size x seq_len = " + std::to_string(b) + " x " + std::to_string(t) + " = " +
                         std::to_string(b * t) + " positions per micro-batch; expected at most " +
                         std::to_string(kMaxBatchPositions) + " (lower batching.batch_size or batching.seq_len)");
    }
  }
  return cfg;
}

std::string Config::to_toml() const {
  std::string out = "# resolved by ablate " + std::string(core_version()) + " from " + impl_->source + "\n";
  for (const SectionSpec& spec : section_specs()) {
    auto it = impl_->sections.find(spec.name);
    if (it == impl_->sections.end()) continue;
    const ResolvedSection& sec = it->second;
    out += "\n[" + spec.name + "]\n";
    if (spec.kind) out += spec.selector + " = " + format_value(sec.keys.at(spec.selector)) + "\n";
    for (const ParamSpec& p : spec.keys) {
      if (spec.kind && p.name == spec.selector) continue;
      out += p.name + " = " + format_value(sec.keys.at(p.name)) + "\n";
    }
    // The chosen implementations' sub-tables, and any the experiment gave itself. The keys of an
    // implementation resolved only because "auto" might pick it stay out: a run written by a build
    // with nccl must read where nccl is not built.
    const auto chosen = [&](const std::string& impl) {
      if (sec.written.count(impl) > 0 || !spec.kind) return true;
      const Value& sel = sec.keys.at(spec.selector);
      if (const auto* one = std::get_if<std::string>(&sel)) return *one == impl;
      if (const auto* many = std::get_if<std::vector<std::string>>(&sel)) return std::find(many->begin(), many->end(), impl) != many->end();
      return false;
    };
    for (const auto& [impl, values] : sec.impls) {
      if (!chosen(impl)) continue;
      // A layer without keys of its own writes no [model.<layer>]: the text (and hash) of a config
      // that names only built-in layers stays what it was.
      if (!spec.kind && values.empty() && sec.written.count(impl) == 0) continue;
      out += "\n[" + spec.name + "." + impl + "]\n";
      for (const auto& [k, v] : values) out += k + " = " + format_value(v) + "\n";
    }
  }
  for (const ResolvedEval& e : impl_->evals) {
    out += "\n[[eval]]\n";
    for (const ParamSpec& p : eval_entry_keys()) out += p.name + " = " + format_value(e.common.at(p.name)) + "\n";
    for (const auto& [k, v] : e.own) out += k + " = " + format_value(v) + "\n";
  }
  return out;
}

std::vector<Config::EvalEntry> Config::evals() const {
  std::vector<EvalEntry> out;
  for (const ResolvedEval& e : impl_->evals) {
    out.push_back({Params("eval." + e.label, e.common), Params("eval." + e.label, e.own)});
  }
  return out;
}

std::string Config::hash() const {
  // The header line names the source file; the hash covers only the resolved values.
  std::string text = to_toml();
  text = text.substr(text.find('\n') + 1);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(fnv1a(text)));
  return buf;
}

const std::string& Config::source() const noexcept { return impl_->source; }

bool Config::has_section(std::string_view section) const {
  return impl_->sections.find(section) != impl_->sections.end();
}

Params Config::section(std::string_view section) const {
  auto it = impl_->sections.find(section);
  if (it == impl_->sections.end()) {
    throw_input_error(impl_->source, "the experiment has no [" + std::string(section) + "] section and it has no default");
  }
  return Params(std::string(section), it->second.keys);
}

std::string Config::selected(std::string_view section) const {
  const SectionSpec* spec = find_section_spec(section);
  if (spec == nullptr || !spec->kind) throw_runtime_error(std::string(section), "not a component section");
  if (spec->selector_is_list) {
    const auto list = selected_list(section);
    return list.empty() ? std::string() : list.front();
  }
  return this->section(section).get_string(spec->selector);
}

std::vector<std::string> Config::selected_list(std::string_view section) const {
  const SectionSpec* spec = find_section_spec(section);
  if (spec == nullptr || !spec->kind) throw_runtime_error(std::string(section), "not a component section");
  if (!spec->selector_is_list) return {selected(section)};
  return this->section(section).get_string_list(spec->selector);
}

std::vector<std::string> Config::implementations(std::string_view section) const {
  std::vector<std::string> names;
  if (auto it = impl_->sections.find(section); it != impl_->sections.end()) {
    for (const auto& [name, keys] : it->second.impls) names.push_back(name);
  }
  return names;
}

bool Config::has_implementation(std::string_view section, std::string_view impl) const {
  auto it = impl_->sections.find(section);
  return it != impl_->sections.end() && it->second.impls.find(impl) != it->second.impls.end();
}

Params Config::implementation(std::string_view section, std::string_view impl) const {
  auto it = impl_->sections.find(section);
  if (it == impl_->sections.end()) {
    throw_input_error(impl_->source, "the experiment has no [" + std::string(section) + "] section");
  }
  auto jt = it->second.impls.find(impl);
  if (jt == it->second.impls.end()) {
    throw_runtime_error(impl_->source, "no resolved [" + std::string(section) + "." + std::string(impl) + "]");
  }
  return Params(std::string(section) + "." + std::string(impl), jt->second);
}

}  // namespace ablate
