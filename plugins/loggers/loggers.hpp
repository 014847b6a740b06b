// The logger sinks of libablate_loggers: each source file registers one component. Shared here so
// the entry file (loggers.cpp) can register them all.
#pragma once

#include "ablate/logger.hpp"
#include "ablate/component.hpp"

namespace ablate::loggers {

void register_console(Registrar& r);
void register_jsonl(Registrar& r);
void register_csv(Registrar& r);
void register_tensorboard(Registrar& r);
void register_mlflow(Registrar& r);

}  // namespace ablate::loggers
