#include "common/prom_api.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

namespace fleet::prom {
namespace {

// Bodies as Debian's prometheus 2.42 returned them for these queries.
constexpr std::string_view kUp =
    R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"up","instance":"127.0.0.1:19391","job":"self"},"value":[1796210946.040,"1"]}]}})";
constexpr std::string_view kScalarInf =
    R"({"status":"success","data":{"resultType":"scalar","result":[1796210946.122,"+Inf"]}})";
constexpr std::string_view kVectorNaN =
    R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1796210946.136,"NaN"]}]}})";
constexpr std::string_view kEmpty =
    R"({"status":"success","data":{"resultType":"vector","result":[]}})";
constexpr std::string_view kBadData =
    R"({"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:15: parse error: unclosed left parenthesis"})";
constexpr std::string_view kMatrix =
    R"({"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"up"},"values":[[1796210945.515,"1"]]}]}})";
constexpr std::string_view kString =
    R"({"status":"success","data":{"resultType":"string","result":[1796210946.149,"str"]}})";

TEST(PromApiTest, ParsesVector) {
  QueryResult r = ParseQueryResponse(kUp);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.result_type, "vector");
  ASSERT_EQ(r.samples.size(), 1u);
  const auto& s = r.samples[0];
  EXPECT_EQ(s.value, 1.0);
  EXPECT_DOUBLE_EQ(s.timestamp, 1796210946.040);
  EXPECT_EQ(s.labels.size(), 3u);
  EXPECT_EQ(s.labels.at("__name__"), "up");
  EXPECT_EQ(s.labels.at("job"), "self");
}

TEST(PromApiTest, ParsesSeveralSeriesAndWarnings) {
  QueryResult r = ParseQueryResponse(R"({"status":"success","warnings":["slow"],
      "data":{"resultType":"vector","result":[
        {"metric":{"worker":"w-1"},"value":[10,"17.5"]},
        {"metric":{"worker":"w-2"},"value":[10.5,"-Inf"]},
        {"metric":{"worker":"w-3"},"value":[11,"1e-3"]}]}})");
  ASSERT_TRUE(r.ok()) << r.error;
  ASSERT_EQ(r.samples.size(), 3u);
  EXPECT_EQ(r.samples[0].labels.at("worker"), "w-1");
  EXPECT_EQ(r.samples[0].value, 17.5);
  EXPECT_EQ(r.samples[0].timestamp, 10.0);
  EXPECT_EQ(r.samples[1].value, -INFINITY);
  EXPECT_EQ(r.samples[2].value, 0.001);
  EXPECT_EQ(r.warnings, std::vector<std::string>{"slow"});
}

TEST(PromApiTest, ParsesScalarAndSpecialValues) {
  QueryResult r = ParseQueryResponse(kScalarInf);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.result_type, "scalar");
  ASSERT_EQ(r.samples.size(), 1u);
  EXPECT_EQ(r.samples[0].value, INFINITY);
  EXPECT_TRUE(r.samples[0].labels.empty());

  r = ParseQueryResponse(kVectorNaN);
  ASSERT_TRUE(r.ok()) << r.error;
  ASSERT_EQ(r.samples.size(), 1u);
  EXPECT_TRUE(std::isnan(r.samples[0].value));
  EXPECT_TRUE(r.samples[0].labels.empty());

  r = ParseQueryResponse(kEmpty);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_TRUE(r.samples.empty());
}

TEST(PromApiTest, ReturnsPrometheusErrors) {
  QueryResult r = ParseQueryResponse(kBadData);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error_type, "bad_data");
  EXPECT_EQ(r.error, "invalid parameter \"query\": 1:15: parse error: unclosed left parenthesis");
  EXPECT_TRUE(r.samples.empty());

  r = ParseQueryResponse(R"({"status":"error"})");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error_type, "unknown");
  EXPECT_FALSE(r.error.empty());

  // Found by fuzz_prom_api: an empty errorType (here the last of two
  // duplicates, which is the one kept) still gives an error with a type.
  for (auto body : {R"({"status":"error","errorType":"bad_data","error":"e","errorType":""})",
                    R"({"status":"error","errorType":"","error":"e"})",
                    R"({"status":"error","errorType":7,"error":"e"})"}) {
    r = ParseQueryResponse(body);
    EXPECT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error_type, "unknown") << body;
    EXPECT_EQ(r.error, "e") << body;
  }
}

TEST(PromApiTest, RejectsUnsupportedResultTypes) {
  for (auto body : {kMatrix, kString}) {
    QueryResult r = ParseQueryResponse(body);
    EXPECT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error_type, "client");
    EXPECT_NE(r.error.find("unsupported resultType"), std::string::npos) << r.error;
  }
}

