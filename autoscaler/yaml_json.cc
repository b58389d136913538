#include "autoscaler/yaml_json.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>

namespace fleet::autoscaler {

namespace {

using nlohmann::json;

json Scalar(const YAML::Node& node) {
  const std::string& v = node.Scalar();
  // A quoted scalar (tag "!") is a string whatever it looks like.
  if (node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str") return v;
  // YAML 1.1, as Kubernetes reads manifests: 0400 is octal, yes/no/on/off
  // are booleans.
  static const std::regex kTrue("y|Y|yes|Yes|YES|true|True|TRUE|on|On|ON");
  static const std::regex kFalse("n|N|no|No|NO|false|False|FALSE|off|Off|OFF");
  static const std::regex kOctal("[-+]?0[0-7]+|[-+]?0o[0-7]+");
  static const std::regex kHex("[-+]?0x[0-9a-fA-F]+");
  static const std::regex kInt("[-+]?[0-9]+");
  static const std::regex kFloat("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
  if (v.empty() || v == "~" || v == "null" || v == "Null" || v == "NULL") return nullptr;
  if (std::regex_match(v, kTrue)) return true;
  if (std::regex_match(v, kFalse)) return false;
  try {
    if (std::regex_match(v, kOctal) || std::regex_match(v, kHex)) {
      const bool negative = v[0] == '-';
      std::string digits = v.substr(v[0] == '-' || v[0] == '+' ? 1 : 0);
      int base = 8;
      if (digits.starts_with("0x")) {
        base = 16;
        digits = digits.substr(2);
      } else if (digits.starts_with("0o")) {
        digits = digits.substr(2);
      }
      const long long n = std::stoll(digits, nullptr, base);
      return negative ? -n : n;
    }
    if (std::regex_match(v, kInt)) return std::stoll(v);
  } catch (const std::out_of_range&) {
    return v;
  }
  if (std::regex_match(v, kFloat)) return std::stod(v);
  return v;
}

json Convert(const YAML::Node& node, const std::string& what) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar:
      return Scalar(node);
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const YAML::Node& item : node) out.push_back(Convert(item, what));
      return out;
    }
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          throw std::invalid_argument(what + ": a mapping key that is not a plain value");
        }
        out[kv.first.Scalar()] = Convert(kv.second, what);
      }
      return out;
    }
  }
  return nullptr;
}

}  // namespace

json YamlToJson(const std::string& text, const std::string& what) {
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(text);
    if (docs.size() != 1) {
      throw std::invalid_argument(what + ": expected one YAML document, found " +
                                  std::to_string(docs.size()));
    }
    return Convert(docs[0], what);
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(what + ": not valid YAML or JSON: " + e.what());
  }
}

json YamlFileToJson(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::invalid_argument("cannot read " + path);
  std::ostringstream text;
  text << f.rdbuf();
  return YamlToJson(text.str(), path);
}

}  // namespace fleet::autoscaler
