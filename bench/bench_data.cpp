// Data pipeline throughput: tokens per second out of every source x batcher, with 1 and 2 reader
// workers, at T = 1024 and B = 64 (by default). The token_shards and text_files inputs are generated
// into a temporary directory first (document lengths lognormal, mean about 500 tokens / bytes).
//
//   bench_data [--json FILE] [--batches N] [--seq-len T] [--batch-size B]
//
// Prints a table and, with --json, writes the measurements as one JSON object.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "ablate/runtime/run_spec.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/pipeline.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/session.hpp"

namespace fs = std::filesystem;

namespace {

struct Options {
  std::string json_path;
  int batches = 400;
  int seq_len = 1024;
  int batch_size = 64;
};

// Lognormal lengths around a median of 400 (mean about 500), clipped to [8, 8192].
std::vector<int> document_lengths(std::size_t total_tokens, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> length(std::log(400.0), 0.7);
  std::vector<int> out;
  std::size_t sum = 0;
  while (sum < total_tokens) {
    const int n = std::clamp(int(length(rng)), 8, 8192);
    out.push_back(n);
    sum += std::size_t(n) + 1;
  }
  return out;
}

// Two llm.c shards of GPT-2-range tokens, each document preceded by eot (50256).
void write_shards(const fs::path& dir, std::size_t tokens_per_shard) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> token(0, 50255);
  for (int s = 0; s < 2; ++s) {
    std::vector<uint16_t> body;
    body.reserve(tokens_per_shard);
    for (int n : document_lengths(tokens_per_shard, 11 + s)) {
      if (body.size() + std::size_t(n) + 1 > tokens_per_shard) break;
      body.push_back(50256);
      for (int i = 0; i < n; ++i) body.push_back(uint16_t(token(rng)));
    }
    std::vector<int32_t> header(256, 0);
    header[0] = 20240520;
    header[1] = 1;
    header[2] = int32_t(body.size());
    char name[32];
    std::snprintf(name, sizeof name, "shard_%02d.bin", s);
    std::ofstream out(dir / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(body.data()), std::streamsize(body.size() * 2));
  }
}

// One text file of paragraphs separated by blank lines.
void write_text(const fs::path& file, std::size_t bytes) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> letter('a', 'z');
  std::string text;
  text.reserve(bytes + 16384);
  for (int n : document_lengths(bytes, 5)) {
    for (int i = 0; i < n; ++i) text.push_back(i % 7 == 6 ? ' ' : char(letter(rng)));
    text += "\n\n";
  }
  std::ofstream(file, std::ios::binary) << text;
}

struct Measurement {
  std::string source, batcher;
  int workers = 0;
  int batches = 0;
  double seconds = 0;
  double tokens_per_s = 0;       // all B*T positions
  double real_tokens_per_s = 0;  // non-padding positions
  double padding_fraction = 0;
  std::string bottleneck;
};

Measurement measure(ablate::Registry& registry, const std::string& source_toml, const std::string& source, const std::string& batcher,
                    int workers, const Options& o) {
  const std::string toml = source_toml + "\n[data]\nname = \"" + source + "\"\nworkers = " + std::to_string(workers) +
                           "\nprefetch = 4\n[sampler]\nname = \"shuffled\"\n[batching]\nname = \"" + batcher +
                           "\"\nbatch_size = " + std::to_string(o.batch_size) + "\nseq_len = " + std::to_string(o.seq_len) + "\n";
  const ablate::Config cfg = ablate::Config::parse(toml, "bench_data", {}, registry);
  ablate::RunContext run;
  run.seed = 1;
  const ablate::RunSpec spec = ablate::RunSpec::from(cfg);
  auto pipeline = ablate::Session(spec, registry, run).pipeline();
  for (int i = 0; i < 5; ++i) pipeline->next();  // warm up: threads started, pages mapped in
  int64_t positions = 0, real = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.batches; ++i) {
    const ablate::Batch& b = pipeline->next().batch;
    positions += b.positions_total();
    real += b.real_tokens();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Measurement m{source,
                batcher,
                workers,
                o.batches,
                seconds,
                double(positions) / seconds,
                double(real) / seconds,
                1.0 - double(real) / double(positions),
                pipeline->stats().bottleneck()};
  return m;
}

// What the trainer pays to take a micro-batch from the pipeline, per batch: a copy of its arrays
// (the trainer's loop until the pipeline handed batches over) against DataPipeline::next_into's
// swap of the buffers. Timed over `reps` hand-overs of one batch of (B, T) into a destination that
// already has the capacity (as the trainer's micro-batches do after the first step).
struct Handover {
  int32_t rows = 0, seq_len = 0;
  int64_t bytes = 0;  // what a copy moves (read once, written once)
  double copy_us = 0, swap_us = 0;
};

volatile int64_t g_handover_sink = 0;

