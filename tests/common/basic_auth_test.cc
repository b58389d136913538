#include "common/basic_auth.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdexcept>
#include <string>

#include "tests/support/process.h"

namespace fleet {
namespace {

using ::testing::HasSubstr;

// Writes `text` to a new file with exactly `mode` (whatever the umask).
std::string WriteFile(const testing::TempDir& dir, const std::string& name,
                      const std::string& text, mode_t mode) {
  std::string path = dir.File(name);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  EXPECT_EQ(::fchmod(fd, mode), 0);
  ::close(fd);
  return path;
}

// The message ReadBasicAuthFile throws, or "" when it reads the file.
std::string AuthFileErrorOf(const std::string& path) {
  try {
    ReadBasicAuthFile(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(BasicAuthTest, ReadsUserAndPasswordFromAnOwnerOnlyFile) {
  testing::TempDir dir;
  struct Case {
    const char* text;
    mode_t mode;
    const char* user;
    const char* password;
  } cases[] = {
      {"prom:s3cret\n", 0600, "prom", "s3cret"},
      {"prom:s3cret", 0400, "prom", "s3cret"},
      {"prom:s3cret\r\n", 0600, "prom", "s3cret"},
      {"prom:pa:ss word \n", 0600, "prom", "pa:ss word "},  // only the first ':' splits
  };
  int n = 0;
  for (const auto& c : cases) {
    std::string path = WriteFile(dir, "auth" + std::to_string(n++), c.text, c.mode);
    BasicAuth auth = ReadBasicAuthFile(path);
    EXPECT_EQ(auth.username, c.user) << c.text;
    EXPECT_EQ(auth.password, c.password) << c.text;
  }
}

TEST(BasicAuthTest, RefusesAFileGroupOrOthersCanReachAndSaysHowToFixIt) {
  testing::TempDir dir;
  for (mode_t mode : {0644, 0640, 0604, 0660, 0606, 0620, 0700, 0500}) {
    std::string path = WriteFile(dir, "auth", "prom:s3cret\n", mode);
    std::string error = AuthFileErrorOf(path);
    EXPECT_THAT(error, HasSubstr(path)) << std::oct << mode;
    EXPECT_THAT(error, HasSubstr("chmod 600 " + path)) << std::oct << mode;
    EXPECT_THAT(error, HasSubstr("0600 or 0400")) << std::oct << mode;
  }
  EXPECT_THAT(AuthFileErrorOf(WriteFile(dir, "auth", "prom:s3cret\n", 0644)), HasSubstr("mode 0644"));
}

TEST(BasicAuthTest, RefusesMissingEmptyAndMalformedFilesNamingTheFile) {
  testing::TempDir dir;
  struct Case {
    const char* text;
    const char* error;
  } cases[] = {
      {"", "empty"},
      {"\n", "empty"},
      {"prom-s3cret\n", "no ':'"},
      {":s3cret\n", "empty user"},
      {"prom:\n", "empty password"},
      {"prom:s3cret\nother:pw\n", "more than one line"},
      {"prom:s3cret\n\n", "more than one line"},
  };
  for (const auto& c : cases) {
    std::string path = WriteFile(dir, "auth", c.text, 0600);
    std::string error = AuthFileErrorOf(path);
    EXPECT_THAT(error, HasSubstr(path)) << c.text;
    EXPECT_THAT(error, HasSubstr(c.error)) << c.text;
    EXPECT_THAT(error, HasSubstr("user:password")) << c.text;
  }
  std::string missing = dir.File("missing");
  EXPECT_THAT(AuthFileErrorOf(missing), HasSubstr(missing));
  EXPECT_THAT(AuthFileErrorOf(missing), HasSubstr("No such file"));
  EXPECT_THAT(AuthFileErrorOf(WriteFile(dir, "big", std::string(5000, 'a'), 0600)),
              HasSubstr("longer than"));
  EXPECT_THAT(AuthFileErrorOf(dir.path()), HasSubstr("not a regular file"));
}

TEST(BasicAuthTest, ConstantTimeEqualsComparesWholeStrings) {
  struct Case {
    const char* a;
    const char* b;
    bool equal;
  } cases[] = {
      {"", "", true},           {"s3cret", "s3cret", true}, {"s3cret", "s3creT", false},
      {"s3cret", "s3cre", false}, {"s3cre", "s3cret", false}, {"", "x", false},
      {"x", "", false},
  };
  for (const auto& c : cases) EXPECT_EQ(ConstantTimeEquals(c.a, c.b), c.equal) << c.a << "/" << c.b;
  // A shorter string padded with NULs is still a different string.
  EXPECT_FALSE(ConstantTimeEquals(std::string("ab\0", 3), "ab"));
}

TEST(BasicAuthTest, MatchesNeedsBothUserAndPassword) {
  BasicAuth auth{"prom", "s3cret"};
  EXPECT_TRUE(auth.Matches("prom", "s3cret"));
  EXPECT_FALSE(auth.Matches("prom", "wrong"));
  EXPECT_FALSE(auth.Matches("other", "s3cret"));
  EXPECT_FALSE(auth.Matches("", ""));
}

}  // namespace
}  // namespace fleet
