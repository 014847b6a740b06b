// Data source tests: token_shards (documents split on eot, the splits, and every malformed input
// named by file and offset), text_files (separators, splits), synthetic_probes (determinism,
// vocabulary, the length distribution).
#include <algorithm>
#include <fstream>
#include <sstream>
#include <thread>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "ablate/runtime/session.hpp"
#include "data_test_support.hpp"

using namespace ablate;
using namespace ablate::test;

namespace {

std::shared_ptr<DataSource> source_from(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  const Config cfg = data_config(toml, overrides);
  const ablate::RunSpec spec = ablate::RunSpec::from(cfg);
  return ablate::Session(spec, data_registry(), RunContext{}).data_source();
}

std::string shards_toml(const std::string& paths, const std::string& extra = "") {
  return "[data]\nname = \"token_shards\"\n[data.token_shards]\npaths = [" + paths + "]\neot = 0\nvocab_size = 100\n" + extra;
}

std::vector<int32_t> read_tokens(const DataSource& s, Split split, uint64_t i) {
  Document d;
  s.read(split, i, d);
  return d.tokens;
}

// The message of the input error `make` throws.
template <class F>
std::string input_error_of(F&& make) {
  try {
    make();
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::input);
    return e.what();
  }
  FAIL("no error was thrown");
  return {};
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// What spdlog warns while `make` runs.
template <class F>
std::string warnings_of(F&& make) {
  std::ostringstream text;
  auto previous = spdlog::default_logger();
  auto capture = std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(text));
  spdlog::set_default_logger(capture);
  try {
    make();
  } catch (...) {
    spdlog::set_default_logger(previous);
    throw;
  }
  spdlog::set_default_logger(previous);
  return text.str();
}

void write_text(const std::filesystem::path& p, const std::string& text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

}  // namespace

TEST_CASE("token_shards splits documents on eot and skips empty ones") {
  TempDir dir;
  write_shard(dir.path() / "a.bin", {0, 1, 2, 3, 0, 4, 5, 0, 0, 6});
  write_shard(dir.path() / "b.bin", {7, 8, 0});
  const auto src = source_from(shards_toml("\"" + (dir.path() / "*.bin").string() + "\""));
  REQUIRE(src->size(Split::train) == 4);
  CHECK(src->size(Split::validation) == 0);
  CHECK(read_tokens(*src, Split::train, 0) == std::vector<int32_t>{1, 2, 3});
  CHECK(read_tokens(*src, Split::train, 1) == std::vector<int32_t>{4, 5});
  CHECK(read_tokens(*src, Split::train, 2) == std::vector<int32_t>{6});
  CHECK(read_tokens(*src, Split::train, 3) == std::vector<int32_t>{7, 8});
  CHECK(src->eot_token() == 0);
  CHECK(src->vocab_size() == 100);
}

TEST_CASE("token_shards takes validation from val_paths") {
  TempDir dir;
  write_shard(dir.path() / "train.bin", {0, 1, 0, 2});
  write_shard(dir.path() / "val.bin", {0, 9, 9});
  const auto src = source_from(
      shards_toml("\"" + (dir.path() / "train.bin").string() + "\"", "val_paths = [\"" + (dir.path() / "val.bin").string() + "\"]\n"));
  CHECK(src->size(Split::train) == 2);
  REQUIRE(src->size(Split::validation) == 1);
  CHECK(read_tokens(*src, Split::validation, 0) == std::vector<int32_t>{9, 9});
}

TEST_CASE("token_shards holds out the last documents with validation_fraction") {
  TempDir dir;
  write_shard(dir.path() / "a.bin", {0, 1, 0, 2, 0, 3});
  write_shard(dir.path() / "b.bin", {0, 4, 0, 5});
  const auto src = source_from(shards_toml("\"" + (dir.path() / "*.bin").string() + "\"", "validation_fraction = 0.4\n"));
  REQUIRE(src->size(Split::train) == 3);
  REQUIRE(src->size(Split::validation) == 2);
  CHECK(read_tokens(*src, Split::train, 2) == std::vector<int32_t>{3});
  CHECK(read_tokens(*src, Split::validation, 0) == std::vector<int32_t>{4});
  CHECK(read_tokens(*src, Split::validation, 1) == std::vector<int32_t>{5});
}

