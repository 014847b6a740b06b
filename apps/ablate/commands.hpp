// The `ablate` subcommands. Each takes its arguments (after the subcommand name), returns the exit
// code, and throws ablate::Error or a Program_options error for bad input (main maps them to 2).
#pragma once

#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "ablate/runtime/config.hpp"
#include "ablate/runtime/registry.hpp"

namespace ablate::cli {

using Args = std::vector<std::string>;

int cmd_plugins(const Args& args);
int cmd_config(const Args& args);
int cmd_data(const Args& args);
int cmd_train(const Args& args);
int cmd_eval(const Args& args);
int cmd_export(const Args& args);
int cmd_import(const Args& args);
int cmd_sample(const Args& args);
int cmd_sweep(const Args& args);
int cmd_sweep_arm(const Args& args);
int cmd_report(const Args& args);
int cmd_doctor(const Args& args);
int cmd_tune(const Args& args);

// Shared helpers.
namespace po = boost::program_options;
// Parses `args` against `desc` with `positional`; prints `usage` + desc and returns true on --help.
bool parse_or_help(const Args& args, const po::options_description& desc, const po::positional_options_description& pos,
                   po::variables_map& vm, const std::string& usage);

// Every number a command takes is declared through these: the option's range is shown in --help
// and checked when the command line is parsed (po::notify, before the command reads or allocates
// anything): a value outside [lo, hi] (or [lo, hi) with below_hi), or not finite, is an input
// error (exit 2) naming --NAME and the range. Negative text for an integer is refused, never
// wrapped. Declare with e.g. ("batch", int_option("batch", 1, 65536)->default_value(8), "...").
po::typed_value<int64_t>* int_option(const std::string& name, int64_t lo, int64_t hi);
po::typed_value<double>* float_option(const std::string& name, double lo, double hi, bool below_hi = false);

// The options every command that reads an experiment takes: CONFIG (positional) and --set.
void add_experiment_options(po::options_description& desc, po::positional_options_description& pos);
// Loads the default plugin search path into `registry`, then the experiment those options name.
Config load_experiment(const po::variables_map& vm, Registry& registry);

// A command group's subcommands ("plugins list", "plugins describe"): runs the one args names,
// prints the usages on --help (exit 0) or no subcommand (exit 2), refuses an unknown one with a suggestion.
struct Subcommand {
  const char* name;
  int (*run)(const Args&);
  const char* usage;  // "ablate plugins list [--json]"
};
int dispatch(const std::string& group, const Args& args, const std::vector<Subcommand>& subcommands);

}  // namespace ablate::cli
