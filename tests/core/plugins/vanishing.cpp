// A library a test plugin links against but cannot find at load time (the plugin has no RPATH to
// its directory), so the loader meets a plugin with a missing dependency.
extern "C" __attribute__((visibility("default"))) int ablate_test_vanishing_function() { return 42; }
