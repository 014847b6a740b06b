// Paths the build bakes into the tests (the source tree, the build tree, the ablate program, the
// plugin directories), each overridable at run time by the environment variable of the same name,
// so the test programs run from a copied build (scripts/device-bundle.sh) on a machine where
// these paths do not exist. Included into every test translation unit by the build.
#pragma once

#include <cstdlib>

inline const char* ablate_test_path(const char* variable, const char* built_in) {
  const char* v = std::getenv(variable);
  return v != nullptr && *v != '\0' ? v : built_in;
}