TEST_CASE("token_shards names the file of a wrong magic") {
  TempDir dir;
  write_shard(dir.path() / "bad.bin", {0, 1}, 12345);
  const std::string msg = input_error_of([&] { source_from(shards_toml("\"" + (dir.path() / "bad.bin").string() + "\"")); });
  CHECK(contains(msg, "bad.bin:offset 0"));
  CHECK(contains(msg, "magic"));
}

TEST_CASE("token_shards names the file of a wrong version") {
  TempDir dir;
  write_shard(dir.path() / "v2.bin", {0, 1}, 20240520, 2);
  const std::string msg = input_error_of([&] { source_from(shards_toml("\"" + (dir.path() / "v2.bin").string() + "\"")); });
  CHECK(contains(msg, "v2.bin:offset 4"));
  CHECK(contains(msg, "version 2"));
}

TEST_CASE("token_shards names the file and offset of a truncated body") {
  TempDir dir;
  write_shard(dir.path() / "short.bin", {0, 1, 2}, 20240520, 1, 10);
  const std::string msg = input_error_of([&] { source_from(shards_toml("\"" + (dir.path() / "short.bin").string() + "\"")); });
  CHECK(contains(msg, "short.bin:offset 1030"));
  CHECK(contains(msg, "truncated"));
}

TEST_CASE("token_shards names the file of a truncated header") {
  TempDir dir;
  dir.write("tiny.bin", "abc");
  const std::string msg = input_error_of([&] { source_from(shards_toml("\"" + (dir.path() / "tiny.bin").string() + "\"")); });
  CHECK(contains(msg, "tiny.bin"));
  CHECK(contains(msg, "truncated header"));
}

TEST_CASE("token_shards names the file and offset of a token outside the vocabulary") {
  TempDir dir;
  write_shard(dir.path() / "oov.bin", {0, 1, 2, 100, 3});
  const std::string msg = input_error_of([&] { source_from(shards_toml("\"" + (dir.path() / "oov.bin").string() + "\"")); });
  CHECK(contains(msg, "oov.bin:offset 1030"));  // header 1024 + 3 tokens * 2 bytes
  CHECK(contains(msg, "token 100"));
}

TEST_CASE("token_shards names a missing file") {
  TempDir dir;
  const std::string msg = input_error_of([&] { source_from(shards_toml("\"" + (dir.path() / "absent.bin").string() + "\"")); });
  CHECK(contains(msg, "absent.bin"));
  CHECK(contains(msg, "no such file"));
}

TEST_CASE("token_shards names a glob that matches nothing") {
  TempDir dir;
  const std::string msg = input_error_of([&] { source_from(shards_toml("\"" + (dir.path() / "*.bin").string() + "\"")); });
  CHECK(contains(msg, "*.bin"));
  CHECK(contains(msg, "matches no file"));
}

TEST_CASE("token_shards refuses a data set without documents") {
  TempDir dir;
  write_shard(dir.path() / "eots.bin", {0, 0, 0});
  const std::string msg = input_error_of([&] { source_from(shards_toml("\"" + (dir.path() / "eots.bin").string() + "\"")); });
  CHECK(contains(msg, "eots.bin"));
  CHECK(contains(msg, "empty data set"));
}

TEST_CASE(
    "token_shards warns of an eot that never occurs, a vocabulary far above the ids in use, and a fraction that holds out nothing") {
  TempDir dir;
  write_shard(dir.path() / "bytes.bin", {104, 105, 33, 10, 104, 111});  // byte-level text, no eot 0
  const std::string glob = "\"" + (dir.path() / "bytes.bin").string() + "\"";
  const std::string w =
      warnings_of([&] { source_from(shards_toml(glob, "validation_fraction = 0.1\n"), {"data.token_shards.vocab_size=50257"}); });
  CHECK(contains(w, "data.token_shards.eot: token 0 never occurs in the 6 tokens"));
  CHECK(contains(w, "data.token_shards.vocab_size: the shards use ids 0..111 only but vocab_size is 50257"));
  CHECK(contains(w, "data.token_shards.validation_fraction"));
  // Data that fits its settings: no warning.
  write_shard(dir.path() / "ok.bin", {0, 51, 52, 0, 53, 99, 0});
  CHECK(warnings_of([&] { source_from(shards_toml("\"" + (dir.path() / "ok.bin").string() + "\"")); }).empty());
}