Handover measure_handover(ablate::Batch sample, int reps) {
  Handover h{sample.rows, sample.seq_len, 0, 0, 0};
  const auto array_bytes = [](const auto& v) { return int64_t(v.size() * sizeof(v[0])); };
  h.bytes = array_bytes(sample.tokens) + array_bytes(sample.targets) + array_bytes(sample.positions) +
            array_bytes(sample.segment_ids) + array_bytes(sample.segments) + array_bytes(sample.row_segments);
  ablate::Batch held = sample;  // capacity in place
  int64_t checksum = 0;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    held = sample;
    checksum += held.tokens[std::size_t(i) % held.tokens.size()];
  }
  h.copy_us = 1e6 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) {
    std::swap(held, sample);
    checksum += held.tokens[std::size_t(i) % held.tokens.size()];
  }
  h.swap_us = 1e6 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
  g_handover_sink = checksum;  // the loops' results are used, so neither is optimised away
  return h;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ablate::Error(ablate::ErrorKind::input, "bench_data", a + " needs a value");
      return argv[++i];
    };
    if (a == "--json") o.json_path = value();
    else if (a == "--batches") o.batches = std::stoi(value());
    else if (a == "--seq-len") o.seq_len = std::stoi(value());
    else if (a == "--batch-size") o.batch_size = std::stoi(value());
    else
      throw ablate::Error(ablate::ErrorKind::input, "bench_data",
                          "unknown argument " + a + " (--json FILE --batches N --seq-len T --batch-size B)");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    ablate::Registry registry;
    registry.load_directories(ablate::Registry::default_search_path());
    const fs::path dir = fs::temp_directory_path() / ("ablate-bench-data-" + std::to_string(::getpid()));
    fs::create_directories(dir);
    write_shards(dir, 20'000'000);
    write_text(dir / "corpus.txt", 40'000'000);
    const std::vector<std::pair<std::string, std::string>> sources = {
        {"token_shards", "[data.token_shards]\npaths = [\"" + (dir / "shard_*.bin").string() + "\"]"},
        {"text_files", "[data.text_files]\npaths = [\"" + (dir / "corpus.txt").string() + "\"]\nseparator = \"\\n\\n\""},
        {"synthetic_probes", "[data.synthetic_probes]\ndocuments = 1000000"},
    };
    std::vector<Measurement> results;
    std::printf("data pipeline throughput, T = %d, B = %d, %d batches per cell (%u hardware threads)\n\n", o.seq_len, o.batch_size,
                o.batches, std::thread::hardware_concurrency());
    std::printf("%-17s %-9s %7s %14s %16s %9s  %s\n", "source", "batcher", "workers", "tokens/s", "real tokens/s", "padding",
                "bottleneck");
    for (const auto& [source, toml] : sources) {
      for (const char* batcher : {"padded", "bucketed", "packed"}) {
        for (int workers : {1, 2}) {
          const Measurement m = measure(registry, toml, source, batcher, workers, o);
          std::printf("%-17s %-9s %7d %14.3e %16.3e %8.1f%%  %s\n", m.source.c_str(), m.batcher.c_str(), m.workers, m.tokens_per_s,
                      m.real_tokens_per_s, 100.0 * m.padding_fraction, m.bottleneck.c_str());
          std::fflush(stdout);
          results.push_back(m);
        }
      }
    }
    fs::remove_all(dir);

    // The hand-over: a packed batch of synthetic probes at the run's (B, T) and at the quickstart's.
    std::vector<Handover> handovers;
    for (const auto& [b, t] : {std::pair{o.batch_size, o.seq_len}, std::pair{8, 256}}) {
      const std::string toml =
          "[data]\nname = \"synthetic_probes\"\nworkers = 0\n[batching]\nname = \"packed\"\nbatch_size = " + std::to_string(b) +
          "\nseq_len = " + std::to_string(t) + "\n";
      ablate::RunContext run;
      run.seed = 1;
      const ablate::RunSpec spec = ablate::RunSpec::from(ablate::Config::parse(toml, "bench_data", {}, registry));
      auto pipeline = ablate::Session(spec, registry, run).pipeline();
      ablate::Batch taken;
      pipeline->next_into(taken);
      handovers.push_back(measure_handover(taken, int(std::max<int64_t>(50, 20'000'000 / (int64_t(b) * t)))));
    }
    std::printf("\nhanding a micro-batch to the trainer (per batch): a copy of its arrays, as before, against next_into's swap\n");
    std::printf("%6s %6s %12s %10s %10s\n", "B", "T", "bytes", "copy us", "swap us");
    for (const Handover& h : handovers) {
      std::printf("%6d %6d %12lld %10.2f %10.3f\n", h.rows, h.seq_len, static_cast<long long>(h.bytes), h.copy_us, h.swap_us);
    }
    if (!o.json_path.empty()) {
      nlohmann::json j;
      j["seq_len"] = o.seq_len;
      j["batch_size"] = o.batch_size;
      j["batches"] = o.batches;
      j["hardware_threads"] = std::thread::hardware_concurrency();
      for (const Measurement& m : results) {
        j["results"].push_back({{"source", m.source},
                                {"batcher", m.batcher},
                                {"workers", m.workers},
                                {"seconds", m.seconds},
                                {"tokens_per_s", m.tokens_per_s},
                                {"real_tokens_per_s", m.real_tokens_per_s},
                                {"padding_fraction", m.padding_fraction},
                                {"bottleneck", m.bottleneck}});
      }
      for (const Handover& h : handovers) {
        j["handover"].push_back(
            {{"rows", h.rows}, {"seq_len", h.seq_len}, {"bytes", h.bytes}, {"copy_us", h.copy_us}, {"swap_us", h.swap_us}});
      }
      std::ofstream(o.json_path) << j.dump(2) << "\n";
      std::printf("\nwrote %s\n", o.json_path.c_str());
    }
    return 0;
  } catch (const ablate::Error& e) {
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return 1;
  }
}
