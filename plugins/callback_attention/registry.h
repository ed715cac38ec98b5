// registry.h -- the process-wide table of callback registrations (key -> registered table), the plugin's one
// piece of global state (cad_callback_attention_v1.h says why and what the rules are).
#pragma once

#include <memory>
#include <string>

#include "cad_callback_attention_v1.h"

namespace cad::callback_attention {

// One registration: the table as registered. Instances hold it by shared_ptr; the destructor (the last holder
// gone) calls the table's release.
struct Registration {
  Registration(std::string key_, const cad_callback_attention_v1_t& table_) : key(std::move(key_)), table(table_) {}
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  std::string key;
  cad_callback_attention_v1_t table;
};

// Checks and copies `callbacks` under `key`; throws cad::plugin::Failure naming what is wrong.
void register_callbacks(const char* key, const cad_callback_attention_v1_t* callbacks);
void unregister_callbacks(const char* key);
// The registration under `key`, or NOT_FOUND naming the keys there are.
std::shared_ptr<Registration> find(const std::string& key);

}  // namespace cad::callback_attention
