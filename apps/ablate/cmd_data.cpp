// `ablate data analyze CONFIG [--set k=v ...] [--documents N] [--json]`: what the configured data
// looks like (documents, tokens, length percentiles and histogram) and what each batching strategy
// would make of it at the configured seq_len and batch_size: real and padding fractions, rows per
// batch, segments per row, and the expected speed-up in real tokens over `padded`.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "ablate/runtime/config.hpp"
#include "ablate/data.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/pipeline.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/runtime/session.hpp"
#include "ablate/runtime/trainer.hpp"
#include "commands.hpp"
#include "json_read.hpp"

namespace ablate::cli {

namespace {

// Cycles through documents held in memory: draw k is documents[k % n].
class MemoryFeed final : public DocumentFeed {
 public:
  MemoryFeed(const std::vector<Document>& documents, int32_t eot) : documents_(documents), eot_(eot) {}
  const Document& next() override { return documents_[draws_++ % documents_.size()]; }
  const Document& fetch(uint64_t document) override {
    for (const Document& d : documents_) {
      if (d.index == document) return d;
    }
    throw_runtime_error("data analyze", "document " + std::to_string(document) + " is not among those analyzed");
  }
  int32_t eot_token() const override { return eot_; }
  uint64_t draws() const { return draws_; }

