#include "common/handshake_watch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cerrno>

#include "common/clock.h"

namespace fleet {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TimePoint T0() { return TimePoint{} + std::chrono::hours(1); }

TEST(HandshakeWatchTest, AnAuthRefusalFailsAtOnce) {
  HandshakeWatch w("tcp://127.0.0.1:5555", /*curve=*/true);
  EXPECT_TRUE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 400, T0()));
  EXPECT_TRUE(w.failed());
  EXPECT_THAT(w.error(), StartsWith("authentication failed: the broker at tcp://127.0.0.1:5555 "
                                    "refused this client's key (ZAP status 400)"));
  EXPECT_FALSE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 400, T0())) << "fails once";
}

TEST(HandshakeWatchTest, AMechanismMismatchFailsAtOnceWithAdviceForEachSide) {
  HandshakeWatch plain("tcp://b:1", /*curve=*/false);
  EXPECT_TRUE(plain.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, T0()));
  EXPECT_THAT(plain.error(), StartsWith("authentication failed: the broker at tcp://b:1 "
                                        "requires CURVE"));
  HandshakeWatch curve("tcp://b:1", /*curve=*/true);
  EXPECT_TRUE(curve.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH, T0()));
  EXPECT_THAT(curve.error(), HasSubstr("does not speak CURVE"));
}

TEST(HandshakeWatchTest, OtherProtocolErrorsFailAsAHandshakeFailure) {
  HandshakeWatch w("tcp://b:1", true);
  EXPECT_TRUE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC, T0()));
  EXPECT_THAT(w.error(), StartsWith("authentication failed: the CURVE handshake"));
  HandshakeWatch v("tcp://b:1", true);
  EXPECT_TRUE(v.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND, T0()));
  EXPECT_THAT(v.error(), StartsWith("handshake with tcp://b:1 failed: ZeroMQ protocol error"));
}

TEST(HandshakeWatchTest, HangUpsFailOnlyWhenTheyRepeatWithoutASuccess) {
  HandshakeWatch w("tcp://b:1", true, /*no_detail_limit=*/3);
  EXPECT_FALSE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, EPIPE, T0()));
  EXPECT_FALSE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, EPIPE, T0()));
  // A broker that restarted in the middle of a handshake: then it works.
  EXPECT_FALSE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_SUCCEEDED, 0, T0()));
  EXPECT_EQ(w.handshakes(), 1u);
  EXPECT_FALSE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, EPIPE, T0()));
  EXPECT_FALSE(w.OnEvent(ZMQ_EVENT_DISCONNECTED, 12, T0())) << "not a handshake event";
  EXPECT_FALSE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, EPIPE, T0()));
  EXPECT_FALSE(w.failed());
  EXPECT_TRUE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, EPIPE,
                        T0() + HandshakeWatch::kNoDetailSpan));
  EXPECT_THAT(w.error(), StartsWith("authentication failed: the broker at tcp://b:1 hung up "
                                    "during the handshake 3 times in a row"));
  EXPECT_THAT(w.error(), HasSubstr("--curve-server-key"));
}

// Regression: a broker's inbound budget closes new connections before
// their handshake while hundreds reconnect at once; each such close is a
// hang-up to the client, and five within a second made healthy workers
// quit with "authentication failed".
TEST(HandshakeWatchTest, HangUpsInQuickSuccessionAreNotAVerdict) {
  HandshakeWatch w("tcp://b:1", /*curve=*/false);
  for (int i = 0; i < 50; ++i) {
    EXPECT_FALSE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, EPIPE,
                           T0() + std::chrono::milliseconds(100 * i)));
  }
  EXPECT_FALSE(w.failed());
  EXPECT_TRUE(w.OnEvent(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, EPIPE,
                        T0() + HandshakeWatch::kNoDetailSpan));
}

}  // namespace
}  // namespace fleet
