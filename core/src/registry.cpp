// The component registry and the plugin loader (Boost.DLL). See registry.hpp for the rules.
#include "ablate/runtime/registry.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <spdlog/spdlog.h>

#include "ablate/device.hpp"
#include "ablate/plugin.hpp"
#include "ablate/version.hpp"
#include "cpu_kernels.hpp"

namespace ablate {

namespace fs = std::filesystem;

namespace {
// Plugin libraries are never unloaded while the process runs: their handles go into a list that
// is intentionally never destroyed, so an object a plugin made can never outlive its code.
void keep_loaded_forever(boost::dll::shared_library lib) {
  static std::mutex mutex;
  static auto* kept = new std::vector<boost::dll::shared_library>();
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(lib));
}
}  // namespace

struct Registry::Impl {
  // One (kind, name) may have several registrations, each serving its own devices.
  std::multimap<std::pair<Kind, std::string>, ComponentInfo, std::less<>> components;
  std::map<std::pair<Kind, std::string>, std::string, std::less<>> families;  // Registrar::share_keys

  // A registration of (kind, name) that serves a device `info` also serves, if any.
  const ComponentInfo* clash(const ComponentInfo& info) const {
    auto [lo, hi] = components.equal_range(std::make_pair(info.kind, info.name));
    for (auto it = lo; it != hi; ++it) {
      const ComponentInfo& prev = it->second;
      if (info.devices.empty() || prev.devices.empty()) return &prev;
      for (const std::string& d : info.devices) {
        if (prev.serves(d)) return &prev;
      }
    }
    return nullptr;
  }
  std::vector<LoadedPlugin> plugins;
  std::vector<LoadFailure> failures;
  std::vector<std::string> loaded_files;  // canonical paths, to load each file once
};

namespace {

// A registrar that collects a plugin's components, so a plugin is registered whole or not at all.
class CollectingRegistrar final : public Registrar {
 public:
  void add(ComponentInfo info) override { collected.push_back(std::move(info)); }
  void share_keys(Kind kind, const std::string& name, const std::string& family) override { families.push_back({kind, name, family}); }
  std::vector<ComponentInfo> collected;
  struct Family {
    Kind kind;
    std::string name, family;
  };
  std::vector<Family> families;
};

std::string fingerprint_part(const std::string& fp, int index) {
  std::stringstream ss(fp);
  std::string part;
  for (int i = 0; i <= index && std::getline(ss, part, ';'); ++i) {
  }
  return part;
}

}  // namespace

Registry::Registry() : impl_(std::make_unique<Impl>()) {
  ComponentInfo cpu = cpu_device_info();
  cpu.library = "core";
  impl_->components.emplace(std::make_pair(cpu.kind, cpu.name), std::move(cpu));
}

Registry::~Registry() = default;

std::vector<fs::path> Registry::default_search_path() {
  std::vector<fs::path> dirs;
  std::error_code ec;
  fs::path exe = boost::dll::program_location(ec);
  if (!ec) {
    fs::path dir = exe.parent_path();
    dirs.push_back(dir / "plugins");
    dirs.push_back(dir.parent_path() / "lib" / "ablate" / "plugins");
  }
  if (const char* env = std::getenv("ABLATE_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':')) {
      if (!item.empty()) dirs.emplace_back(item);
    }
  }
  return dirs;
}