 private:
  const std::vector<Document>& documents_;
  int32_t eot_;
  uint64_t draws_ = 0;
};

struct BatchingResult {
  std::string name;
  uint64_t batches = 0;
  int64_t positions = 0;
  int64_t real_tokens = 0;
  int64_t real_targets = 0;
  int64_t rows = 0;
  int64_t segments = 0;
  double real_fraction() const { return positions ? double(real_tokens) / double(positions) : 0.0; }
  double padding_fraction() const { return 1.0 - real_fraction(); }
  double rows_per_batch() const { return batches ? double(rows) / double(batches) : 0.0; }
  double segments_per_row() const { return rows ? double(segments) / double(rows) : 0.0; }
};

// The batcher's own keys: the experiment's sub-table when it has one, else the schema defaults.
Params own_params(const RunSpec& spec, const ComponentInfo& info) {
  if (auto it = spec.batching_own.find(info.name); it != spec.batching_own.end()) return it->second;
  std::map<std::string, Value, std::less<>> defaults;
  for (const ParamSpec& p : info.schema) defaults[p.name] = p.default_value;
  return Params("batching." + info.name, std::move(defaults));
}

BatchingResult simulate(const RunSpec& spec, const Registry& registry, const ComponentInfo& info,
                        const std::vector<Document>& documents, int32_t eot) {
  const Params& common = spec.require(spec.batching).common;
  const Params own = own_params(spec, info);
  const RunContext run;
  auto batcher = registry.create<Batcher>(Kind::batcher, info.name, {common, own, run});
  MemoryFeed feed(documents, eot);
  BatchingResult r;
  r.name = info.name;
  Batch batch;
  // One pass over the documents (the batcher may hold a few back at the end).
  while (feed.draws() < documents.size()) {
    batcher->next(feed, batch);
    ++r.batches;
    r.positions += batch.positions_total();
    r.real_tokens += batch.real_tokens();
    r.real_targets += batch.real_targets();
    r.rows += batch.rows;
    r.segments += int64_t(batch.segments.size());
  }
  return r;
}

int64_t percentile(const std::vector<int64_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  const auto i = std::size_t(std::llround(q * double(sorted.size() - 1)));
  return sorted[std::min(i, sorted.size() - 1)];
}

// Histogram bins: eight of seq_len / 8, and one for documents longer than a row.
constexpr int kHistogramBins = 9;

// What `data analyze` found: the documents read, their lengths, and each batcher's simulation.
struct DataAnalysis {
  std::shared_ptr<DataSource> source;
  uint64_t available = 0, wanted = 0;
  int64_t tokens = 0;
  std::vector<int64_t> lengths;  // sorted
  int32_t seq_len = 0, batch_size = 0;
  std::vector<BatchingResult> results;  // padded, bucketed, packed
  double padded_real = 0;
  std::vector<int64_t> histogram;
  int64_t width = 1;
  double mean = 0;
};

const std::vector<std::pair<std::string, double>> kQuantiles = {{"p10", 0.10}, {"p25", 0.25}, {"p50", 0.50},
                                                                {"p75", 0.75}, {"p90", 0.90}, {"p99", 0.99}};

// Reads up to `max_documents` train documents in the sampler's order and simulates each batcher on them.
DataAnalysis analyze(const RunSpec& spec, Registry& registry, int64_t max_documents) {
  DataAnalysis a;
  require_batch_memory(spec, 1, "the batcher being simulated");
  RunContext run;
  run.seed = spec.run.seed;
  const Session session(spec, registry, run);
  a.source = session.data_source();
  a.available = a.source->size(Split::train);
  if (a.available == 0) throw_input_error(a.source->describe(), "the train split has no documents");
  a.wanted = std::min<uint64_t>(a.available, uint64_t(max_documents));

  auto sampler = session.sampler();
  sampler->reset(a.available, run.seed, 0, 1);
  std::vector<Document> documents(a.wanted);
  for (uint64_t k = 0; k < a.wanted; ++k) {
    a.source->read(Split::train, sampler->document_at(k), documents[k]);
    a.lengths.push_back(int64_t(documents[k].tokens.size()));
    a.tokens += a.lengths.back();
  }
  std::sort(a.lengths.begin(), a.lengths.end());
  a.seq_len = int32_t(spec.seq_len);
  a.batch_size = int32_t(spec.batch_size);

  for (const char* name : {"padded", "bucketed", "packed"}) {
    const ComponentInfo* info = registry.find(Kind::batcher, name);
    if (info == nullptr) throw_runtime_error("data analyze", std::string("the '") + name + "' batcher plugin is not loaded");
    a.results.push_back(simulate(spec, registry, *info, documents, a.source->eot_token()));
  }
  a.padded_real = a.results.front().real_fraction();

  a.histogram.assign(kHistogramBins, 0);
  a.width = std::max<int64_t>(1, a.seq_len / 8);
  for (int64_t l : a.lengths) {
    a.histogram[std::size_t(l > a.seq_len ? kHistogramBins - 1 : std::min<int64_t>(kHistogramBins - 2, (l - 1) / a.width))]++;
  }
  a.mean = double(a.tokens) / double(a.wanted);
  return a;
}

// The analysis as one JSON object (--json).
void print_analysis_json(const DataAnalysis& a) {
  nlohmann::json out;
  out["source"] = a.source->describe();
  out["documents"] = a.wanted;
  out["documents_in_split"] = a.available;
  out["tokens"] = a.tokens;
  out["seq_len"] = a.seq_len;
  out["batch_size"] = a.batch_size;
  nlohmann::json len;
  len["min"] = a.lengths.front();
  len["max"] = a.lengths.back();
  len["mean"] = a.mean;
  for (const auto& [name, q] : kQuantiles) len[name] = percentile(a.lengths, q);
  len["longer_than_seq_len"] = a.histogram.back();
  out["lengths"] = len;
  for (const BatchingResult& r : a.results) {
    out[r.name] = {{"real_fraction", r.real_fraction()},
                   {"padding_fraction", r.padding_fraction()},
                   {"rows_per_batch", r.rows_per_batch()},
                   {"segments_per_row", r.segments_per_row()},
                   {"batches", r.batches},
                   {"real_tokens", r.real_tokens},
                   {"positions", r.positions},
                   {"speedup_over_padded", a.padded_real > 0 ? r.real_fraction() / a.padded_real : 0.0}};
  }
  std::cout << json_text(out, 2) << "\n";
}

// The analysis as tables: the documents and their lengths, the length histogram, each batcher's result.
void print_analysis_tables(const DataAnalysis& a) {
  const int bins = kHistogramBins;
  const int32_t seq_len = a.seq_len;
  std::printf("%s\n\n", a.source->describe().c_str());
  std::printf("analyzed %llu of %llu train documents (sampler order), %lld tokens\n", static_cast<unsigned long long>(a.wanted),
              static_cast<unsigned long long>(a.available), static_cast<long long>(a.tokens));
  std::printf("length: min %lld, mean %.1f, max %lld;", static_cast<long long>(a.lengths.front()), a.mean,
              static_cast<long long>(a.lengths.back()));
  for (const auto& [name, q] : kQuantiles) std::printf(" %s %lld", name.c_str(), static_cast<long long>(percentile(a.lengths, q)));
  std::printf("\n\nlength histogram (seq_len %d):\n", seq_len);
  const int64_t most = *std::max_element(a.histogram.begin(), a.histogram.end());
  for (int b = 0; b < bins; ++b) {
    char label[64];
    if (b < bins - 1)
      std::snprintf(label, sizeof label, "%5lld-%-5lld", static_cast<long long>(b * a.width + 1),
                    static_cast<long long>(b == 7 ? seq_len : (b + 1) * a.width));
    else std::snprintf(label, sizeof label, "  > %-7d", seq_len);
    const int bar = most ? int(std::lround(50.0 * double(a.histogram[std::size_t(b)]) / double(most))) : 0;
    std::printf("  %s %8lld %5.1f%% %s\n", label, static_cast<long long>(a.histogram[std::size_t(b)]),
                100.0 * double(a.histogram[std::size_t(b)]) / double(a.wanted), std::string(std::size_t(bar), '#').c_str());
  }
  std::printf("\nbatching at seq_len %d, batch_size %d:\n", seq_len, a.batch_size);
  std::printf("  %-9s %8s %8s %10s %10s %10s\n", "batcher", "real", "padding", "rows/batch", "segs/row", "speed-up");
  for (const BatchingResult& r : a.results) {
    std::printf("  %-9s %7.1f%% %7.1f%% %10.1f %10.2f %9.2fx\n", r.name.c_str(), 100.0 * r.real_fraction(),
                100.0 * r.padding_fraction(), r.rows_per_batch(), r.segments_per_row(),
                a.padded_real > 0 ? r.real_fraction() / a.padded_real : 0.0);
  }
  std::printf("\nspeed-up: real tokens per position over padded's (attention cost per position taken as equal)\n");
}

int data_analyze(const Args& args) {
  po::options_description desc("data analyze");
  po::positional_options_description pos;
  add_experiment_options(desc, pos);
  desc.add_options()("documents", int_option("documents", 1, 1000000000000)->default_value(20000),
                     "analyze at most this many documents (in the sampler's order)")("json", po::bool_switch(),
                                                                                     "print one JSON object instead of tables");
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm, "ablate data analyze CONFIG [--set section.key=value ...] [--documents N] [--json]")) {
    return 0;
  }
  Registry registry;
  const Config cfg = load_experiment(vm, registry);
  const DataAnalysis analysis = analyze(RunSpec::from(cfg), registry, vm["documents"].as<int64_t>());
  if (vm["json"].as<bool>()) {
    print_analysis_json(analysis);
    return 0;
  }
  print_analysis_tables(analysis);
  return 0;
}

}  // namespace

int cmd_data(const Args& args) {
  return dispatch("data", args,
                  {{"analyze", data_analyze, "ablate data analyze CONFIG [--set section.key=value ...] [--documents N] [--json]"}});
}

}  // namespace ablate::cli
