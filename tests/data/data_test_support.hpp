// Helpers of the data tests: a registry with the built plugins, configs from TOML text, llm.c
// shards written byte by byte (also malformed ones), an in-memory document feed whose tokens encode
// (document, offset) so a test can tell where every placed token came from, and a batch checker.
#pragma once

#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ablate/runtime/session.hpp"
#include "ablate/runtime/run_spec.hpp"
#include "ablate/runtime/config.hpp"
#include "ablate/data.hpp"
#include "ablate/data_util.hpp"
#include "ablate/runtime/pipeline.hpp"
#include "ablate/runtime/registry.hpp"
#include "test_support.hpp"

namespace ablate::test {

inline Registry& data_registry() {
  static Registry* registry = [] {
    auto* r = new Registry();
    r->load_directories({plugin_dir()});
    return r;
  }();
  return *registry;
}

inline Config data_config(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  return Config::parse(toml, "test.toml", overrides, data_registry());
}

// Writes an llm.c shard: header (magic, version, count) then uint16 tokens. `header_count` < 0
// means the real count; `body_tokens` lets a test write fewer tokens than the header says.
inline void write_shard(const std::filesystem::path& path, const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                        int32_t version = 1, int64_t header_count = -1) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = int32_t(header_count < 0 ? int64_t(tokens.size()) : header_count);
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), std::streamsize(header.size() * 4));
  out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
}

// Token of document d at offset i: decodable, never 0.
constexpr int32_t kOffsetsPerDocument = 100000;
inline int32_t encode_token(uint64_t doc, int32_t offset) { return int32_t(doc) * kOffsetsPerDocument + offset + 1; }
inline uint64_t token_document(int32_t token) { return uint64_t((token - 1) / kOffsetsPerDocument); }
inline int32_t token_offset(int32_t token) { return (token - 1) % kOffsetsPerDocument; }

// An endless feed: draw k is document k, whose length is lengths[k % lengths.size()].
class EncodedFeed final : public DocumentFeed {
 public:
  EncodedFeed(std::vector<int32_t> lengths, int32_t eot) : lengths_(std::move(lengths)), eot_(eot) {}
  const Document& next() override {
    current_ = fetch(draws_++);
    return current_;
  }
  const Document& fetch(uint64_t document) override {
    Document& d = fetched_;
    d.index = document;
    d.tokens.clear();
    const int32_t n = lengths_[document % lengths_.size()];
    for (int32_t i = 0; i < n; ++i) d.tokens.push_back(encode_token(document, i));
    return d;
  }
  int32_t eot_token() const override { return eot_; }
  uint64_t draws() const { return draws_; }
  int32_t length(uint64_t document) const { return lengths_[document % lengths_.size()]; }

 private:
  std::vector<int32_t> lengths_;
  Document fetched_;
  int32_t eot_;
  uint64_t draws_ = 0;
  Document current_;
};

inline std::unique_ptr<Batcher> batcher_from(const std::string& toml) {
  const Config cfg = data_config(toml);
  RunContext run;
  const ablate::RunSpec spec = ablate::RunSpec::from(cfg);
  return ablate::Session(spec, data_registry(), run).batcher();
}

// The sampler `name`, with `own` as its [sampler.<name>] keys.
inline std::unique_ptr<Sampler> sampler_from(const std::string& name, const std::string& own = "") {
  const Config cfg =
      data_config("[sampler]\nname = \"" + name + "\"\n" + (own.empty() ? "" : "[sampler." + name + "]\n" + own + "\n"));
  RunContext run;
  const ablate::RunSpec spec = ablate::RunSpec::from(cfg);
  return ablate::Session(spec, data_registry(), run).sampler();
}

// Checks the batch contract on a batch built from an EncodedFeed and records every placed token
// (document, offset) into `placed` (failing on a token placed twice).
inline void check_batch(const Batch& b, int32_t max_t, int32_t final_target, const EncodedFeed& feed,
                        std::set<std::pair<uint64_t, int32_t>>& placed) {
  REQUIRE(b.seq_len <= max_t);
  REQUIRE(b.tokens.size() == std::size_t(b.rows) * std::size_t(b.seq_len));
  REQUIRE(b.row_segments.size() == std::size_t(b.rows) + 1);
  REQUIRE(b.row_segments.front() == 0);
  REQUIRE(std::size_t(b.row_segments.back()) == b.segments.size());
  for (int32_t r = 0; r < b.rows; ++r) {
    const std::size_t row = std::size_t(r) * std::size_t(b.seq_len);
    int32_t column = 0;
    for (int32_t s = b.row_segments[r]; s < b.row_segments[r + 1]; ++s) {
      const Segment seg = b.segments[std::size_t(s)];
      REQUIRE(seg.start == column);  // segments are left-aligned, in order, without gaps
      REQUIRE(seg.length > 0);
      REQUIRE(seg.start + seg.length <= b.seq_len);
      const int32_t first = b.tokens[row + std::size_t(seg.start)];
      const uint64_t doc = token_document(first);
      const int32_t begin = token_offset(first);
      const int32_t doc_length = feed.length(doc);
      for (int32_t i = 0; i < seg.length; ++i) {
        const std::size_t p = row + std::size_t(seg.start + i);
        REQUIRE(b.tokens[p] == encode_token(doc, begin + i));
        REQUIRE(b.positions[p] == i);
        REQUIRE(b.segment_ids[p] == s - b.row_segments[r] + 1);
        const bool last_of_document = begin + i + 1 == doc_length;
        const int32_t expected = last_of_document ? final_target : encode_token(doc, begin + i + 1);
        REQUIRE(b.targets[p] == expected);  // never the next segment's token
        REQUIRE(placed.insert({doc, begin + i}).second);
      }
      column += seg.length;
    }
    for (int32_t c = column; c < b.seq_len; ++c) {
      const std::size_t p = row + std::size_t(c);
      REQUIRE(b.segment_ids[p] == 0);
      REQUIRE(b.targets[p] == -1);
      REQUIRE(b.positions[p] == 0);
      REQUIRE(b.tokens[p] == 0);
    }
  }
}

}  // namespace ablate::test
