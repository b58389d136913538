// The Kubernetes launcher's offline parts: YAML read as JSON, the kubeconfig
// (token file, *-data certificates, namespace), and the worker pod built
// from a template. Against a real API server: tests/kubernetes/kube_test.py
// (make test-kubernetes).
#include "autoscaler/kubernetes_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "autoscaler/yaml_json.h"
#include "tests/autoscaler/launcher_test_util.h"
#include "tests/support/process.h"

namespace fleet::autoscaler {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

using testing::ThrownBy;

TEST(YamlJsonTest, PlainScalarsAreTypedAsKubernetesReadsThemAndQuotedOnesStayStrings) {
  json j = YamlToJson(R"(
a: 1
b: "1"
c: true
d: 'true'
e: 1.5
f: ~
g: [x, 2]
h: {k: v}
i: 0755
)", "t");
  EXPECT_EQ(j["a"], 1);
  EXPECT_EQ(j["b"], "1");
  EXPECT_EQ(j["c"], true);
  EXPECT_EQ(j["d"], "true");
  EXPECT_EQ(j["e"], 1.5);
  EXPECT_TRUE(j["f"].is_null());
  EXPECT_EQ(j["g"], json::parse(R"(["x", 2])"));
  EXPECT_EQ(j["h"]["k"], "v");
  // As Kubernetes reads them (YAML 1.1): a file mode in octal stays that mode.
  EXPECT_EQ(j["i"], 0755);
  json k = YamlToJson("a: 0400\nb: 0o17\nc: 0x1F\nd: yes\ne: off\nf: '0400'\ng: -12\n", "t");
  EXPECT_EQ(k["a"], 0400);
  EXPECT_EQ(k["b"], 017);
  EXPECT_EQ(k["c"], 31);
  EXPECT_EQ(k["d"], true);
  EXPECT_EQ(k["e"], false);
  EXPECT_EQ(k["f"], "0400");
  EXPECT_EQ(k["g"], -12);
  EXPECT_EQ(YamlToJson(R"({"json": [1, "two"]})", "t")["json"][1], "two");
  EXPECT_THAT(ThrownBy([] { YamlToJson("a: [1,", "f.yaml"); }), HasSubstr("f.yaml: not valid"));
  EXPECT_THAT(ThrownBy([] { YamlToJson("a: 1\n---\nb: 2\n", "f.yaml"); }),
              HasSubstr("one YAML document"));
}

class KubernetesEngineTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  DockerOptions Options() {
    DockerOptions o;
    o.pool = "fleet";
    o.image = "fleet:test";
    o.worker_args = "--broker tcp://fleet-broker:5556 --handler sleep";
    o.env = {"FLEET_LOG_LEVEL=debug"};
    o.cpus = 0.5;
    o.stop_grace = Seconds(20);
    Write("token", "secret-token\n");
    o.kube_config = Write("kubeconfig", R"(
apiVersion: v1
kind: Config
current-context: ctx
clusters:
- name: c1
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority-data: LS0tLS1CRUdJTg==
users:
- name: u1
  user:
    tokenFile: token
contexts:
- name: ctx
  context: {cluster: c1, user: u1, namespace: work}
)");
    return o;
  }
  fleet::testing::TempDir dir_;
};

TEST_F(KubernetesEngineTest, TheKubeconfigsContextGivesServerCredentialsAndNamespace) {
  KubernetesEngine e(Options());
  EXPECT_EQ(e.address(), "https://10.0.0.1:6443 namespace work");
  EXPECT_EQ(e.namespace_name(), "work");
  DockerOptions o = Options();
  o.kube_namespace = "other";
  o.kube_api = "https://api.example:443";
  EXPECT_EQ(KubernetesEngine(o).address(), "https://api.example:443 namespace other");
}

TEST_F(KubernetesEngineTest, BadKubeconfigsAndTemplatesAreRefusedWithTheReason) {
  DockerOptions o = Options();
  o.kube_config = Write("exec", R"({"current-context": "c", "contexts": [{"name": "c",
    "context": {"cluster": "k", "user": "u"}}], "clusters": [{"name": "k", "cluster":
    {"server": "https://h"}}], "users": [{"name": "u", "user": {"exec": {"command": "x"}}}]})");
  EXPECT_THAT(ThrownBy([&] { KubernetesEngine e(o); }), HasSubstr("logs in through a plugin"));
  o.kube_config = Write("nocontext", R"({"current-context": "missing"})");
  EXPECT_THAT(ThrownBy([&] { KubernetesEngine e(o); }), HasSubstr("no context entry named"));

  o = Options();
  o.kube_pod_template = Write("priv.yaml", R"(
kind: Pod
spec:
  containers:
  - name: worker
    securityContext: {privileged: true}
)");
  EXPECT_THAT(ThrownBy([&] { KubernetesEngine e(o); }), HasSubstr("asks for privileges"));
  o.kube_pod_template = Write("hostnet.yaml", "kind: Pod\nspec:\n  hostNetwork: true\n"
                                              "  containers: [{name: worker}]\n");
  EXPECT_THAT(ThrownBy([&] { KubernetesEngine e(o); }), HasSubstr("hostNetwork"));
  o.kube_pod_template = Write("deploy.yaml", "kind: Deployment\nspec: {}\n");
  EXPECT_THAT(ThrownBy([&] { KubernetesEngine e(o); }), HasSubstr("not a Pod manifest"));
  o = Options();
  o.pool = "Fleet_1";
  EXPECT_THAT(ThrownBy([&] { KubernetesEngine e(o); }), HasSubstr("lower-case"));
  // A refusal after the kubeconfig's key was copied out leaves no copy.
  auto copies = [] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/tmp")) {
      n += e.path().filename().string().starts_with("fleet-kube-");
    }
    return n;
  };
  const int before = copies();
  o.kube_config = Write("keyed", R"({"current-context": "c", "contexts": [{"name": "c",
    "context": {"cluster": "k", "user": "u"}}], "clusters": [{"name": "k", "cluster":
    {"server": "https://h"}}], "users": [{"name": "u", "user": {"client-key-data": "a2V5"}}]})");
  EXPECT_THAT(ThrownBy([&] { KubernetesEngine e(o); }), HasSubstr("lower-case"));
  EXPECT_EQ(copies(), before);
}

