// `ablate data analyze CONFIG`: (being written) lengths and padding of each batching strategy.
#include "ablate/error.hpp"
#include "commands.hpp"

namespace ablate::cli {
int cmd_data(const Args&) { throw_runtime_error("", "ablate data analyze is not built yet"); }
}  // namespace ablate::cli
