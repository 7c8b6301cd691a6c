// CORS as vLLM answers it (Starlette's CORSMiddleware), but off unless origins are given: with
// no allowed origins no response carries Access-Control-* headers and OPTIONS is an ordinary
// (unknown-method) request. With origins, a request whose Origin is allowed gets
// Access-Control-Allow-Origin (`*`, or its origin echoed with Vary: Origin), and a preflight
// (OPTIONS with Origin and Access-Control-Request-Method) is answered 204 with the allowed
// methods and headers, or 400 naming what is not allowed.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/http_types.h"

namespace longctx::server {

struct CorsOptions {
  std::vector<std::string> allowed_origins;          // empty: CORS off; "*": any origin
  std::vector<std::string> allowed_methods = {"*"};  // "*": any
  std::vector<std::string> allowed_headers = {"*"};  // "*": whatever the preflight asks
  int max_age_s = 600;  // how long a browser may cache a preflight's answer
  bool enabled() const { return !allowed_origins.empty(); }
  // Throws Error(kInvalidArgument) naming a malformed entry (empty, or an origin with a path).
  void validate() const;
};

// "a, b,c" -> {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split_comma_list(const std::string& list);

// The headers an actual (non-preflight) response to `req` carries.
std::vector<std::pair<std::string, std::string>> cors_headers(const CorsOptions& o,
                                                              const HttpRequest& req);
// The answer to a preflight, or nullopt when `req` is not one (or CORS is off).
std::optional<HttpResponse> cors_preflight(const CorsOptions& o, const HttpRequest& req);

}  // namespace longctx::server
