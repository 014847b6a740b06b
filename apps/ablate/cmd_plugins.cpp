// `ablate plugins list [--json]` and `ablate plugins describe NAME`.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"
#include "commands.hpp"
#include "json_read.hpp"

namespace ablate::cli {

namespace {

// "cpu,cuda", or "any" for a component that serves every device.
std::string devices_of(const ComponentInfo& c) { return c.devices.empty() ? "any" : join(c.devices, ","); }

int plugins_list(const Args& args) {
  po::options_description desc("plugins list");
  desc.add_options()("json", "print one JSON object instead of a table");
  po::positional_options_description pos;
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm, "ablate plugins list [--json]")) return 0;

  Registry registry;
  registry.load_directories(Registry::default_search_path());
  if (vm.count("json")) {
    nlohmann::json out;
    out["components"] = nlohmann::json::array();
    for (const ComponentInfo* c : registry.all()) {
      out["components"].push_back({{"kind", to_string(c->kind)},
                                   {"name", c->name},
                                   {"version", c->version},
                                   {"library", c->library},
                                   {"doc", c->doc},
                                   {"devices", c->devices}});
    }
    out["failed"] = nlohmann::json::array();
    for (const LoadFailure& f : registry.failures()) out["failed"].push_back({{"file", f.file}, {"reason", f.reason}});
    std::cout << json_text(out, 2) << "\n";
    return 0;
  }
  std::printf("%-13s %-18s %-8s %-10s %s\n", "KIND", "NAME", "VERSION", "DEVICES", "LIBRARY");
  for (const ComponentInfo* c : registry.all()) {
    std::printf("%-13s %-18s %-8s %-10s %s\n", std::string(to_string(c->kind)).c_str(), c->name.c_str(), c->version.c_str(),
                devices_of(*c).c_str(), c->library.c_str());
  }
  if (registry.all().empty()) std::printf("(no plugins found; search path: set ABLATE_PLUGIN_PATH)\n");
  if (!registry.failures().empty()) {
    std::printf("\nnot loaded:\n");
    for (const LoadFailure& f : registry.failures()) std::printf("  %s\n    %s\n", f.file.c_str(), f.reason.c_str());
  }
  return 0;
}

int plugins_describe(const Args& args) {
  po::options_description desc("plugins describe");
  desc.add_options()("name", po::value<std::string>()->required(), "component name, or KIND/NAME when a name is in several kinds");
  po::positional_options_description pos;
  pos.add("name", 1);
  po::variables_map vm;
  if (parse_or_help(args, desc, pos, vm, "ablate plugins describe NAME")) return 0;

  Registry registry;
  registry.load_directories(Registry::default_search_path());
  std::string name = vm["name"].as<std::string>();
  std::optional<Kind> only;
  if (auto slash = name.find('/'); slash != std::string::npos) {
    only = kind_from_string(name.substr(0, slash));
    if (!only) throw_input_error("", "unknown kind '" + name.substr(0, slash) + "'");
    name = name.substr(slash + 1);
  }
  std::vector<const ComponentInfo*> found;
  std::vector<std::string> all_names;
  for (const ComponentInfo* c : registry.all()) {
    all_names.push_back(c->name);
    if (c->name == name && (!only || *only == c->kind)) found.push_back(c);
  }
  if (found.empty()) {
    throw_input_error("", "no plugin component named '" + name + "'" + did_you_mean(name, all_names) + " (see ablate plugins list)");
  }
  for (const ComponentInfo* c : found) {
    std::printf("%s %s %s\n  %s\n  devices: %s\n  library: %s\n\n", std::string(to_string(c->kind)).c_str(), c->name.c_str(),
                c->version.c_str(), c->doc.c_str(), devices_of(*c).c_str(), c->library.c_str());
    if (c->schema.empty()) {
      std::printf("  (no parameters)\n");
    }
    for (const ParamSpec& p : c->schema) {
      std::printf("  %-22s %-15s default %-12s %s\n", p.name.c_str(), std::string(to_string(p.type)).c_str(),
                  format_value(p.default_value).c_str(), p.doc.c_str());
      if (p.min || p.max || !p.choices.empty()) std::printf("  %-22s expected %s\n", "", p.expectation().c_str());
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int cmd_plugins(const Args& args) {
  return dispatch("plugins", args,
                  {{"list", plugins_list, "ablate plugins list [--json]"},
                   {"describe", plugins_describe, "ablate plugins describe NAME"}});
}

}  // namespace ablate::cli
