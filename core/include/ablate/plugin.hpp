// What a plugin library exports: one C entry point (through BOOST_DLL_ALIAS) returning a
// descriptor whose first field is the API version, so the loader can check it before it reads or
// calls anything else. A plugin's entry file ends with
//
//   static void register_components(ablate::Registrar& r) { r.add({...}); }
//   ABLATE_PLUGIN("packed", "1.0.0", register_components)
#pragma once

#include <boost/dll/alias.hpp>

#include "ablate/component.hpp"
#include "ablate/version.hpp"

namespace ablate {

// Never reorder: api_version must stay the first member.
struct PluginDescriptor {
  int api_version;
  const char* name;
  const char* version;
  const char* fingerprint;
  void (*register_components)(Registrar&);
};

using PluginEntryFn = const PluginDescriptor*();

inline constexpr const char* kPluginEntrySymbol = "ablate_plugin_entry";

}  // namespace ablate

// Tests build plugins with another API version by defining this one; nobody else should.
#ifndef ABLATE_PLUGIN_API_VERSION
#define ABLATE_PLUGIN_API_VERSION ABLATE_API_VERSION
#endif

#define ABLATE_PLUGIN(NAME, VERSION, REGISTER_FN)                                                                 \
  namespace {                                                                                                     \
  const ::ablate::PluginDescriptor ablate_plugin_descriptor_instance = {ABLATE_PLUGIN_API_VERSION, NAME, VERSION, \
                                                                        ABLATE_BUILD_FINGERPRINT, &REGISTER_FN};  \
  const ::ablate::PluginDescriptor* ablate_plugin_descriptor() { return &ablate_plugin_descriptor_instance; }     \
  }                                                                                                               \
  BOOST_DLL_ALIAS(ablate_plugin_descriptor, ablate_plugin_entry)