TEST_CASE("token_shards decodes samples with the GPT-2 tokenizer files beside its shards, and as separated ids without") {
  TempDir dir;
  write_shard(dir.path() / "a.bin", {0, 1, 2, 3, 0});
  const std::string glob = "\"" + (dir.path() / "a.bin").string() + "\"";
  // No tokenizer: ids, one space between each.
  CHECK(source_from(shards_toml(glob))->decode({13, 198, 2}) == "13 198 2");
  // encoder.json: GPT-2's byte table writes a space as U+0120 and a newline as U+010A.
  write_text(dir.path() / "tokenizer" / "encoder.json",
             "{\"<|endoftext|>\": 0, \"Hello\": 1, \"\u0120world\": 2, \"\u010a\": 3, \"caf\u00c3\u00a9\": 4}");
  const auto with_json = source_from(shards_toml(glob));
  CHECK(with_json->decode({1, 2, 3}) == "Hello world\n");
  CHECK(with_json->decode({4}) == "caf\xc3\xa9");  // the two bytes of UTF-8 "é"
  CHECK(with_json->decode({0, 1, 7}) == "<|endoftext|>Hello<|7|>");
  CHECK(contains(with_json->describe(), "encoder.json"));
  CHECK(source_from(shards_toml(glob, "tokenizer = \"none\"\n"))->decode({1, 2}) == "1 2");
  // gpt2.tiktoken in a directory named by the key: base64 bytes and the id.
  write_text(dir.path() / "tik" / "gpt2.tiktoken", "SGVsbG8= 1\nIHdvcmxk 2\nCg== 3\n");
  const auto with_tik = source_from(shards_toml(glob, "tokenizer = \"" + (dir.path() / "tik").string() + "\"\n"));
  CHECK(with_tik->decode({1, 2, 3}) == "Hello world\n");
  // Malformed files and a directory without them: input errors naming the file or key.
  write_text(dir.path() / "bad" / "encoder.json", "{\"x\": 1, \"y\": 1}");
  CHECK(contains(input_error_of([&] { source_from(shards_toml(glob, "tokenizer = \"" + (dir.path() / "bad").string() + "\"\n")); }),
                 "appears twice"));
  write_text(dir.path() / "big" / "gpt2.tiktoken", "SGVsbG8= 100\n");
  CHECK(contains(input_error_of([&] { source_from(shards_toml(glob, "tokenizer = \"" + (dir.path() / "big").string() + "\"\n")); }),
                 "gpt2.tiktoken:1"));
  CHECK(contains(input_error_of([&] { source_from(shards_toml(glob, "tokenizer = \"" + dir.path().string() + "\"\n")); }),
                 "data.token_shards.tokenizer"));
}

