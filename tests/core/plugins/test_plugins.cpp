// Plugins used only by the loader and config tests; never installed. One source, compiled into
// several libraries whose behaviour is chosen by compile definitions:
//   ABLATE_TEST_COMPONENT  the logger name it registers (duplicates are made by reusing a name)
//   ABLATE_PLUGIN_API_VERSION  set to another value to make a plugin the loader must refuse
#include "ablate/logger.hpp"
#include "ablate/metrics.hpp"
#include "ablate/plugin.hpp"

#ifdef ABLATE_TEST_NEEDS_VANISHING_LIBRARY
extern "C" int ablate_test_vanishing_function();  // in a library the loader cannot find
#endif

namespace {

class RecordingLogger final : public ablate::Logger {
 public:
  explicit RecordingLogger(std::string prefix) : prefix_(std::move(prefix)) {}
  void open(const ablate::LogContext&) override {}
  void log(const ablate::StepMetrics&) override {}
  void close() override {}
  std::string prefix_;
};

void register_components(ablate::Registrar& r) {
#ifdef ABLATE_TEST_NEEDS_VANISHING_LIBRARY
  (void)ablate_test_vanishing_function();
#endif
  using namespace ablate::param;
  r.add({ablate::Kind::logger,
         ABLATE_TEST_COMPONENT,
         "0.0.1",
         "test logger",
         {string("prefix", "x", "a prefix"), integer("width", 3, "a width").within(1, 10)},
         [](const ablate::ComponentArgs& a) { return std::make_unique<RecordingLogger>(a.own.get_string("prefix")); },
         "",
         {}});
}

}  // namespace

ABLATE_PLUGIN("test_" ABLATE_TEST_COMPONENT, "0.0.1", register_components)
