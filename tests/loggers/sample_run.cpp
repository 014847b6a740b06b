// Writes a sample run for check_tensorboard.py: the jsonl and tensorboard sinks of the plugin given
// on the command line log steps 1..4, then a run resumed at step 2 logs steps 3..4 again with other
// losses. Usage: loggers_sample_run <libablate_loggers.so> <run dir>
#include <iostream>
#include <map>

#include "ablate/logger.hpp"
#include "ablate/error.hpp"
#include "ablate/runtime/registry.hpp"
#include "sample_metrics.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: loggers_sample_run <libablate_loggers.so> <run dir>\n";
    return 2;
  }
  try {
    ablate::Registry registry;
    if (!registry.load_file(argv[1])) {
      for (const auto& f : registry.failures()) std::cerr << f.file << ": " << f.reason << "\n";
      return 1;
    }
    const ablate::Params common{"logging", {{"sinks", std::vector<std::string>{"jsonl", "tensorboard"}}, {"every", int64_t(1)}}};
    const ablate::RunContext run;
    auto run_once = [&](int64_t start_step, double offset) {
      for (const char* name : {"jsonl", "tensorboard"}) {
        const ablate::ComponentInfo& info = registry.get(ablate::Kind::logger, name);
        std::map<std::string, ablate::Value, std::less<>> values;
        for (const ablate::ParamSpec& p : info.schema) values[p.name] = p.default_value;
        const ablate::Params own{std::string("logging.") + name, values};
        auto logger = registry.create<ablate::Logger>(ablate::Kind::logger, name, {common, own, run});
        ablate::LogContext context;
        context.run_dir = argv[2];
        context.start_step = start_step;
        context.total_steps = 4;
        logger->open(context);
        for (int64_t step = start_step + 1; step <= 4; ++step) logger->log(ablate::test::sample_step(step, offset));
        logger->close();
      }
    };
    run_once(0, 0.0);
    run_once(2, 0.5);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