TEST(PromApiTest, RejectsGarbageWithoutThrowing) {
  const std::string bodies[] = {
      "",
      "not json",
      "<html>502 Bad Gateway</html>",
      R"({"status":"success","data":{"resultType":"vector","result":[)",  // truncated
      "[]",
      "42",
      R"({"data":{}})",
      R"({"status":7})",
      R"({"status":"maybe"})",
      R"({"status":"success"})",
      R"({"status":"success","data":[]})",
      R"({"status":"success","data":{"resultType":"vector"}})",
      R"({"status":"success","data":{"resultType":5,"result":[]}})",
      R"({"status":"success","data":{"resultType":"vector","result":{}}})",
      R"({"status":"success","data":{"resultType":"vector","result":[1]}})",
      R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}})",
      R"({"status":"success","data":{"resultType":"vector","result":[{"value":"1"}]}})",
      R"({"status":"success","data":{"resultType":"vector","result":[{"value":[1]}]}})",
      R"({"status":"success","data":{"resultType":"vector","result":[{"value":[1,"x"]}]}})",
      R"({"status":"success","data":{"resultType":"vector","result":[{"value":["1","1"]}]}})",
      R"({"status":"success","data":{"resultType":"vector","result":[{"value":[1,null]}]}})",
      R"({"status":"success","data":{"resultType":"vector","result":[{"value":[1,"1",2]}]}})",
      R"({"status":"success","data":{"resultType":"vector","result":[{"metric":[],"value":[1,"1"]}]}})",
      R"({"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":1},"value":[1,"1"]}]}})",
      R"({"status":"success","data":{"resultType":"scalar","result":"1"}})",
      R"({"status":"success","data":{"resultType":"scalar","result":[1,"1e999"]}})",
      std::string("{\"status\":\"succ\0ess\"}", 21),
      "\xff\xfe{}",
  };
  for (const auto& body : bodies) {
    QueryResult r;
    ASSERT_NO_THROW(r = ParseQueryResponse(body)) << body;
    EXPECT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error_type, "client") << body;
    EXPECT_TRUE(r.samples.empty()) << body;
  }
}

TEST(PromApiTest, NeverThrowsOnDamagedResponses) {
  std::mt19937 rng(7);
  const std::string alphabet = "{}[]\",:0123456789.-+eE\\ntrufalsNI ";
  const std::string bodies[] = {std::string(kUp), std::string(kScalarInf), std::string(kBadData)};
  for (int round = 0; round < 3000; ++round) {
    std::string body = bodies[round % 3];
    body.resize(rng() % (body.size() + 1));
    for (int i = 0; i < 4 && !body.empty(); ++i) {
      body[rng() % body.size()] = alphabet[rng() % alphabet.size()];
    }
    QueryResult r;
    ASSERT_NO_THROW(r = ParseQueryResponse(body)) << body;
    if (!r.ok()) {
      EXPECT_TRUE(r.samples.empty()) << body;
    }
  }
}

TEST(PromApiTest, EnforcesSizeDepthAndSampleLimits) {
  QueryLimits limits;
  limits.max_bytes = kUp.size() - 1;
  EXPECT_FALSE(ParseQueryResponse(kUp, limits).ok());

  std::string deep(100000, '[');
  QueryResult r = ParseQueryResponse(deep);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.error.find("nested"), std::string::npos) << r.error;
  // Brackets inside strings do not count towards the depth.
  std::string in_string =
      R"({"status":"error","errorType":"x","error":")" + std::string(1000, '[') + R"("})";
  EXPECT_EQ(ParseQueryResponse(in_string).error_type, "x");

  limits = QueryLimits();
  limits.max_samples = 2;
  std::string three = R"({"status":"success","data":{"resultType":"vector","result":[)"
                      R"({"value":[1,"1"]},{"value":[1,"2"]},{"value":[1,"3"]}]}})";
  EXPECT_FALSE(ParseQueryResponse(three, limits).ok());
  limits.max_samples = 3;
  EXPECT_EQ(ParseQueryResponse(three, limits).samples.size(), 3u);
}

TEST(PromApiTest, BuildsEncodedQueryUrl) {
  EXPECT_EQ(QueryUrl("http://prometheus:9090", "up"),
            "http://prometheus:9090/api/v1/query?query=up");
  EXPECT_EQ(QueryUrl("http://prometheus:9090/", "up"),
            "http://prometheus:9090/api/v1/query?query=up");
  EXPECT_EQ(QueryUrl("http://h/prom//", "x"), "http://h/prom/api/v1/query?query=x");
  EXPECT_EQ(QueryUrl("http://h:9090", R"(sum(fleet_queue_depth{queue="a b"}) + 1/2&x=#)"),
            "http://h:9090/api/v1/query?query="
            "sum%28fleet_queue_depth%7Bqueue%3D%22a%20b%22%7D%29%20%2B%201%2F2%26x%3D%23");
  EXPECT_EQ(QueryUrl("http://h", "max_over_time(x[5m])"),
            "http://h/api/v1/query?query=max_over_time%28x%5B5m%5D%29");
}

}  // namespace
}  // namespace fleet::prom
