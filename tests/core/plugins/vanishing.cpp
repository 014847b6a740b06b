// A library that a test plugin links against and that is deleted right after the build, so the
// loader meets a plugin with a missing dependency.
extern "C" __attribute__((visibility("default"))) int ablate_test_vanishing_function() { return 42; }
