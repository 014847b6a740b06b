// The `ablate` subcommands. Each takes its arguments (after the subcommand name), returns the exit
// code, and throws ablate::Error or a Program_options error for bad input (main maps them to 2).
#pragma once

#include <string>
#include <vector>

#include <boost/program_options.hpp>

namespace ablate::cli {

using Args = std::vector<std::string>;

int cmd_plugins(const Args& args);
int cmd_config(const Args& args);
int cmd_data(const Args& args);

// Shared helpers.
namespace po = boost::program_options;
// Parses `args` against `desc` with `positional`; prints `usage` + desc and returns true on --help.
bool parse_or_help(const Args& args, const po::options_description& desc, const po::positional_options_description& pos,
                   po::variables_map& vm, const std::string& usage);

}  // namespace ablate::cli
