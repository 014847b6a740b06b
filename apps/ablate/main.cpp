// `ablate`: the command-line program. Dispatches subcommands and is the only place errors become
// exit codes: 0 success, 2 bad input / usage / config, 1 runtime failure.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/version.hpp"
#include "commands.hpp"

namespace ablate::cli {

bool parse_or_help(const Args& args, const po::options_description& desc, const po::positional_options_description& pos,
                   po::variables_map& vm, const std::string& usage) {
  po::options_description all;
  all.add(desc);
  all.add_options()("help,h", "show this help");
  po::store(po::command_line_parser(args).options(all).positional(pos).run(), vm);
  if (vm.count("help")) {
    std::cout << "usage: " << usage << "\n\n" << all << "\n";
    return true;
  }
  po::notify(vm);
  return false;
}

namespace {

std::string number_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string range_text(double lo, double hi, bool below_hi) {
  return "[" + number_text(lo) + ", " + number_text(hi) + (below_hi ? ")" : "]");
}

}  // namespace

po::typed_value<int64_t>* int_option(const std::string& name, int64_t lo, int64_t hi) {
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  return po::value<int64_t>()->value_name("N in " + range)->notifier([name, lo, hi, range](int64_t v) {
    if (v < lo || v > hi) {
      throw_input_error("--" + name, std::to_string(v) + " is out of range: expected an integer in " + range);
    }
  });
}

po::typed_value<double>* float_option(const std::string& name, double lo, double hi, bool below_hi) {
  const std::string range = range_text(lo, hi, below_hi);
  return po::value<double>()->value_name("X in " + range)->notifier([name, lo, hi, below_hi, range](double v) {
    if (!std::isfinite(v) || v < lo || v > hi || (below_hi && v >= hi)) {
      throw_input_error("--" + name, number_text(v) + " is out of range: expected a finite number in " + range);
    }
  });
}

void add_experiment_options(po::options_description& desc, po::positional_options_description& pos) {
  desc.add_options()("config", po::value<std::string>()->required(), "experiment file (TOML)")(
      "set", po::value<std::vector<std::string>>()->composing(), "override a key: section.key=value (repeatable)");
  pos.add("config", 1);
}

Config load_experiment(const po::variables_map& vm, Registry& registry) {
  registry.load_directories(Registry::default_search_path());
  const auto overrides = vm.count("set") ? vm["set"].as<std::vector<std::string>>() : std::vector<std::string>{};
  return Config::load(vm["config"].as<std::string>(), overrides, registry);
}

int dispatch(const std::string& group, const Args& args, const std::vector<Subcommand>& subcommands) {
  if (args.empty() || args.front() == "--help" || args.front() == "-h") {
    for (std::size_t i = 0; i < subcommands.size(); ++i) {
      std::cout << (i == 0 ? "usage: " : "       ") << subcommands[i].usage << "\n";
    }
    return args.empty() ? 2 : 0;
  }
  const Args rest(args.begin() + 1, args.end());
  std::vector<std::string> names;
  for (const Subcommand& sub : subcommands) {
    if (args.front() == sub.name) return sub.run(rest);
    names.push_back(sub.name);
  }
  throw_input_error("", "unknown subcommand '" + group + " " + args.front() + "'" + did_you_mean(args.front(), names) + " (" + group +
                            " " + join(names, " | " + group + " ") + ")");
}

}  // namespace ablate::cli

namespace {

struct Command {
  int (*run)(const ablate::cli::Args&);
  const char* summary;
};

const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> table = {
      {"plugins", {ablate::cli::cmd_plugins, "list the loaded plugins, or describe one's parameters"}},
      {"config", {ablate::cli::cmd_config, "print an experiment's resolved configuration"}},
      {"data", {ablate::cli::cmd_data, "analyze a data set: lengths, padding of each batching strategy"}},
      {"train", {ablate::cli::cmd_train, "train a model from an experiment file (or resume a run)"}},
      {"eval", {ablate::cli::cmd_eval, "mean next-token loss of a checkpoint on an llm.c token shard"}},
      {"export", {ablate::cli::cmd_export, "write a checkpoint as a Hugging Face transformers directory"}},
      {"import", {ablate::cli::cmd_import, "read a Hugging Face checkpoint (GPT-2, Llama, Qwen3) into a run directory"}},
      {"sample", {ablate::cli::cmd_sample, "generate text from a checkpoint"}},
      {"sweep", {ablate::cli::cmd_sweep, "run an ablation study: every arm of a sweep file, then the results and report"}},
      {"sweep-arm",
       {ablate::cli::cmd_sweep_arm, "train one arm of a sweep: what a Slurm array task of `sweep --launcher slurm` runs"}},
      {"report", {ablate::cli::cmd_report, "write report.md with tables and plots for a run or a sweep"}},
      {"doctor", {ablate::cli::cmd_doctor, "name what holds a run back, ranked, with the change to make"}},
      {"tune", {ablate::cli::cmd_tune, "tune batch-size: the largest micro-batch that fits, measured"}},
  };
  return table;
}

void print_help() {
  std::cout << "ablate " << ablate::core_version()
            << ": train decoder-only transformers from plugins chosen in a TOML experiment file\n\n"
               "usage: ablate [--verbose] COMMAND [ARGS...]   (ablate COMMAND --help for its options)\n\ncommands:\n";
  for (const auto& [name, cmd] : commands()) std::printf("  %-10s %s\n", name.c_str(), cmd.summary);
  std::cout << "\nexit codes: 0 success, 2 bad input or configuration, 1 runtime failure\n";
}

// OpenMP workers that spin between parallel regions take the cores that OpenBLAS's own threads
// need (and the other way round), which can make CPU training steps several times slower on a
// small or busy machine; workers that sleep as soon as a region ends avoid it. libgomp reads OMP_WAIT_POLICY
// while it loads, before main runs, so the default is set from the executable's preinit array,
// which runs before any library's initialisation. A value already in the environment wins.
void default_omp_wait_policy(int, char**, char**) { setenv("OMP_WAIT_POLICY", "passive", 0); }
[[gnu::used, gnu::section(".preinit_array")]] void (*const preinit_wait_policy)(int, char**, char**) = default_omp_wait_policy;

}  // namespace

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_color_mt("ablate");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("%^%l%$: %v");
  spdlog::set_level(spdlog::level::info);

  ablate::cli::Args args(argv + 1, argv + argc);
  while (!args.empty() && (args.front() == "-v" || args.front() == "--verbose")) {
    spdlog::set_level(spdlog::level::debug);
    args.erase(args.begin());
  }
  if (args.empty() || args.front() == "--help" || args.front() == "-h" || args.front() == "help") {
    print_help();
    return args.empty() ? 2 : 0;
  }
  if (args.front() == "--version") {
    std::cout << "ablate " << ablate::core_version() << " (" << ablate::core_build_fingerprint() << ")\n";
    return 0;
  }
  const std::string name = args.front();
  args.erase(args.begin());
  auto it = commands().find(name);
  if (it == commands().end()) {
    std::vector<std::string> names;
    for (const auto& [n, c] : commands()) names.push_back(n);
    spdlog::error("unknown command '{}'{}; commands: {}", name, ablate::did_you_mean(name, names), ablate::join(names));
    return 2;
  }
  try {
    return it->second.run(args);
  } catch (const ablate::Error& e) {
    spdlog::error("{}", e.what());
    return e.exit_code();
  } catch (const boost::program_options::error& e) {
    spdlog::error("ablate {}: {} (see ablate {} --help)", name, e.what(), name);
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
