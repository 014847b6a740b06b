// The JSON and JSONL files of a run (run.json, summary.json, metrics.jsonl) and of a sweep
// (arms.json, each arm's arm.json) as `ablate report`, `ablate doctor` and a re-run of
// `ablate sweep` read them: a damaged one (not JSON, cut short, a field of the wrong type or out of
// range, nested past the bound, a megabyte string, a bad line amid metrics.jsonl) is exit 2 naming
// the file (and the line) and the field, in a message of bounded length, and no file already saved
// changes. A directory name that is not UTF-8 reaches the JSON these commands write without a crash.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_support.hpp"

using namespace ablate::test;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

bool have_matplotlib() { return run_command("python3 -c 'import matplotlib'").exit_code == 0; }

// A file of a run or sweep, the commands that read it, and fields of it those commands use (""
// where the file has none of that kind).
struct Target {
  std::string file;                   // relative to a case's directory
  std::vector<std::string> commands;  // DIR stands for the case's directory
  std::string number;                 // a number
  std::string text;                   // a string
  std::string count;                  // a non-negative integer
  std::string list;                   // a list
};

// One way of damaging a file: its new text (for a .jsonl file, that of its second line) and what
// the message must say besides the file's name.
struct Damaged {
  std::string name;
  std::string text;
  std::vector<std::string> says;
};

std::string nested(int levels) { return std::string(std::size_t(levels), '[') + "1" + std::string(std::size_t(levels), ']'); }

std::vector<Damaged> damaged_versions(const Target& t, const std::string& text) {
  const json original = json::parse(text);
  const auto with = [&](const std::string& key, const json& value) {
    json j = original;
    j[key] = value;
    return j.dump();
  };
  const auto quoted = [](const std::string& key) { return "'" + key + "'"; };
  const std::string number = t.number.empty() ? t.count : t.number;
  const std::string string_field = t.text.empty() ? number : t.text;
  std::vector<Damaged> out = {{"not JSON", "this is not JSON", {}}, {"cut short", text.substr(0, text.size() / 2), {}}};
  if (!number.empty()) {
    out.push_back({"a string for a number", with(number, "fast"), {quoted(number), "\"fast\""}});
    // Deeper than any file ablate writes, in a field the readers use.
    out.push_back({"nested past the bound",
                   substitute(with(number, 0), "\"" + number + "\":0", "\"" + number + "\":" + nested(100)),
                   {"nests deeper than"}});
  }
  if (!t.text.empty()) out.push_back({"an object for a string", with(t.text, json{{"a", 1}}), {quoted(t.text), "object"}});
  if (!t.count.empty()) out.push_back({"a negative count", with(t.count, -3), {quoted(t.count), "-3"}});
  if (!t.list.empty()) out.push_back({"a string for a list", with(t.list, "a"), {quoted(t.list)}});
  if (!string_field.empty()) {
    out.push_back(
        {"a megabyte string", with(string_field, std::string(std::size_t(1) << 20, 'x')), {quoted(string_field), "(1048576 bytes)"}});
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// For each target and each of its damages, a fresh copy of `parts` of `root` with the file damaged,
// then each command that reads it: exit 2 naming the file (with ":2" for the second line of a
// .jsonl file) and what the damage should say, no line of output longer than 600 bytes, and every
// file as it was. Returns the number of commands run.
int check_damages(const fs::path& root, const std::vector<std::string>& parts, const std::vector<Target>& targets) {
  int n = 0, commands = 0;
  for (const Target& t : targets) {
    const bool jsonl = fs::path(t.file).extension() == ".jsonl";
    const std::string text = slurp(root / t.file);
    std::vector<std::string> lines = split_lines(text);
    REQUIRE(lines.size() >= (jsonl ? 3u : 1u));
    for (const Damaged& d : damaged_versions(t, jsonl ? lines[1] : text)) {
      for (const std::string& command_template : t.commands) {
        const fs::path dir = root / ("case" + std::to_string(n++));
        fs::create_directories(dir);
        for (const std::string& part : parts) fs::copy(root / part, dir / part, fs::copy_options::recursive);
        const fs::path file = dir / t.file;
        std::string damaged = d.text;
        if (jsonl) {
          std::vector<std::string> changed = lines;
          changed[1] = d.text;
          damaged.clear();
          for (const std::string& l : changed) damaged += l + "\n";
        }
        std::ofstream(file, std::ios::binary | std::ios::trunc) << damaged;
        const auto before = snapshot(dir);
        const std::string command = substitute(command_template, "DIR", dir.string());
        const auto r = run_ablate_within(60, command);
        ++commands;
        INFO(t.file << ", " << d.name << ": ablate " << command);
        INFO(r.output.substr(0, 3000));
        CHECK(r.exit_code == 2);
        CHECK(contains(r.output, file.string() + (jsonl ? ":2" : "")));
        for (const std::string& s : d.says) CHECK(contains(r.output, s));
        std::size_t longest = 0;
        for (const std::string& l : split_lines(r.output)) longest = std::max(longest, l.size());
        CHECK(longest <= 600);
        CHECK(r.output.size() <= 16000);
        const auto after = snapshot(dir);
        CHECK(after.size() == before.size());
        for (const auto& [path, bytes] : before) {
          CAPTURE(path);
          CHECK((after.count(path) && after.at(path) == bytes));
        }
        fs::remove_all(dir);
      }
    }
  }
  return commands;
}

std::string tiny_sweep_keys(int steps) {
  std::string keys;
  std::istringstream flags(kTinyRunFlags);
  for (std::string word; flags >> word;) {
    if (word == "--set") continue;
    const std::size_t eq = word.find('=');
    keys += "\"" + word.substr(0, eq) + "\" = " + word.substr(eq + 1) + "\n";
  }
  return keys + "\"run.steps\" = " + std::to_string(steps) + "\n";
}

}  // namespace

TEST_CASE(
    "report and doctor refuse a damaged run.json, summary.json or metrics.jsonl: exit 2 naming file, line and field, nothing changed") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const auto trained =
      run_ablate_within(120, "train " + quickstart_config() + kTinyRunFlags + " --set run.steps=4 --run-dir " + run.string());
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  REQUIRE(run_ablate_within(60, "doctor " + run.string()).exit_code == 0);
  const std::vector<Target> targets = {
      {"run/run.json", {"doctor DIR/run"}, "memory_bytes", "memory_source", "world", ""},
      {"run/summary.json", {"doctor DIR/run", "report DIR/run"}, "final_loss", "status", "steps", ""},
      {"run/metrics.jsonl", {"doctor DIR/run", "report DIR/run"}, "loss", "", "step", ""},
  };
  CHECK(check_damages(tmp.path(), {"run"}, targets) > 30);
}

