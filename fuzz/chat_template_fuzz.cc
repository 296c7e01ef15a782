// Fuzzes the template engine: any source either fails to parse with an error
// or renders (or fails to render) a chat without crashing.
#include <cstddef>
#include <cstdint>
#include <string>

#include "jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view source(reinterpret_cast<const char*>(data), size);
  auto t = failsafe::jinja::Template::Parse(source, "fuzz.jinja");
  if (!t.ok()) return 0;
  static const failsafe::jinja::Dict context = [] {
    failsafe::jinja::Dict d;
    d.Set(failsafe::jinja::Value("messages"),
          failsafe::jinja::Value::FromJson(nlohmann::ordered_json::parse(
              R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi é"},
                  {"role": "assistant", "content": ""}])")));
    d.Set(failsafe::jinja::Value("add_generation_prompt"), failsafe::jinja::Value(true));
    d.Set(failsafe::jinja::Value("bos_token"), failsafe::jinja::Value("<s>"));
    return d;
  }();
  (void)(*t)->Render(context);
  return 0;
}
