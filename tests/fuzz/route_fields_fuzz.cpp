// libFuzzer target: any bytes as a request body, read by the gateway's routing scan
// (gateway/route_fields.h, scan_route_fields) and by RouteFields over nlohmann's SAX parser. The
// two must agree on whether the body is JSON, on the refusal and its reason, and on the fields of
// a body that is; with the policies' fields, the scan must read what policy_fields() reads of the
// document. The scan must not crash or read past the body.
#include <cstdint>
#include <cstring>
#include <string>

#include "gateway/route_fields.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lmserve::gateway;
  const std::string body(reinterpret_cast<const char*>(data), size);
  RouteFields sax;
  const bool sax_parsed = nlohmann::json::sax_parse(body, &sax);
  RouteFieldValues scan;
  const bool scan_parsed = scan_route_fields(body, scan);
  if (scan_parsed != sax_parsed) __builtin_trap();
  if ((scan.refusal == nullptr) != (sax.refusal == nullptr)) __builtin_trap();
  if (sax.refusal && std::strcmp(scan.refusal, sax.refusal) != 0) __builtin_trap();
  if (sax_parsed && (scan.object != sax.object || scan.model != sax.model || scan.user != sax.user || scan.stream != sax.stream)) __builtin_trap();
  RouteFieldValues scan_p;
  PolicyFieldValues policy;
  if (scan_route_fields(body, scan_p, &policy) != sax_parsed || (scan_p.refusal == nullptr) != (sax.refusal == nullptr)) __builtin_trap();
  if (sax_parsed && !sax.refusal) {
    const auto want = policy_fields(nlohmann::json::parse(body));
    if (policy.prompt_texts != want.prompt_texts || policy.message_texts != want.message_texts || policy.prompt_bytes != want.prompt_bytes ||
        policy.message_bytes != want.message_bytes || policy.max_tokens != want.max_tokens ||
        policy.max_completion_tokens != want.max_completion_tokens) {
      __builtin_trap();
    }
  }
  return 0;
}