namespace {

// ABLATE_EMULATE_CUDA: unset, empty or 0 is off, 1 on; anything else is an input error.
bool emulate_cuda() {
  const char* v = std::getenv("ABLATE_EMULATE_CUDA");
  if (v == nullptr || *v == '\0' || std::string_view(v) == "0") return false;
  if (std::string_view(v) == "1") return true;
  throw_input_error("ABLATE_EMULATE_CUDA",
                    std::string("expected 1 (run the CUDA device emulated on the CPU) or 0, got \"") + v + "\"");
}

std::vector<fs::path> plugin_files(const fs::path& dir) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string fname = entry.path().filename().string();
    if (entry.is_regular_file() && fname.rfind("lib", 0) == 0 && entry.path().extension() == ".so") {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

void Registry::load_directories(const std::vector<fs::path>& dirs) {
  // Emulating CUDA, a directory's emulated/ builds (the CUDA plugins built for the emulated
  // device) are loaded instead of the files of the same name, and the GPU-only builds its
  // gpu_only.txt names ("file what-it-needs" a line) are left out, each recorded with its reason.
  const bool emulate = emulate_cuda();
  bool emulated_found = false;
  std::string searched;
  for (const fs::path& dir : dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) {
      spdlog::debug("plugin directory {} does not exist; skipped", dir.string());
      continue;
    }
    searched += (searched.empty() ? "" : ", ") + dir.string();
    std::map<std::string, std::string> left_out;  // file name -> what it needs ("" when it has a twin)
    if (emulate && fs::is_directory(dir / "emulated", ec)) {
      emulated_found = true;
      for (const fs::path& f : plugin_files(dir / "emulated")) {
        left_out[f.filename().string()] = "";
        load_file(f);
      }
      std::ifstream gpu_only(dir / "emulated" / "gpu_only.txt");
      std::string name, needs;
      while (gpu_only >> name && std::getline(gpu_only >> std::ws, needs)) left_out[name] = needs;
    }
    for (const fs::path& f : plugin_files(dir)) {
      auto it = left_out.find(f.filename().string());
      if (it == left_out.end()) {
        load_file(f);
      } else if (!it->second.empty()) {
        impl_->failures.push_back({f.string(), "left out: ABLATE_EMULATE_CUDA=1 emulates one CUDA device, and this "
                                               "plugin needs " +
                                                   it->second});
      }
    }
  }
  if (emulate && !emulated_found) {
    throw_input_error("ABLATE_EMULATE_CUDA", "is 1, but no CUDA plugins built for the emulated device were found (an "
                                             "emulated/ directory next to the plugins in " +
                                                 (searched.empty() ? std::string("no plugin directory") : searched) +
                                                 "); build them: cmake --build build --target ablate_emulated_cuda");
  }
}

bool Registry::load_file(const fs::path& file) {
  std::error_code ec;
  const fs::path canonical = fs::weakly_canonical(file, ec);
  const std::string path = (ec ? file : canonical).string();
  if (std::find(impl_->loaded_files.begin(), impl_->loaded_files.end(), path) != impl_->loaded_files.end()) {
    return true;
  }
  auto fail = [&](const std::string& reason) {
    spdlog::warn("plugin {} not loaded: {}", path, reason);
    impl_->failures.push_back({path, reason});
    return false;
  };

  choose_cpu_blas_kernels();  // before any plugin loads OpenBLAS
  boost::dll::shared_library lib;
  try {
    lib.load(boost::dll::fs::path(path), boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    // Boost wraps the dynamic loader's own message; that message is the useful part.
    std::string why = e.what();
    const std::string marker = "(dlerror system message: ";
    if (const auto at = why.find(marker); at != std::string::npos) {
      why = why.substr(at + marker.size());
      why = why.substr(0, why.rfind(')'));
    }
    return fail("cannot be loaded: " + why);
  }
  if (!lib.has(kPluginEntrySymbol)) {
    return fail(std::string("not an ablate plugin: no '") + kPluginEntrySymbol + "' entry point");
  }
  const PluginDescriptor* desc = nullptr;
  try {
    desc = lib.get_alias<PluginEntryFn>(kPluginEntrySymbol)();
  } catch (const std::exception& e) {
    return fail(std::string("entry point unusable: ") + e.what());
  }
  if (desc == nullptr) return fail("entry point returned no descriptor");
  // The API version is read first, before any other field is trusted.
  if (desc->api_version != kApiVersion) {
    return fail("plugin API version " + std::to_string(desc->api_version) + " does not match core's API version " +
                std::to_string(kApiVersion) + "; rebuild the plugin against this ablate");
  }
  const std::string fp = desc->fingerprint ? desc->fingerprint : "";
  const std::string core_fp = core_build_fingerprint();
  if (fingerprint_part(fp, 1) != fingerprint_part(core_fp, 1) || fingerprint_part(fp, 2) != fingerprint_part(core_fp, 2)) {
    return fail("build fingerprint '" + fp + "' is incompatible with core's '" + core_fp +
                "' (C++ library ABI and core version must match); rebuild the plugin");
  }
  if (fingerprint_part(fp, 0) != fingerprint_part(core_fp, 0)) {
    spdlog::debug("plugin {} was built with {}, core with {}", path, fingerprint_part(fp, 0), fingerprint_part(core_fp, 0));
  }
  if (desc->register_components == nullptr) return fail("descriptor has no register function");

  CollectingRegistrar reg;
  try {
    desc->register_components(reg);
  } catch (const std::exception& e) {
    return fail(std::string("register function failed: ") + e.what());
  }
  // Duplicates are an error naming both files: two plugins claiming one name is ambiguous.
  for (const ComponentInfo& info : reg.collected) {
    if (const ComponentInfo* prev = impl_->clash(info)) {
      throw_input_error(path, "registers " + std::string(to_string(info.kind)) + " '" + info.name + "', already registered by " +
                                  prev->library + " for the same device; remove one of the two files from the plugin search path");
    }
  }
  for (ComponentInfo& info : reg.collected) {
    info.library = path;
    auto key = std::make_pair(info.kind, info.name);
    impl_->components.emplace(std::move(key), std::move(info));
  }
  for (const CollectingRegistrar::Family& f : reg.families) impl_->families[std::make_pair(f.kind, f.name)] = f.family;
  impl_->plugins.push_back({path, desc->name ? desc->name : "", desc->version ? desc->version : "", fp});
  impl_->loaded_files.push_back(path);
  keep_loaded_forever(std::move(lib));
  spdlog::debug("loaded plugin {} ({} components)", path, reg.collected.size());
  return true;
}

void Registry::add(ComponentInfo info, const std::string& origin) {
  if (const ComponentInfo* prev = impl_->clash(info)) {
    throw_input_error(origin, "registers " + std::string(to_string(info.kind)) + " '" + info.name + "', already registered by " +
                                  prev->library);
  }
  info.library = origin;
  auto key = std::make_pair(info.kind, info.name);
  impl_->components.emplace(std::move(key), std::move(info));
}

const ComponentInfo* Registry::find(Kind kind, std::string_view name) const {
  auto it = impl_->components.find(std::make_pair(kind, std::string(name)));
  return it == impl_->components.end() ? nullptr : &it->second;
}

const ComponentInfo* Registry::find(Kind kind, std::string_view name, std::string_view device) const {
  auto [lo, hi] = impl_->components.equal_range(std::make_pair(kind, std::string(name)));
  for (auto it = lo; it != hi; ++it) {
    if (it->second.serves(device)) return &it->second;
  }
  return nullptr;
}

const ComponentInfo& Registry::get(Kind kind, std::string_view name, const std::string& where) const {
  if (const ComponentInfo* info = find(kind, name)) return *info;
  const std::vector<std::string> valid = names(kind);
  throw_input_error(where, "unknown " + std::string(to_string(kind)) + " '" + std::string(name) + "'" + did_you_mean(name, valid) +
                               " (valid: " + (valid.empty() ? std::string("none loaded") : join(valid)) + ")" + not_loaded_note(name));
}

const ComponentInfo& Registry::get(Kind kind, std::string_view name, std::string_view device, const std::string& where) const {
  if (const ComponentInfo* info = find(kind, name, device)) return *info;
  get(kind, name, where);  // an unknown name is refused as such
  std::vector<std::string> served, others;
  auto [lo, hi] = impl_->components.equal_range(std::make_pair(kind, std::string(name)));
  for (auto it = lo; it != hi; ++it) {
    for (const std::string& d : it->second.devices) served.push_back(d + " (" + it->second.library + ")");
  }
  for (const ComponentInfo* c : list(kind)) {
    if (c->serves(device)) others.push_back(c->name);
  }
  throw_input_error(where, std::string(to_string(kind)) + " '" + std::string(name) + "' has no implementation for device '" +
                               std::string(device) + "' (it serves: " + join(served) + "); " + std::string(to_string(kind)) +
                               "s for '" + std::string(device) + "': " + (others.empty() ? std::string("none loaded") : join(others)));
}

std::vector<const ComponentInfo*> Registry::list(Kind kind) const {
  std::vector<const ComponentInfo*> out;
  for (const auto& [key, info] : impl_->components) {
    if (key.first == kind) out.push_back(&info);
  }
  return out;
}

std::vector<const ComponentInfo*> Registry::all() const {
  std::vector<const ComponentInfo*> out;
  for (Kind k : kAllKinds) {
    for (const ComponentInfo* c : list(k)) out.push_back(c);
  }
  return out;
}

std::string Registry::family(Kind kind, std::string_view name) const {
  const auto it = impl_->families.find(std::make_pair(kind, std::string(name)));
  return it != impl_->families.end() ? it->second : std::string();
}

void Registry::share_keys(Kind kind, const std::string& name, const std::string& family) {
  impl_->families[std::make_pair(kind, name)] = family;
}

std::vector<std::string> Registry::names(Kind kind) const {
  std::vector<std::string> out;
  for (const ComponentInfo* c : list(kind)) {
    if (out.empty() || out.back() != c->name) out.push_back(c->name);
  }
  return out;
}

const std::vector<LoadedPlugin>& Registry::plugins() const noexcept { return impl_->plugins; }
const std::vector<LoadFailure>& Registry::failures() const noexcept { return impl_->failures; }

std::string Registry::not_loaded_note(std::string_view name) const {
  const std::string file = "libablate_" + std::string(name) + ".so";
  for (const LoadFailure& f : impl_->failures) {
    if (fs::path(f.file).filename() == file) return "; " + file + " was not loaded: " + f.reason;
  }
  return {};
}

namespace {
// Optimal string alignment distance (Levenshtein with adjacent transpositions).
std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<std::size_t>> d(n + 1, std::vector<std::size_t>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}
}  // namespace

std::vector<std::string> closest_matches(std::string_view word, const std::vector<std::string>& candidates) {
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 3);
  std::size_t best = limit + 1;
  std::vector<std::string> out;
  for (const std::string& c : candidates) {
    const std::size_t d = edit_distance(word, c);
    if (d < best) {
      best = d;
      out = {c};
    } else if (d == best) {
      out.push_back(c);
    }
  }
  // A prefix is a plausible slip too ("batch" for "batch_size").
  if (out.empty()) {
    for (const std::string& c : candidates) {
      if (word.size() >= 3 && c.rfind(word, 0) == 0) out.push_back(c);
    }
  }
  return out;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::vector<std::string> m = closest_matches(word, candidates);
  if (m.empty()) return "";
  std::string s = "; did you mean ";
  for (std::size_t i = 0; i < m.size(); ++i) s += (i ? " or '" : "'") + m[i] + "'";
  return s + "?";
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

}  // namespace ablate
