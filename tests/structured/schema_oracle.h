// Test oracles written apart from src/structured: a JSON Schema validator for the supported
// subset, and an enumerator of every compact document of a finite schema (in schema property
// order, as the grammar writes them).
#pragma once

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace longctx::structured::testing {

using OJson = nlohmann::ordered_json;

inline const OJson& resolve(const OJson& root, const OJson& s) {
  if (s.is_object() && s.contains("$ref")) {
    const std::string ref = s["$ref"];
    return resolve(root, root.at(OJson::json_pointer(ref.substr(1))));
  }
  return s;
}

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

inline bool has_type(const OJson& v, const std::string& t) {
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "integer") {
    return v.is_number_integer() ||
           (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  }
  if (t == "number") return v.is_number();
  if (t == "boolean") return v.is_boolean();
  if (t == "null") return v.is_null();
  return false;
}

// True when `v` is valid against `s` (subset: the keywords src/structured supports).
inline bool validate(const OJson& root, const OJson& schema, const OJson& v) {
  const OJson& s = resolve(root, schema);
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("const") && !(s["const"] == v)) return false;
  if (s.contains("enum")) {
    bool found = false;
    for (const OJson& e : s["enum"]) found = found || e == v;
    if (!found) return false;
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (!s.contains(k)) continue;
    int n = 0;
    for (const OJson& sub : s[k]) n += validate(root, sub, v);
    if (n == 0 || (std::string(k) == "oneOf" && n != 1)) return false;
  }
  if (s.contains("allOf")) {
    for (const OJson& sub : s["allOf"]) {
      if (!validate(root, sub, v)) return false;
    }
  }
  if (s.contains("type")) {
    std::vector<std::string> types;
    if (s["type"].is_string()) {
      types.push_back(s["type"]);
    } else {
      for (const OJson& t : s["type"]) types.push_back(t);
    }
    bool ok = false;
    for (const auto& t : types) ok = ok || has_type(v, t);
    if (!ok) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
    if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
    if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return false;
    if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return false;
  }
  if (v.is_string()) {
    const size_t n = code_points(v.get<std::string>());
    if (s.contains("minLength") && n < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && n > s["maxLength"].get<size_t>()) return false;
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    if (s.contains("items")) {
      for (const OJson& x : v) {
        if (!validate(root, s["items"], x)) return false;
      }
    }
  }
  if (v.is_object()) {
    if (s.contains("required")) {
      for (const OJson& r : s["required"]) {
        if (!v.contains(r.get<std::string>())) return false;
      }
    }
    for (const auto& [k, x] : v.items()) {
      if (s.contains("properties") && s["properties"].contains(k)) {
        if (!validate(root, s["properties"][k], x)) return false;
      } else if (s.contains("additionalProperties")) {
        if (!validate(root, s["additionalProperties"], x)) return false;
      }
    }
  }
  return true;
}

// Every compact document of a finite schema: enum, const, boolean, null, bounded integers,
// objects of those (properties in schema order, optional ones present or not), arrays with
// maxItems, anyOf.
inline std::vector<std::string> enumerate(const OJson& root, const OJson& schema) {
  const OJson& s = resolve(root, schema);
  std::vector<std::string> out;
  if (s.contains("const")) return {s["const"].dump()};
  if (s.contains("enum")) {
    for (const OJson& e : s["enum"]) out.push_back(e.dump());
    return out;
  }
  if (s.contains("anyOf")) {
    std::set<std::string> all;
    for (const OJson& sub : s["anyOf"]) {
      for (auto& d : enumerate(root, sub)) all.insert(d);
    }
    return {all.begin(), all.end()};
  }
  const std::string t = s["type"];
  if (t == "boolean") return {"true", "false"};
  if (t == "null") return {"null"};
  if (t == "integer") {
    for (int64_t i = s["minimum"].get<int64_t>(); i <= s["maximum"].get<int64_t>(); ++i) {
      out.push_back(std::to_string(i));
    }
    return out;
  }
  if (t == "array") {
    const auto items = enumerate(root, s["items"]);
    const size_t lo = s.value("minItems", size_t{0}), hi = s["maxItems"].get<size_t>();
    std::vector<std::string> level = {""};
    for (size_t n = 0; n <= hi; ++n) {
      if (n >= lo) {
        for (const auto& l : level) out.push_back("[" + l + "]");
      }
      std::vector<std::string> next;
      for (const auto& l : level) {
        for (const auto& x : items) next.push_back(l.empty() && n == 0 ? x : l + "," + x);
      }
      level = std::move(next);
    }
    return out;
  }
  // object
  std::set<std::string> required;
  if (s.contains("required")) {
    for (const OJson& r : s["required"]) required.insert(r);
  }
  std::vector<std::string> bodies = {""};
  for (const auto& [name, sub] : s["properties"].items()) {
    std::vector<std::string> next;
    const auto values = enumerate(root, sub);
    for (const auto& b : bodies) {
      if (!required.count(name)) next.push_back(b);
      for (const auto& v : values) {
        next.push_back(b + (b.empty() ? "" : ",") + OJson(name).dump() + ":" + v);
      }
    }
    bodies = std::move(next);
  }
  for (const auto& b : bodies) out.push_back("{" + b + "}");
  return out;
}

}  // namespace longctx::structured::testing