TEST_CASE("doctor refuses run.json's device capabilities and plugin list of the wrong type: exit 2 naming the field") {
  TempDir tmp;
  const fs::path run = tmp.path() / "run";
  const auto trained =
      run_ablate_within(120, "train " + quickstart_config() + kTinyRunFlags + " --set run.steps=2 --run-dir " + run.string());
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  const json good = json::parse(slurp(run / "run.json"));
  REQUIRE(good["device_capabilities"]["host_memory"].is_boolean());
  const auto doctor_with = [&](const std::string& pointer, const json& value) {
    json bad = good;
    bad[json::json_pointer(pointer)] = value;
    std::ofstream(run / "run.json") << bad.dump();
    return run_ablate_within(60, "doctor " + run.string());
  };
  const auto caps = doctor_with("/device_capabilities/host_memory", "yes");
  CHECK(caps.exit_code == 2);
  CHECK(contains(caps.output, "device_capabilities.host_memory"));
  CHECK(contains(caps.output, "true or false"));
  const auto not_object = doctor_with("/device_capabilities", 3);
  CHECK(not_object.exit_code == 2);
  CHECK(contains(not_object.output, "'device_capabilities' is number 3; expected a JSON object"));
  const auto devices = doctor_with("/plugins/0/devices", "cpu");
  CHECK(devices.exit_code == 2);
  CHECK(contains(devices.output, "plugins[0].devices"));
  std::ofstream(run / "run.json") << good.dump();
  CHECK(run_ablate_within(60, "doctor " + run.string()).exit_code == 0);
}

