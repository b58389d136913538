// YAML (a kubeconfig, a Pod manifest) read into JSON, so that the
// Kubernetes launcher handles one kind of document. JSON is YAML too.
//
// Plain scalars become what YAML 1.2's core schema says they are (null,
// true/false, integers, floats), quoted ones stay strings. One document
// per file; anchors and aliases resolve; tags other than the core ones are
// refused. Pure functions; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace fleet::autoscaler {

// Throws std::invalid_argument naming `what` and saying what is wrong.
nlohmann::json YamlToJson(const std::string& text, const std::string& what);

// Reads the file first (std::invalid_argument when it cannot be read).
nlohmann::json YamlFileToJson(const std::string& path);

}  // namespace fleet::autoscaler
