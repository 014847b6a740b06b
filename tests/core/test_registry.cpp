// The plugin loader and registry: a good plugin loads, a wrong API version is refused with both
// versions named, a missing dependency is reported and skipped while others load, and two
// plugins registering one name is an error naming both files.
#include <doctest/doctest.h>

#include "ablate/error.hpp"
#include "ablate/logger.hpp"
#include "ablate/metrics.hpp"
#include "ablate/runtime/registry.hpp"
#include "ablate/version.hpp"
#include "test_support.hpp"

using namespace ablate;
namespace fs = std::filesystem;

namespace {
fs::path case_dir(const std::string& name) { return test::test_plugin_dir() / name; }
fs::path lib(const std::string& dir, const std::string& name) { return case_dir(dir) / ("libablate_" + name + ".so"); }
}  // namespace

TEST_CASE("a good plugin loads and its component is found with its schema and file") {
  Registry r;
  r.load_directories({case_dir("good")});
  CHECK(r.failures().empty());
  REQUIRE(r.plugins().size() == 1);
  CHECK(r.plugins()[0].name == "test_recorder");
  const ComponentInfo* c = r.find(Kind::logger, "recorder");
  REQUIRE(c != nullptr);
  CHECK(c->library == fs::weakly_canonical(lib("good", "test_good")).string());
  REQUIRE(c->schema.size() == 2);
  CHECK(c->schema[1].name == "width");
}

TEST_CASE("a component made by a plugin implements its kind's interface") {
  Registry r;
  r.load_directories({case_dir("good")});
  Params common("logging", {});
  Params own("logging.recorder", {{"prefix", std::string("p")}, {"width", int64_t(3)}});
  RunContext run;
  std::unique_ptr<Logger> logger = r.create<Logger>(Kind::logger, "recorder", ComponentArgs{common, own, run});
  CHECK(logger != nullptr);
}

TEST_CASE("a plugin built for another API version is refused with both versions in the reason") {
  Registry r;
  CHECK_FALSE(r.load_file(lib("badapi", "test_badapi")));
  REQUIRE(r.failures().size() == 1);
  const std::string& reason = r.failures()[0].reason;
  CHECK(reason.find("999") != std::string::npos);
  CHECK(reason.find(std::to_string(kApiVersion)) != std::string::npos);
  CHECK(r.failures()[0].file.find("libablate_test_badapi.so") != std::string::npos);
  CHECK(r.find(Kind::logger, "refused") == nullptr);
}

TEST_CASE("a plugin whose dependency is missing is reported with the library named and the others still load") {
  Registry r;
  r.load_directories({case_dir("missingdep"), case_dir("badapi"), case_dir("good")});
  CHECK(r.find(Kind::logger, "recorder") != nullptr);
  CHECK(r.find(Kind::logger, "orphan") == nullptr);
  REQUIRE(r.failures().size() == 2);
  bool named = false;
  for (const LoadFailure& f : r.failures()) {
    if (f.file.find("libablate_test_missingdep.so") != std::string::npos) {
      named = f.reason.find("libablate_test_vanishing.so") != std::string::npos;
    }
  }
  CHECK(named);
}

TEST_CASE("two plugins registering the same name is an error naming both files") {
  Registry r;
  try {
    r.load_directories({case_dir("dup")});
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(e.kind() == ErrorKind::input);
    CHECK(msg.find("libablate_test_dup_a.so") != std::string::npos);
    CHECK(msg.find("libablate_test_dup_b.so") != std::string::npos);
    CHECK(msg.find("twin") != std::string::npos);
  }
}

TEST_CASE("a file that is not a plugin is reported, not loaded") {
  test::TempDir dir;
  const fs::path fake = dir.write("libablate_fake.so", "not an ELF file");
  Registry r;
  r.load_directories({dir.path()});
  REQUIRE(r.failures().size() == 1);
  CHECK(r.failures()[0].file.find("libablate_fake.so") != std::string::npos);
  CHECK(r.plugins().empty());
}

TEST_CASE("the default search path is next to the executable and never the current directory") {
  const auto dirs = Registry::default_search_path();
  REQUIRE(dirs.size() >= 2);
  CHECK(dirs[0].filename() == "plugins");
  for (const fs::path& d : dirs) CHECK(d != fs::path("."));
}

TEST_CASE("an unknown component name lists the valid names of its kind and suggests the closest") {
  Registry r;
  r.load_directories({case_dir("good")});
  try {
    (void)r.get(Kind::logger, "recordr");
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("did you mean 'recorder'") != std::string::npos);
    CHECK(msg.find("valid: recorder") != std::string::npos);
  }
}

TEST_CASE("suggestions: close typos are found, unrelated words are not") {
  const std::vector<std::string> keys = {"lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip"};
  CHECK(closest_matches("lrr", keys) == std::vector<std::string>{"lr"});
  CHECK(closest_matches("wieght_decay", keys) == std::vector<std::string>{"weight_decay"});
  CHECK(closest_matches("temperature", keys).empty());
}
