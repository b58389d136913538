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
  static const std::regex kInt("[-+]?[0-9]+");
  static const std::regex kFloat("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
  if (v.empty() || v == "~" || v == "null" || v == "Null" || v == "NULL") return nullptr;
  if (v == "true" || v == "True" || v == "TRUE") return true;
  if (v == "false" || v == "False" || v == "FALSE") return false;
  if (std::regex_match(v, kInt)) {
    try {
      return std::stoll(v);
    } catch (const std::out_of_range&) {
      return v;
    }
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
