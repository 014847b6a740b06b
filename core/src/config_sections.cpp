// Core's sections of the experiment file ([run], [model], the pipeline's and training's) and the
// common keys of an [[eval]] table: the schemas the configuration is checked against
// (config_check.cpp) and printed from (`ablate config reference`).
#include "ablate/runtime/config.hpp"
#include "ablate/runtime/defaults.hpp"

#include "ablate/version.hpp"

namespace ablate {

// ---------------------------------------------------------------------------------------------
// Core's sections.

// [run]'s keys.
static Schema run_keys() {
  using namespace param;
  return {
      integer("steps", 100, "optimizer steps to train").within(1, 1e12),
      integer("seed", 1337, "seed of every random choice (init, data order, dropout)").at_least(0),
      string("device", "cpu", "where to train: a device registration (cpu, cuda, or a plugin's)").registration_of("device"),
      string(
          "dtype", "fp32",
          "compute precision: fp32; tf32 (cuda: fp32 values, matrix products on TF32 tensor cores); "
          "bf16 (cuda: matrix products of bf16 operands accumulated in fp32; the activations and attention "
          "gradients only products read held in bf16, fp32 master weights, weight gradients, optimizer state and "
          "residual stream (run.residual_dtype); MFU against the bf16 peak); fp8 (cuda, compute capability 8.9 or later: bf16's plan with "
          "the linear and MLP products in FP8, per-tensor scales (run.fp8_scaling), E4M3 weights and activations, E5M2 "
          "gradients; the classifier and attention in bf16; MFU against the bf16 peak); fp8_e4m3 (fp8 with E4M3 "
          "gradients too)")
          .one_of({"fp32", "tf32", "bf16", "fp8", "fp8_e4m3"}),
      string("fp8_scaling", "current",
             "run.dtype fp8: how each FP8 product's per-tensor scales are set: current (from the operand's own "
             "amax, just before the product); delayed (from an amax history of earlier steps, kept in checkpoints; "
             "the first step, with no history yet, scales as current does)")
          .one_of({"current", "delayed"}),
      integer("fp8_amax_history", 16, "run.fp8_scaling = delayed: steps of amax history each tensor keeps").within(1, 1024),
      string("fp8_amax_reduction", "max",
             "run.fp8_scaling = delayed: the scale's amax from the history: max (of every step kept) or most_recent")
          .one_of({"max", "most_recent"}),
      string("residual_dtype", "fp32",
             "the residual stream's type (the embedding's output, each block's input and the attention's output "
             "plus its residual): fp32; bf16 (run.dtype bf16, fp8 or fp8_e4m3 only: each residual add rounded once "
             "to bf16, in the product's epilogue where it can be; half the stream's bytes, as llm.c holds it). "
             "The stream's gradient, master weights and optimizer state stay fp32")
          .one_of({"fp32", "bf16"}),
      integer("threads", 0, "CPU threads (0 = all cores)").within(0, 4096),
      string("recompute", "none",
             "activations backward recomputes instead of keeping them from forward: none; mlp "
             "(the MLP's saved values: its hidden activations); block (everything inside a block but its input, "
             "one extra forward pass of the blocks); the same losses and gradients bit for bit")
          .one_of({"none", "mlp", "block"}),
      floating("memory_budget_gib", 0.0,
               "memory the run may use on the CPU, GiB (0 = the machine's physical memory); "
               "doctor and tune measure headroom against it")
          .within(0.0, 1048576.0),
      integer("grad_accum_steps", 1, "micro-batches per optimizer step").within(1, 65536),
      integer("eval_every", 0, "evaluate on the validation split every N steps (0 = only at the end)").within(0, 1e12),
      integer("eval_batches", 8, "validation batches per evaluation (0 = no validation)").within(0, 1000000),
      integer("profile_steps", 0,
              "time every op of the last N steps, the device synchronised around each (slows "
              "those steps); writes profile.json and a table to the log")
          .within(0, 1e12),
      boolean("cuda_graph", false,
              "replay each training step as one captured graph (a device with a queue: cuda) instead of issuing its "
              "kernels one by one: a step whose batch has the layout of the step before is captured once and "
              "replayed while the layout stays (dense rows: every step); the same losses bit for bit. One rank, "
              "one micro-batch, an optimizer that can be captured (adamw_fused), no dropout, no FP8 delayed scaling"),
      floating("bucket_mb", 25.0,
               "data parallel: gradients are reduced in buckets of this many MB as the backward pass "
               "finishes them (0 = one reduction after the backward pass)")
          .within(0.0, 1048576.0),
      string("communicator", "auto",
             "how ranks exchange gradients: a communicator plugin, or auto (mpi or nccl "
             "when a launcher started several ranks, else single)"),
  };
}

// [run] and [model].
static void add_run_and_model_sections(std::vector<SectionSpec>& s) {
  using namespace param;
  s.push_back({"run", "what to run and where", run_keys(), Kind::communicator, "communicator", false, "auto"});
  s.push_back(
      {"model",
       "the decoder-only transformer",
       {
           integer("d_model", 128, "model width").within(1, 65536),
           integer("n_layers", 4, "transformer blocks").within(1, 4096),
           integer("n_heads", 4, "query heads").within(1, 4096),
           integer("n_kv_heads", 0, "key/value heads for GQA (0 = n_heads)").within(0, 4096),
           integer("vocab_size", 0, "vocabulary (0 = the data source's; token ids are 32-bit)").within(0, 2147483647),
           integer("vocab_multiple", 1, "pad the vocabulary up to a multiple of this").within(1, 65536),
           integer("max_seq_len", 1024, "longest sequence (learned position table size)").within(1, 16777216),
           string("norm", defaults::norm, "normalisation layer: a layer component of role norm (layernorm, rmsnorm, or a plugin's)"),
           string("mlp", defaults::mlp, "feed-forward layer: a layer component of role mlp (gelu_mlp, swiglu_mlp, or a plugin's)"),
           integer(
               "mlp_hidden", 0,
               "MLP hidden size (0 = the MLP layer's default for d_model: 4*d for gelu_mlp, 8/3*d rounded up to 64 for swiglu_mlp)")
               .within(0, 1048576),
           string("position", defaults::position,
                  "position encoding: a layer component of role position (learned, rope, or a plugin's)"),
           boolean("qk_norm", false, "per-head norm of q and k before RoPE (the layer model.qk_norm_layer names)"),
           string("embedding_layer", defaults::embedding, "token embedding: a layer component of role embedding"),
           string("projection_layer", defaults::linear,
                  "the attention's q, k, v and output projections: a layer component of role linear"),
           string("classifier_layer", defaults::classifier, "the LM head with its loss: a layer component of role classifier"),
           string("qk_norm_layer", defaults::qk_norm_layer, "the norm qk_norm applies: a layer component of role norm"),
           boolean("bias", true, "biases in linear layers and norms"),
           boolean("tie_embeddings", true, "share the token embedding with the LM head"),
           floating("dropout", 0.0, "dropout probability").within(0.0, 0.99),
           floating("norm_eps", 0.0, "epsilon of every norm (0 = each norm layer's default: 1e-5 for layernorm, 1e-6 for rmsnorm)")
               .within(0.0, 0.1),
           string("init_from", "",
                  "start from these weights (fresh optimizer and schedule): an ablate run or checkpoint "
                  "directory, or a Hugging Face checkpoint directory (config.json + safetensors)")
               .path(),
       },
       std::nullopt,
       "",
       false,
       "",
       {"embedding_layer", "norm", "mlp", "position", "projection_layer", "classifier_layer", "qk_norm_layer"}});
}

// The data pipeline ([data], [sampler], [batching]) and the attention backend.
static void add_pipeline_sections(std::vector<SectionSpec>& s) {
  using namespace param;
  s.push_back({"data",
               "where documents come from and how they are prefetched",
               {
                   string("name", defaults::data_source, "the data source (a data_source plugin)"),
                   integer("workers", 1, "prefetch worker threads (0 = read in the training thread)").within(0, 256),
                   integer("prefetch", 4, "batches queued ahead of the trainer").within(1, 1024),
                   boolean("debug_stats", false, "print a per-stage pipeline table periodically and name the bottleneck"),
                   integer("debug_every", 100, "batches between two debug_stats tables").within(1, 1e12),
               },
               Kind::data_source,
               "name",
               false,
               defaults::data_source});
  s.push_back({"sampler",
               "the order documents are drawn in, and which rank draws which",
               {
                   string("name", defaults::sampler, "the sampler (a sampler plugin)"),
               },
               Kind::sampler,
               "name",
               false,
               defaults::sampler});
  s.push_back({"batching",
               "how documents become batches",
               {
                   string("name", defaults::batcher, "the batcher (a batcher plugin): padded, bucketed, packed"),
                   integer("batch_size", 8, "rows per micro-batch (B)").within(1, 1048576),
                   integer("seq_len", 256, "positions per row (T)").within(2, 16777216),
                   boolean("append_eot", true, "end every document with the source's end-of-document token"),
                   string("long_documents", "split", "documents longer than a row: split into several rows, or truncate")
                       .one_of({"split", "truncate"}),
               },
               Kind::batcher,
               "name",
               false,
               defaults::batcher});
  s.push_back({"attention",
               "the attention backend",
               {
                   string("name", defaults::attention, "the attention backend (an attention plugin)"),
               },
               Kind::attention,
               "name",
               false,
               defaults::attention});
}

// The optimizer, the schedule, the loggers, checkpoints, metrics and plugin paths.
static void add_training_sections(std::vector<SectionSpec>& s) {
  using namespace param;
  s.push_back({"optimizer",
               "the optimizer and its common hyper-parameters",
               {
                   string("name", defaults::optimizer, "the optimizer (an optimizer plugin)"),
                   floating("lr", 6e-4, "peak learning rate").at_least(0.0),
                   floating("grad_clip", 1.0, "clip the global gradient norm to this (0 = off)").at_least(0.0),
                   boolean("shard_state", false,
                           "ZeRO-1 in data parallel: each rank keeps and updates only its shard of the "
                           "optimizer state (gradients reduce-scattered, parameters all-gathered)"),
               },
               Kind::optimizer,
               "name",
               false,
               defaults::optimizer});
  s.push_back({"schedule",
               "the learning-rate schedule (a schedule plugin: constant, cosine, linear, wsd)",
               {
                   string("name", defaults::schedule, "the schedule after warmup (a schedule plugin)"),
                   integer("warmup_steps", 0, "linear warmup from 0 to lr over this many steps").within(0, 1e12),
                   floating("min_lr_ratio", 0.1, "floor of the decay as a fraction of lr").within(0.0, 1.0),
               },
               Kind::schedule,
               "name",
               false,
               defaults::schedule});
  s.push_back({"logging",
               "where metrics go",
               {
                   string_list("sinks", {defaults::loggers.begin(), defaults::loggers.end()},
                               "logger plugins to send metrics to (console, jsonl, csv, tensorboard, mlflow)"),
                   integer("every", 1, "log every N steps").within(1, 1e12),
               },
               Kind::logger,
               "sinks",
               true,
               ""});
  s.push_back(
      {"adapter",
       "fine-tuning with adapters: the base model frozen, only the adapters train (docs/finetuning.md)",
       {
           string("name", "", "the adapter (a layer plugin of role adapter: lora); its own keys in [adapter.<name>]"),
           string_list("targets", {"q", "v"}, "the linear layers that get an adapter: q, k, v, o (the attention's projections)"),
           string("base_dtype", "fp32",
                  "how the frozen base's linear and MLP weights are held: fp32, or nf4 (4-bit NormalFloat, "
                  "blocks of 64 with an fp32 scale each, dequantized for each product)")
               .one_of({"fp32", "nf4"}),
       },
       Kind::layer,
       "name",
       false,
       ""});
  s.push_back({"checkpoint",
               "saving and resuming",
               {
                   integer("every", 0, "save every N steps (0 = only at the end)").within(0, 1e12),
                   integer("keep", 2, "checkpoints kept (older ones are deleted)").within(1, 1000000),
               },
               std::nullopt,
               "",
               false,
               ""});
  s.push_back({"metrics",
               "how throughput and utilisation are computed",
               {
                   floating("peak_tflops", 0.0, "peak TFLOP/s for MFU (0 = from the device table or a CPU measurement)").at_least(0.0),
               },
               std::nullopt,
               "",
               false,
               ""});
  s.push_back({"plugins",
               "where to find plugin libraries beyond the default search path",
               {
                   string_list("paths", {}, "directories of plugin libraries (relative to the experiment file)"),
               },
               std::nullopt,
               "",
               false,
               ""});
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
      string("label", "",
             "what its metrics are called: eval/<label>/<metric> (default: the evaluator's name); "
             "lower-case letters, digits and '_', one per [[eval]]"),
      integer("every", 0,
              "steps between its evaluations (0 = with the validation loss, every run.eval_every steps, "
              "and at the last step)")
          .within(0, 1e12),
      boolean("enabled", true,
              "run it during training (a disabled one is neither read nor run there; `ablate eval "
              "--eval LABEL` runs it on a checkpoint either way)"),
  };
  return keys;
}

}  // namespace ablate