TEST_CASE(
    "token_shards encodes prompts by the tokenizer's merges (vocab.bpe, or derived from gpt2.tiktoken) and refuses malformed tokenizer files") {
  TempDir dir;
  write_shard(dir.path() / "a.bin", {0, 1, 299, 0});  // ids up to the vocabulary's: no warning
  const std::string glob = "\"" + (dir.path() / "a.bin").string() + "\"";
  const auto source_with = [&](const std::string& sub) {
    return source_from(shards_toml(glob, "tokenizer = \"" + (dir.path() / sub).string() + "\"\n"),
                       {"data.token_shards.vocab_size=300"});
  };
  const auto error_with = [&](const std::string& sub) { return input_error_of([&] { source_with(sub); }); };
  // Every byte its own id, then the merges "a b" -> 256, "b c" -> 257, "ab c" -> 258, "a a" -> 259.
  const char* base64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string encoder = "{", tiktoken;
  for (int b = 0; b < 256; ++b) {
    const std::string spelled = ablate::test::gpt2_spelling(std::string(1, char(b)));
    encoder += std::string("\"") + (spelled == "\"" || spelled == "\\" ? "\\" : "") + spelled + "\": " + std::to_string(b) + ", ";
    tiktoken += std::string{base64[b >> 2], base64[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  }
  encoder += "\"ab\": 256, \"bc\": 257, \"abc\": 258, \"aa\": 259}";
  const std::string merges = "#version: 0.2\na b\nb c\nab c\na a\n";
  tiktoken += "YWI= 256\nYmM= 257\nYWJj 258\nYWE= 259\n";
  write_text(dir.path() / "bpe" / "encoder.json", encoder);
  write_text(dir.path() / "bpe" / "vocab.bpe", merges);
  write_text(dir.path() / "tik" / "gpt2.tiktoken", tiktoken);
  for (const char* sub : {"bpe", "tik"}) {
    CAPTURE(sub);
    const auto src = source_with(sub);
    CHECK(src->encode("abc") == std::vector<int32_t>{258});
    CHECK(src->encode("aaa") == std::vector<int32_t>{259, 'a'});  // the leftmost of equal pairs first
    CHECK(src->encode("aaaa") == std::vector<int32_t>{259, 259});
    CHECK(src->encode("bcab") == std::vector<int32_t>{257, 256});                // the lower rank first, though right of the other
    CHECK(src->encode("xabc abc") == std::vector<int32_t>{'x', 258, ' ', 258});  // "xabc", " abc"
    CHECK(src->encode("a\xff") == std::vector<int32_t>{'a', 0xff});              // a byte that is not UTF-8 stays a byte
    CHECK(src->decode(src->encode("aaab cab\n")) == "aaab cab\n");
  }

  // The same bytes under two ids (here a byte mapped twice).
  write_text(dir.path() / "twice" / "gpt2.tiktoken", tiktoken + "YQ== 260\n");
  const std::string twice = error_with("twice");
  CHECK(contains(twice, "gpt2.tiktoken:261"));
  CHECK(contains(twice, "the same bytes as token id 97"));
  // A key repeated in encoder.json (JSON parsers keep one of the values).
  write_text(dir.path() / "key" / "encoder.json", "{\"a\": 1, \"b\": 2, \"a\": 3}");
  CHECK(contains(error_with("key"), "encoder.json: entry \"a\": appears twice"));
  // encoder.json cut short.
  write_text(dir.path() / "cut_json" / "encoder.json", encoder.substr(0, encoder.size() / 2));
  CHECK(contains(error_with("cut_json"), "encoder.json: not valid JSON"));
  // vocab.bpe cut short: a merge missing, a merge cut in two, the header alone.
  const auto with_merges = [&](const std::string& sub, const std::string& text) {
    write_text(dir.path() / sub / "encoder.json", encoder);
    write_text(dir.path() / sub / "vocab.bpe", text);
    return error_with(sub);
  };
  const std::string missing = with_merges("missing", "#version: 0.2\na b\nb c\nab c\n");
  CHECK(contains(missing, "vocab.bpe: 3 merges, but"));
  CHECK(contains(missing, "has 4 tokens of two or more bytes"));
  CHECK(contains(with_merges("half", "#version: 0.2\na b\nb c\nab c\na"), "vocab.bpe:5: expected a merge"));
  CHECK(contains(with_merges("header", "#version: 0.2\n"), "vocab.bpe: 0 merges"));
  CHECK(contains(with_merges("no_header", "a b\nb c\nab c\na a\n"), "vocab.bpe:1: expected the \"#version\" line"));
  // Merges in another order than the ids, or joining a token no earlier line makes.
  CHECK(contains(with_merges("order", "#version: 0.2\nb c\na b\nab c\na a\n"), "vocab.bpe:2: merge \"b c\" should make token 256"));
  write_text(dir.path() / "later" / "encoder.json", encoder.substr(0, encoder.find("\"ab\"")) + "\"abc\": 256, \"ab\": 257}");
  write_text(dir.path() / "later" / "vocab.bpe", "#version: 0.2\nab c\na b\n");
  CHECK(contains(error_with("later"), "vocab.bpe:2: merge \"ab c\" joins a token that no earlier line makes"));
}

TEST_CASE("token_shards reports one group per paths pattern, and a mixture over them draws by weight") {
  TempDir dir;
  write_shard(dir.path() / "web_0.bin", {0, 1, 0, 2, 0, 3, 0, 4});  // 4 documents
  write_shard(dir.path() / "web_1.bin", {0, 5, 0, 6});              // 2
  write_shard(dir.path() / "code_0.bin", {0, 7, 7, 0, 8});          // 2
  const std::string paths = "\"" + (dir.path() / "web_*.bin").string() + "\", \"" + (dir.path() / "code_*.bin").string() + "\"";
  const auto src = source_from(shards_toml(paths));
  const auto groups = src->groups(Split::train);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].first == 0);
  CHECK(groups[0].documents == 6);
  CHECK(groups[1].first == 6);
  CHECK(groups[1].documents == 2);
  CHECK(contains(groups[1].name, "code_*.bin"));
  // Through the pipeline: half of the draws from the 2 code documents.
  const Config cfg = data_config(shards_toml(paths, "[sampler]\nname = \"mixture\"\n[sampler.mixture]\nweights = [1.0, 1.0]\n"));
  RunContext run;
  auto sampler = ablate::Session(ablate::RunSpec::from(cfg), data_registry(), run).sampler();
  sampler->set_groups(groups);
  sampler->reset(src->size(Split::train), 3, 0, 1);
  int code = 0;
  for (uint64_t d = 0; d < 100; ++d) code += sampler->document_at(d) >= 6 ? 1 : 0;
  CHECK(code == 50);
}

