// YAML (a kubeconfig, a Pod manifest) read into JSON, so that the
// Kubernetes launcher handles one kind of document. JSON is YAML too.
//
// Plain scalars are typed as Kubernetes reads manifests (YAML 1.1): null,
// booleans (true/false, yes/no, on/off, y/n), integers (0400 and 0o400 are
// octal, 0x1F hexadecimal), floats; quoted ones stay strings. One document
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
