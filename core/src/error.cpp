// ablate::Error and its shorthands.
#include "ablate/error.hpp"

namespace ablate {

namespace {
std::string compose(const std::string& where, const std::string& message) {
  return where.empty() ? message : where + ": " + message;
}
}  // namespace

Error::Error(ErrorKind kind, std::string where, const std::string& message)
    : std::runtime_error(compose(where, message)), kind_(kind), where_(std::move(where)) {}

Error::~Error() = default;

void throw_input_error(std::string where, const std::string& message) {
  throw Error(ErrorKind::input, std::move(where), message);
}

void throw_runtime_error(std::string where, const std::string& message) {
  throw Error(ErrorKind::runtime, std::move(where), message);
}

}  // namespace ablate