TEST_CASE("text_files makes one document per file without a separator") {
  TempDir dir;
  dir.write("a.txt", "hi");
  dir.write("b.txt", "");
  dir.write("c.txt", "\xff!");
  const auto src =
      source_from("[data]\nname = \"text_files\"\n[data.text_files]\npaths = [\"" + (dir.path() / "*.txt").string() + "\"]\n");
  REQUIRE(src->size(Split::train) == 2);
  CHECK(read_tokens(*src, Split::train, 0) == std::vector<int32_t>{'h', 'i'});
  CHECK(read_tokens(*src, Split::train, 1) == std::vector<int32_t>{255, '!'});
  CHECK(src->vocab_size() == 257);
  CHECK(src->eot_token() == 256);
}

TEST_CASE("text_files splits on the separator and holds out the last documents") {
  TempDir dir;
  dir.write("a.txt", "one\n\ntwo\n\n\n\nthree\n\nfour");
  const auto src = source_from("[data]\nname = \"text_files\"\n[data.text_files]\npaths = [\"" + (dir.path() / "a.txt").string() +
                               "\"]\nseparator = \"\\n\\n\"\nvalidation_fraction = 0.25\n");
  REQUIRE(src->size(Split::train) == 3);
  REQUIRE(src->size(Split::validation) == 1);
  CHECK(read_tokens(*src, Split::train, 1) == std::vector<int32_t>{'t', 'w', 'o'});
  CHECK(read_tokens(*src, Split::validation, 0) == std::vector<int32_t>{'f', 'o', 'u', 'r'});
}

TEST_CASE("synthetic_probes documents are a pure function of seed and index") {
  const std::string toml = "[data]\nname = \"synthetic_probes\"\n[data.synthetic_probes]\ndocuments = 500\n";
  const auto a = source_from(toml);
  const auto b = source_from(toml);
  const auto other_seed = source_from(toml, {"data.synthetic_probes.seed=99"});
  std::vector<std::vector<int32_t>> from_threads(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) threads.emplace_back([&, t] { from_threads[std::size_t(t)] = read_tokens(*a, Split::train, 123); });
  for (auto& t : threads) t.join();
  const auto doc = read_tokens(*b, Split::train, 123);
  for (const auto& d : from_threads) CHECK(d == doc);
  CHECK(read_tokens(*other_seed, Split::train, 123) != doc);
  CHECK(read_tokens(*a, Split::validation, 123) != doc);
}

TEST_CASE("synthetic_probes lengths resemble probe logs and tokens stay in the vocabulary") {
  const auto src = source_from("[data]\nname = \"synthetic_probes\"\n[data.synthetic_probes]\ndocuments = 2000\n");
  std::vector<int32_t> lengths;
  for (uint64_t i = 0; i < src->size(Split::train); ++i) {
    const auto t = read_tokens(*src, Split::train, i);
    lengths.push_back(int32_t(t.size()));
    for (int32_t tok : t) {
      REQUIRE(tok >= 0);
      REQUIRE(tok < src->vocab_size());
      REQUIRE(tok != src->eot_token());
    }
  }
  std::sort(lengths.begin(), lengths.end());
  double mean = 0;
  for (int32_t l : lengths) mean += l;
  mean /= double(lengths.size());
  CHECK(mean > 220);
  CHECK(mean < 280);
  CHECK(lengths[lengths.size() / 10] > 100);      // p10
  CHECK(lengths[lengths.size() * 9 / 10] < 400);  // p90
  CHECK(lengths.back() <= 1024);
}
