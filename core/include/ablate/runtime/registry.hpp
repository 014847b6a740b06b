// Runtime internal (core and apps; not part of the plugin SDK, not installed).
// The registry of components: (kind, name) -> factory + schema, filled by loading plugin libraries
// from an explicit search path. Libraries are loaded RTLD_NOW | RTLD_LOCAL and kept loaded for the
// registry's lifetime (which is the process's): objects a plugin created never outlive its code.
// A library that fails to load is recorded with its file and reason; the others still load.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ablate/component.hpp"
#include "ablate/error.hpp"

namespace ablate {

struct LoadedPlugin {
  std::string file;
  std::string name;
  std::string version;
  std::string fingerprint;
};

struct LoadFailure {
  std::string file;
  std::string reason;
};

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The default search path: <exe dir>/plugins, <exe dir>/../lib/ablate/plugins (install tree),
  // then each entry of $ABLATE_PLUGIN_PATH (colon separated). Never the current directory.
  static std::vector<std::filesystem::path> default_search_path();

  // Loads every lib*.so in each directory (sorted by name). Directories that do not exist are skipped.
  void load_directories(const std::vector<std::filesystem::path>& dirs);
  // Loads one library. Load failures (missing dependency, wrong API version or fingerprint, no
  // entry point) are recorded in failures() and return false. Registering a (kind, name) already
  // registered by another file throws ablate::Error naming both files.
  bool load_file(const std::filesystem::path& file);

  // Components compiled into the program itself (tests use this; core registers none today).
  void add(ComponentInfo info, const std::string& origin);

  // The first registration of (kind, name), whatever device it serves.
  const ComponentInfo* find(Kind kind, std::string_view name) const;
  // The registration of (kind, name) that serves `device` ([run] device).
  const ComponentInfo* find(Kind kind, std::string_view name, std::string_view device) const;
  // Like find, but an unknown name is an input error listing the valid names of that kind, and a
  // name with no registration for `device` one naming the devices it has.
  const ComponentInfo& get(Kind kind, std::string_view name, const std::string& where = {}) const;
  const ComponentInfo& get(Kind kind, std::string_view name, std::string_view device, const std::string& where) const;
  std::vector<const ComponentInfo*> list(Kind kind) const;  // sorted by name
  std::vector<const ComponentInfo*> all() const;            // sorted by kind, name
  std::vector<std::string> names(Kind kind) const;          // distinct names, sorted
  // The registration whose keys (kind, name) shares (Registrar::share_keys), "" when none; and
  // the same declared directly (tests, core's own components).
  std::string family(Kind kind, std::string_view name) const;
  void share_keys(Kind kind, const std::string& name, const std::string& family);

  const std::vector<LoadedPlugin>& plugins() const noexcept;
  const std::vector<LoadFailure>& failures() const noexcept;
  // For an unknown name: "; libablate_<name>.so was not loaded: <why>" when that plugin file failed
  // to load or was left out, else empty.
  std::string not_loaded_note(std::string_view name) const;

  // Constructs the registration of (kind, name) for the run's device (args.run.device) and checks
  // it implements the interface T of its kind. `where` names the config key for errors.
  template <class T>
  std::unique_ptr<T> create(Kind kind, std::string_view name, const ComponentArgs& args, const std::string& where = {}) const {
    const ComponentInfo& info = get(kind, name, args.run.device, where);
    std::unique_ptr<Component> made = info.factory(args);
    T* typed = dynamic_cast<T*>(made.get());
    if (typed == nullptr) {
      throw_runtime_error(info.library,
                          "component '" + info.name + "' does not implement the " + std::string(to_string(kind)) + " interface");
    }
    made.release();
    return std::unique_ptr<T>(typed);
  }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The message helpers closest_matches, did_you_mean and join are in ablate/error.hpp (included above).

}  // namespace ablate
