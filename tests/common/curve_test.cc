#include "common/curve.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "common/zmq_util.h"
#include "tests/support/process.h"

namespace fleet {
namespace {

using std::chrono::milliseconds;

TEST(CurveTest, SelfCheckCatchesAServerThatLetsEveryKeyIn) {
  // The libzmq trap: a CURVE server and no ZAP handler accepts any key.
  zmq::context_t context(1);
  CurveKeyPair server = GenerateKeyPair();
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.set(zmq::sockopt::curve_server, 1);
  router.set(zmq::sockopt::curve_secretkey, server.secret_key);
  std::string endpoint = BindSocket(router, "tcp://127.0.0.1:*");
  std::string detail;
  EXPECT_FALSE(VerifyUnknownKeyRefused(context, endpoint, server.public_key, GenerateKeyPair(),
                                       milliseconds(5000), &detail));
  EXPECT_THAT(detail, ::testing::HasSubstr("unknown key completed the handshake"));
}

TEST(CurveTest, SelfCheckPassesWithTheHandlerAndListedKeysGetIn) {
  zmq::context_t context(1);
  CurveKeyPair server = GenerateKeyPair();
  CurveKeyPair client = GenerateKeyPair();
  ZapHandler zap(context, {{"workers", {client.public_key}}});
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  ApplyCurveServer(router, server, "workers");
  std::string endpoint = BindSocket(router, "tcp://*:0");
  std::string detail;
  EXPECT_TRUE(VerifyUnknownKeyRefused(context, endpoint, server.public_key, GenerateKeyPair(),
                                      milliseconds(5000), &detail))
      << detail;
  EXPECT_EQ(zap.refused(), 1u);

  // A listed client gets through and its message arrives.
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  ApplyCurveClient(dealer, CurveClient{server.public_key, client});
  dealer.connect("tcp://127.0.0.1:" + endpoint.substr(endpoint.rfind(':') + 1));
  dealer.send(zmq::str_buffer("hello"), zmq::send_flags::none);
  zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
  ASSERT_EQ(PollNoThrow(&item, 1, milliseconds(5000)), 1);
  std::vector<zmq::message_t> frames;
  ASSERT_TRUE(RecvMultipart(router, &frames));
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_EQ(frames[1].to_string(), "hello");
  EXPECT_EQ(frames[1].gets("User-Id"), std::string("workers"));
  EXPECT_EQ(zap.accepted(), 1u);
}

// The broker's own self-check is refused as it must be, but is not counted
// (nor logged as a warning) as a refused client.
TEST(CurveTest, SelfCheckProbeKeyIsRefusedButNotCountedAsARefusal) {
  zmq::context_t context(1);
  CurveKeyPair server = GenerateKeyPair();
  CurveKeyPair probe = GenerateKeyPair();
  ZapHandler zap(context, {{"workers", {GenerateKeyPair().public_key}}}, probe.public_key);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  ApplyCurveServer(router, server, "workers");
  std::string endpoint = BindSocket(router, "tcp://127.0.0.1:*");
  std::string detail;
  EXPECT_TRUE(VerifyUnknownKeyRefused(context, endpoint, server.public_key, probe,
                                      milliseconds(5000), &detail))
      << detail;
  EXPECT_EQ(zap.refused(), 0u);
  // Any other unlisted key still counts.
  EXPECT_TRUE(VerifyUnknownKeyRefused(context, endpoint, server.public_key, GenerateKeyPair(),
                                      milliseconds(5000), &detail))
      << detail;
  EXPECT_EQ(zap.refused(), 1u);
}

TEST(CurveTest, Z85KeysRoundTrip) {
  CurveKeyPair k = GenerateKeyPair();
  char binary[32];
  ASSERT_NE(zmq_z85_decode(reinterpret_cast<std::uint8_t*>(binary), k.public_key.c_str()),
            nullptr);
  EXPECT_EQ(EncodeZ85Key(std::string(binary, 32)), k.public_key);
  EXPECT_EQ(EncodeZ85Key("short"), "");
}

TEST(CurveTest, KeyFilesAreCheckedLineByLine) {
  fleet::testing::TempDir dir;
  CurveKeyPair k = GenerateKeyPair();
  WriteKeyPair(dir.File("k"), k);
  EXPECT_EQ(ReadKeyFile(dir.File("k.key"), true).secret_key, k.secret_key);
  EXPECT_EQ(ReadKeyFile(dir.File("k.pub"), false).public_key, k.public_key);
  EXPECT_THROW(ReadKeyFile(dir.File("k.pub"), true), std::runtime_error);
  EXPECT_THROW(WriteKeyPair(dir.File("k"), k), std::runtime_error);  // no overwrite
  std::ofstream(dir.File("list")) << "# a comment\n\n" << k.public_key << "\npublic = "
                                  << GenerateKeyPair().public_key << "\n";
  EXPECT_EQ(ReadAllowlist(dir.File("list")).size(), 2u);
  std::ofstream(dir.File("secret-list")) << "secret = " << k.secret_key << "\n";
  EXPECT_THROW(ReadAllowlist(dir.File("secret-list")), std::runtime_error);
  EXPECT_THROW(LoadCurveClient(dir.File("k.pub"), ""), std::invalid_argument);
  EXPECT_FALSE(LoadCurveClient("", "").enabled());
}

// SIGHUP's reload: after Replace, a newly listed key gets in and a removed
// one is refused, on their next handshakes.
TEST(CurveTest, ReplacedAllowlistsDecideTheNextHandshakes) {
  zmq::context_t context(1);
  CurveKeyPair server = GenerateKeyPair();
  CurveKeyPair old_key = GenerateKeyPair();
  CurveKeyPair new_key = GenerateKeyPair();
  ZapHandler zap(context, {{"producers", {old_key.public_key}}});
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  ApplyCurveServer(router, server, "producers");
  const std::string endpoint = BindSocket(router, "tcp://127.0.0.1:*");
  std::string detail;
  EXPECT_TRUE(VerifyUnknownKeyRefused(context, endpoint, server.public_key, new_key,
                                      milliseconds(5000), &detail))
      << detail;
  zap.Replace({{"producers", {new_key.public_key}}});
  EXPECT_FALSE(VerifyUnknownKeyRefused(context, endpoint, server.public_key, new_key,
                                       milliseconds(5000), &detail));
  EXPECT_THAT(detail, ::testing::HasSubstr("completed the handshake")) << "the new key got in";
  EXPECT_TRUE(VerifyUnknownKeyRefused(context, endpoint, server.public_key, old_key,
                                      milliseconds(5000), &detail))
      << detail;
  EXPECT_EQ(zap.accepted(), 1u);
  EXPECT_EQ(zap.refused(), 2u);
}

TEST(CurveTest, SecretKeyFilesOthersMayReadAreRefusedWithTheFix) {
  fleet::testing::TempDir dir;
  WriteKeyPair(dir.File("k"), GenerateKeyPair());
  const std::string key = dir.File("k.key");
  for (mode_t mode : {0644, 0640, 0604, 0660, 0601}) {
    ASSERT_EQ(::chmod(key.c_str(), mode), 0);
    try {
      ReadKeyFile(key, true);
      ADD_FAILURE() << "mode " << std::oct << mode << " accepted";
    } catch (const std::runtime_error& e) {
      char text[8];
      std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("secret key file " + key + " has mode " + text));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("chmod 600 " + key));
    }
    // Whatever flag it came from: it holds a secret.
    EXPECT_THROW(ReadKeyFile(key, false), std::runtime_error);
  }
  for (mode_t mode : {0600, 0400, 0700}) {
    ASSERT_EQ(::chmod(key.c_str(), mode), 0);
    EXPECT_NO_THROW(ReadKeyFile(key, true)) << std::oct << mode;
  }
  // Public keys and allowlists: any mode.
  ASSERT_EQ(::chmod(dir.File("k.pub").c_str(), 0644), 0);
  EXPECT_NO_THROW(ReadKeyFile(dir.File("k.pub"), false));
  EXPECT_NO_THROW(ReadAllowlist(dir.File("k.pub")));
}

}  // namespace
}  // namespace fleet
