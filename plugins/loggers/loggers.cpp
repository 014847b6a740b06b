// libablate_loggers: where the trainer's per-step metrics go. Five sinks, chosen by
// `[logging] sinks`: `console` (progress bar on a terminal, plain lines elsewhere), `jsonl`
// (metrics.jsonl), `csv` (metrics.csv), `tensorboard` (an event file) and `mlflow` (a run on an
// MLflow tracking server). docs/logging.md describes each one's keys, files and resume behaviour.
#include "ablate/plugin.hpp"
#include "loggers.hpp"

namespace {

void register_components(ablate::Registrar& r) {
  ablate::loggers::register_console(r);
  ablate::loggers::register_jsonl(r);
  ablate::loggers::register_csv(r);
  ablate::loggers::register_tensorboard(r);
  ablate::loggers::register_mlflow(r);
}

}  // namespace

ABLATE_PLUGIN("loggers", "1.0.0", register_components)