TEST_CASE(
    "a sweep re-run and report refuse a damaged arms.json, arm.json, summary.json or metrics.jsonl: exit 2, nothing retrained or changed") {
  TempDir tmp;
  const fs::path file = tmp.write("sweep.toml", "base = \"" + quickstart_config() + "\"\n[sweep]\nname = \"s\"\n[sweep.set]\n" +
                                                    tiny_sweep_keys(4) + "[sweep.grid]\n\"run.seed\" = [1, 2]\n");
  const fs::path out = tmp.path() / "sweep";
  const auto first = run_ablate_within(300, "sweep " + file.string() + " --out " + out.string());
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  REQUIRE(fs::exists(out / "1" / "summary.json"));
  {  // undamaged, a re-run trains nothing and succeeds
    const auto again = run_ablate_within(300, "sweep " + file.string() + " --out " + out.string());
    INFO(again.output);
    CHECK(again.exit_code == 0);
    CHECK(contains(again.output, "1: already completed, skipped"));
    CHECK(contains(again.output, "2: already completed, skipped"));
  }
  const std::string rerun = "sweep DIR/sweep.toml --out DIR/sweep", report = "report DIR/sweep";
  const std::vector<Target> targets = {
      {"sweep/arms.json", {rerun, report}, "", "name", "", "arms"},
      {"sweep/1/arm.json", {rerun, report}, "wall_s", "status", "repeat", "sets"},
      {"sweep/1/summary.json", {rerun, report}, "final_loss", "status", "steps", ""},
      {"sweep/1/metrics.jsonl", {rerun, report}, "loss", "", "step", ""},
  };
  CHECK(check_damages(tmp.path(), {"sweep", "sweep.toml"}, targets) > 40);
}

TEST_CASE("directories whose names are not UTF-8: report, doctor --json and sweep write their JSON and do not crash") {
  TempDir tmp;
  const bool plots = have_matplotlib();
  const fs::path run = tmp.path() / "run\xff";
  const auto trained =
      run_ablate_within(120, "train " + quickstart_config() + kTinyRunFlags + " --set run.steps=3 --run-dir " + run.string());
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);

  const auto report = run_ablate_within(120, "report " + run.string());
  INFO(report.output);
  CHECK(report.exit_code == (plots ? 0 : 1));
  CHECK_FALSE(contains(report.output, "UTF-8"));
  CHECK(fs::exists(run / "report.md"));
  if (plots) CHECK(fs::exists(run / "loss_vs_step.png"));

  const auto doctor = run_ablate_within(60, "doctor " + run.string() + " --json");
  INFO(doctor.output);
  CHECK(doctor.exit_code == 0);
  REQUIRE(doctor.output.find('[') != std::string::npos);
  CHECK(json::parse(doctor.output.substr(doctor.output.find('['))).is_array());

  // A sweep whose base experiment sits beside it in such a directory: arms.json records the base's path.
  const fs::path dir = tmp.path() / "sweep\xff";
  fs::create_directories(dir);
  fs::copy_file(quickstart_config(), dir / "base.toml");
  std::ofstream(dir / "sweep.toml") << "base = \"base.toml\"\n[sweep]\nname = \"u\"\n[sweep.set]\n" << tiny_sweep_keys(3);
  const std::string sweep = "sweep " + (dir / "sweep.toml").string() + " --out " + (dir / "out").string();
  const auto swept = run_ablate_within(300, sweep);
  INFO(swept.output);
  REQUIRE(swept.exit_code == 0);
  CHECK_FALSE(contains(swept.output, "UTF-8"));
  const json arms = read_json(dir / "out" / "arms.json");
  CHECK(contains(arms["base"].get<std::string>(), "sweep\xEF\xBF\xBD"));  // the byte as U+FFFD
  const json results = read_json(dir / "out" / "results.json");
  REQUIRE(results["arms"].size() == 1);
  CHECK(results["arms"][0]["status"] == "completed");
  const auto again = run_ablate_within(300, sweep);
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(contains(again.output, "already completed, skipped"));
}
