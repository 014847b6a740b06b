// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// The components an experiment gets when it names none, and those core falls back on: the one
// place in core that names plugins. Everything else in core knows plugins only through the
// registry and the experiment's keys (tests/core/core_names_no_plugin.py fails where another file
// of core names one). The schema's defaults (config_sections.cpp) and ModelOptions' take these.
#pragma once

#include <initializer_list>

namespace ablate::defaults {

// [data] name, [sampler] name, [batching] name, [attention] name, [optimizer] name, [schedule]
// name, [logging] sinks.
inline constexpr const char* data_source = "synthetic_probes";
inline constexpr const char* sampler = "shuffled";
inline constexpr const char* batcher = "packed";
inline constexpr const char* attention = "naive_cpu";
inline constexpr const char* optimizer = "adamw";
inline constexpr const char* schedule = "cosine";
inline constexpr std::initializer_list<const char*> loggers = {"console", "jsonl"};

// [model]'s layers: the token embedding, the block's norm, MLP and position encoding, the
// attention's projections, the classifier with its loss, and the norm qk_norm applies.
inline constexpr const char* embedding = "embedding";
inline constexpr const char* norm = "layernorm";
inline constexpr const char* mlp = "gelu_mlp";
inline constexpr const char* position = "learned";
inline constexpr const char* linear = "linear";
inline constexpr const char* classifier = "cross_entropy";
inline constexpr const char* qk_norm_layer = "rmsnorm";

// The communicator of a job of one process (run.communicator = "auto" without a launcher's ranks).
inline constexpr const char* one_process_communicator = "single";
// The cpu device's collective (DeviceCapabilities::collective).
inline constexpr const char* host_collective = "mpi";
// The attention backend that reads any checkpoint on the cpu (every backend computes the same
// function, so a GPU run's checkpoint is evaluated with it on a machine without one).
inline constexpr const char* cpu_attention = "naive";

}  // namespace ablate::defaults