TEST_F(KubernetesEngineTest, TheBuiltInPodIsLockedDownAndNeverRestarted) {
  KubernetesEngine e(Options());
  json pod = json::parse(e.CreateBody("w1"));
  EXPECT_EQ(pod["metadata"]["name"], "fleet-w1");
  EXPECT_EQ(pod["metadata"]["namespace"], "work");
  EXPECT_EQ(pod["metadata"]["labels"]["fleet.pool"], "fleet");
  EXPECT_EQ(pod["metadata"]["labels"]["fleet.worker-id"], "w1");
  EXPECT_EQ(pod["metadata"]["labels"]["fleet.role"], "worker");
  EXPECT_FALSE(pod["metadata"].contains("ownerReferences"));  // no --kube-owner-pod
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_EQ(pod["spec"]["terminationGracePeriodSeconds"], 20);
  const json& c = pod["spec"]["containers"][0];
  EXPECT_EQ(c["name"], "worker");
  EXPECT_EQ(c["image"], "fleet:test");
  EXPECT_EQ(c["command"][2],
            "exec 'fleet-worker' --id 'w1' --broker tcp://fleet-broker:5556 --handler sleep");
  EXPECT_EQ(c["resources"]["requests"]["cpu"], "500m");
  EXPECT_EQ(c["resources"]["limits"]["memory"], std::to_string(512ll << 20));
  EXPECT_EQ(c["securityContext"]["allowPrivilegeEscalation"], false);
  EXPECT_EQ(c["securityContext"]["readOnlyRootFilesystem"], true);
  EXPECT_EQ(c["securityContext"]["capabilities"]["drop"][0], "ALL");
  EXPECT_EQ(c["ports"][0]["name"], "metrics");
  EXPECT_EQ(c["ports"][0]["containerPort"], 9752);
  EXPECT_THAT(c["env"].dump(), HasSubstr(R"({"name":"FLEET_METRICS","value":"0.0.0.0:9752"})"));
  EXPECT_THAT(c["env"].dump(), HasSubstr(R"({"name":"FLEET_LOG_LEVEL","value":"debug"})"));
  EXPECT_EQ(c["volumeMounts"][0]["mountPath"], "/tmp");
  EXPECT_EQ(pod["spec"]["volumes"][0]["emptyDir"]["sizeLimit"], "64Mi");
}

TEST_F(KubernetesEngineTest, ATemplateKeepsWhatItSaysAndTheLauncherSetsWhatItMust) {
  DockerOptions o = Options();
  o.kube_pod_template = Write("pod.yaml", R"(
apiVersion: v1
kind: Pod
metadata:
  name: ignored
  labels: {team: ml, fleet.pool: someone-else}
spec:
  restartPolicy: Always
  nodeSelector: {pool: gpu}
  terminationGracePeriodSeconds: 90
  containers:
  - name: sidecar
    image: busybox
  - name: worker
    image: registry.example/fleet:1.2
    args: [ignored]
    securityContext: {runAsUser: 10001, readOnlyRootFilesystem: false}
    resources:
      requests: {cpu: "2", nvidia.com/gpu: 1}
)");
  KubernetesEngine e(o);
  json pod = json::parse(e.CreateBody("w7"));
  EXPECT_EQ(pod["metadata"]["name"], "fleet-w7");
  EXPECT_EQ(pod["metadata"]["labels"]["team"], "ml");
  EXPECT_EQ(pod["metadata"]["labels"]["fleet.pool"], "fleet");  // never another pool's
  EXPECT_EQ(pod["spec"]["restartPolicy"], "Never");
  EXPECT_EQ(pod["spec"]["nodeSelector"]["pool"], "gpu");
  EXPECT_EQ(pod["spec"]["terminationGracePeriodSeconds"], 90);
  EXPECT_EQ(pod["spec"]["containers"][0]["image"], "busybox");  // the sidecar untouched
  EXPECT_FALSE(pod["spec"]["containers"][0].contains("command"));
  const json& w = pod["spec"]["containers"][1];
  EXPECT_EQ(w["image"], "registry.example/fleet:1.2");
  EXPECT_FALSE(w.contains("args"));
  EXPECT_THAT(w["command"][2].get<std::string>(), HasSubstr("--id 'w7'"));
  EXPECT_EQ(w["resources"]["requests"]["nvidia.com/gpu"], 1);
  // A securityContext that sets one field keeps the safe defaults of the rest.
  EXPECT_EQ(w["securityContext"]["runAsUser"], 10001);
  EXPECT_EQ(w["securityContext"]["allowPrivilegeEscalation"], false);
  EXPECT_EQ(w["securityContext"]["readOnlyRootFilesystem"], false);  // the template's say
  EXPECT_EQ(w["securityContext"]["capabilities"]["drop"][0], "ALL");
  EXPECT_FALSE(w["resources"].contains("limits"));  // the template's resources, as they are
}

}  // namespace
}  // namespace fleet::autoscaler
