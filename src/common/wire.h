// A little-endian binary encoding for messages between processes of one
// build (coordinator and workers): PODs, strings and vectors of PODs.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace failsafe {

class WireWriter {
 public:
  template <typename T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const auto* p = reinterpret_cast<const char*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    Put<uint64_t>(v.size());
    const auto* p = reinterpret_cast<const char*>(v.data());
    buf_.insert(buf_.end(), p, p + v.size() * sizeof(T));
  }
  const std::string& data() const { return buf_; }
  std::string Take() { return std::move(buf_); }

 private:
  std::string buf_;
};

// Reads what a WireWriter wrote. Reading past the end sets ok() to false and
// yields zeros; check ok() once after reading a message.
class WireReader {
 public:
  explicit WireReader(const std::string& data) : data_(data) {}
  template <typename T>
  T Get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v{};
    if (pos_ + sizeof(T) > data_.size()) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string GetString() {
    uint64_t n = Get<uint64_t>();
    if (!ok_ || n > data_.size() - pos_) {
      ok_ = false;
      return {};
    }
    std::string s = data_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  template <typename T>
  std::vector<T> GetVector() {
    uint64_t n = Get<uint64_t>();
    if (!ok_ || n > (data_.size() - pos_) / sizeof(T)) {
      ok_ = false;
      return {};
    }
    std::vector<T> v(n);
    std::memcpy(v.data(), data_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  bool ok() const { return ok_; }
  bool done() const { return pos_ == data_.size(); }

 private:
  const std::string& data_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace failsafe
