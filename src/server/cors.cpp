#include "server/cors.h"

#include <algorithm>
#include <cctype>

#include "longctx/core/error.h"

namespace longctx::server {

namespace {

bool contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

bool any(const std::vector<std::string>& v) { return contains(v, "*"); }

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool origin_allowed(const CorsOptions& o, std::string_view origin) {
  return !origin.empty() && (any(o.allowed_origins) || contains(o.allowed_origins, origin));
}

// Starlette's list for allow_methods=["*"].
const std::vector<std::string> kAllMethods = {"DELETE", "GET",  "HEAD", "OPTIONS",
                                              "PATCH",  "POST", "PUT"};

}  // namespace

void CorsOptions::validate() const {
  for (const std::string& origin : allowed_origins) {
    if (origin == "*") continue;
    const size_t scheme = origin.find("://");
    LONGCTX_CHECK(scheme != std::string::npos && scheme > 0 &&
                      origin.find('/', scheme + 3) == std::string::npos &&
                      origin.size() > scheme + 3,
                  ErrorCode::kInvalidArgument,
                  "--allowed-origins: '{}' is not an origin (scheme://host[:port], no path, "
                  "or *)",
                  origin);
  }
  for (const std::string& m : allowed_methods) {
    LONGCTX_CHECK(
        m == "*" || (!m.empty() && std::all_of(m.begin(), m.end(),
                                               [](char c) {
                                                 return std::isalpha(static_cast<unsigned char>(c));
                                               })),
        ErrorCode::kInvalidArgument,
        "--allowed-methods: '{}' is not a method name (GET, POST, ... or *)", m);
  }
  for (const std::string& h : allowed_headers) {
    LONGCTX_CHECK(h == "*" || (!h.empty() && h.find_first_of(" \t\r\n:,") == std::string::npos),
                  ErrorCode::kInvalidArgument, "--allowed-headers: '{}' is not a header name", h);
  }
}

std::vector<std::string> split_comma_list(const std::string& list) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string item = list.substr(pos, end - pos);
    const size_t b = item.find_first_not_of(" \t");
    const size_t e = item.find_last_not_of(" \t");
    if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    pos = end + 1;
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> cors_headers(const CorsOptions& o,
                                                              const HttpRequest& req) {
  std::vector<std::pair<std::string, std::string>> h;
  if (!o.enabled()) return h;
  const std::string_view origin = req.header("origin");
  if (any(o.allowed_origins)) {
    h.emplace_back("Access-Control-Allow-Origin", "*");
  } else {
    // The answer depends on the request's Origin: caches must key on it.
    h.emplace_back("Vary", "Origin");
    if (origin_allowed(o, origin)) h.emplace_back("Access-Control-Allow-Origin", origin);
  }
  return h;
}

std::optional<HttpResponse> cors_preflight(const CorsOptions& o, const HttpRequest& req) {
  if (!o.enabled() || req.method != "OPTIONS") return std::nullopt;
  const std::string_view origin = req.header("origin");
  const std::string_view method = req.header("access-control-request-method");
  if (origin.empty() || method.empty()) return std::nullopt;
  HttpResponse r;
  r.content_type = "text/plain; charset=utf-8";
  std::vector<std::string> failures;
  if (!origin_allowed(o, origin)) failures.push_back("origin");
  if (!any(o.allowed_methods) && !contains(o.allowed_methods, upper(std::string(method))))
    failures.push_back("method");
  const std::string requested = std::string(req.header("access-control-request-headers"));
  if (!any(o.allowed_headers)) {
    for (const std::string& name : split_comma_list(requested)) {
      bool ok = false;
      for (const std::string& allowed : o.allowed_headers) {
        ok = ok || std::equal(name.begin(), name.end(), allowed.begin(), allowed.end(),
                              [](char a, char b) { return std::tolower(a) == std::tolower(b); });
      }
      if (!ok) {
        failures.push_back("headers");
        break;
      }
    }
  }
  r.headers.emplace_back("Vary", "Origin");
  if (!failures.empty()) {
    r.status = 400;
    r.body = "Disallowed CORS " + join(failures) + "\n";
    return r;
  }
  r.status = 204;
  r.headers.emplace_back("Access-Control-Allow-Origin",
                         any(o.allowed_origins) ? std::string("*") : std::string(origin));
  r.headers.emplace_back("Access-Control-Allow-Methods",
                         any(o.allowed_methods) ? join(kAllMethods) : join(o.allowed_methods));
  const std::string headers = any(o.allowed_headers) ? requested : join(o.allowed_headers);
  if (!headers.empty()) r.headers.emplace_back("Access-Control-Allow-Headers", headers);
  r.headers.emplace_back("Access-Control-Max-Age", std::to_string(o.max_age_s));
  return r;
}

}  // namespace longctx::server
