#include "operator/kube/kube_time.h"

#include <cstdio>
#include <ctime>

namespace pstar::op {
namespace {

std::string Format(WallTime t, bool micros) {
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  int64_t secs = us / 1000000, frac = us % 1000000;
  if (frac < 0) {
    frac += 1000000;
    --secs;
  }
  time_t tt = static_cast<time_t>(secs);
  struct tm tm {};
  gmtime_r(&tt, &tm);
  char buf[64];
  size_t n = strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  std::string out(buf, n);
  if (micros) {
    char fbuf[16];
    std::snprintf(fbuf, sizeof(fbuf), ".%06lld", static_cast<long long>(frac));
    out += fbuf;
  }
  return out + "Z";
}

}  // namespace

std::string FormatTime(WallTime t) { return Format(t, false); }
std::string FormatMicroTime(WallTime t) { return Format(t, true); }

Result<WallTime> ParseTime(const std::string& text) {
  const Status bad = Status::InvalidArgument("time \"" + text + "\": not RFC 3339");
  int year, mon, day, hour, min, sec;
  int consumed = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &year, &mon, &day, &hour, &min, &sec, &consumed) != 6 ||
      consumed != 19)
    return bad;
  size_t i = 19;
  int64_t micros = 0;
  if (i < text.size() && text[i] == '.') {
    ++i;
    int digits = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (digits < 6) micros = micros * 10 + (text[i] - '0');
      ++digits;
      ++i;
    }
    if (digits == 0) return bad;
    for (int d = digits; d < 6; ++d) micros *= 10;
  }
  int offset_s = 0;
  if (i < text.size() && (text[i] == 'Z' || text[i] == 'z')) {
    ++i;
  } else if (i + 6 == text.size() && (text[i] == '+' || text[i] == '-') && text[i + 3] == ':') {
    int oh = std::atoi(text.substr(i + 1, 2).c_str()), om = std::atoi(text.substr(i + 4, 2).c_str());
    offset_s = (oh * 3600 + om * 60) * (text[i] == '-' ? -1 : 1);
    i += 6;
  } else {
    return bad;
  }
  if (i != text.size()) return bad;
  struct tm tm {};
  tm.tm_year = year - 1900;
  tm.tm_mon = mon - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = min;
  tm.tm_sec = sec;
  time_t secs = timegm(&tm);
  return WallTime(std::chrono::seconds(secs - offset_s)) + std::chrono::microseconds(micros);
}

}  // namespace pstar::op
