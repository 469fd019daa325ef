#include "worker/data/token_source.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "worker/core/file_util.h"
#include "worker/data/token_shard.h"

namespace pstar {

void VectorTokenSource::Read(int64_t pos, int64_t n, int32_t* out) const {
  std::copy_n(tokens_.begin() + pos, n, out);
}

namespace {

// One read-only mapped shard file.
class MappedShard {
 public:
  static Result<std::unique_ptr<MappedShard>> Open(const std::string& path, int64_t vocab_size) {
    PSTAR_RETURN_IF_ERROR(CheckRegularFile(path));  // a FIFO would block the open, a device the map
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return Status::NotFound(path + ": no such file");
      return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      return Status::NotFound(path + ": cannot stat: " + std::strerror(errno));
    }
    auto shard = std::unique_ptr<MappedShard>(new MappedShard());
    shard->bytes_ = st.st_size;
    if (st.st_size > 0) {
      void* p = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        ::close(fd);
        return Status::Internal(path + ": mmap failed: " + std::strerror(errno));
      }
      shard->data_ = static_cast<const unsigned char*>(p);
    }
    ::close(fd);
    PSTAR_ASSIGN_OR_RETURN(shard->header_, ParseTokenShardHeader(shard->data_, shard->bytes_, path));
    if (shard->header_.vocab_size != 0 && int64_t(shard->header_.vocab_size) > vocab_size) {
      return Status::InvalidArgument(path + ": vocabulary mismatch: shard was made for " +
                                     std::to_string(shard->header_.vocab_size) +
                                     " tokens but model.vocab_size is " + std::to_string(vocab_size));
    }
    // Every token is checked once, so a bad id can never index past an embedding.
    const int64_t n = int64_t(shard->header_.num_tokens);
    for (int64_t i = 0; i < n; ++i) {
      int64_t t = shard->At(i);
      if (t >= vocab_size) {
        return Status::InvalidArgument(path + ": vocabulary mismatch: token " + std::to_string(t) +
                                       " at position " + std::to_string(i) +
                                       " is not below model.vocab_size " + std::to_string(vocab_size));
      }
    }
    return shard;
  }

  ~MappedShard() {
    if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_t(bytes_));
  }

  int64_t size() const { return int64_t(header_.num_tokens); }
  int64_t At(int64_t i) const {
    const unsigned char* p = data_ + header_.header_bytes + i * header_.token_bytes;
    if (header_.token_bytes == 2) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }

 private:
  MappedShard() = default;
  const unsigned char* data_ = nullptr;
  int64_t bytes_ = 0;
  TokenShardHeader header_;
};

// Several shards read as one sequence.
class ShardTokenSource final : public TokenSource {
 public:
  explicit ShardTokenSource(std::vector<std::unique_ptr<MappedShard>> shards)
      : shards_(std::move(shards)) {
    int64_t start = 0;
    for (const auto& s : shards_) {
      starts_.push_back(start);
      start += s->size();
    }
    size_ = start;
  }
  int64_t size() const override { return size_; }
  void Read(int64_t pos, int64_t n, int32_t* out) const override {
    size_t s = size_t(std::upper_bound(starts_.begin(), starts_.end(), pos) - starts_.begin() - 1);
    for (int64_t i = 0; i < n; ++i) {
      while (pos + i - starts_[s] >= shards_[s]->size()) ++s;
      out[i] = int32_t(shards_[s]->At(pos + i - starts_[s]));
    }
  }

 private:
  std::vector<std::unique_ptr<MappedShard>> shards_;
  std::vector<int64_t> starts_;
  int64_t size_ = 0;
};

}  // namespace

Result<std::vector<std::string>> ListTokenShards(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> files;
  // A glob, unless a file or directory has that very name.
  if (path.find_first_of("*?[") != std::string::npos && !fs::exists(path, ec)) {
    glob_t g{};
    const int rc = ::glob(path.c_str(), GLOB_ERR, nullptr, &g);
    if (rc == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        if (!fs::is_directory(g.gl_pathv[i], ec)) files.push_back(g.gl_pathv[i]);
      }
    }
    ::globfree(&g);
    if (rc != 0 && rc != GLOB_NOMATCH) return Status::NotFound(path + ": cannot expand the pattern");
    if (files.empty()) return Status::NotFound(path + ": the pattern matches no files");
    std::sort(files.begin(), files.end());
    return files;
  }
  if (!fs::is_directory(path, ec)) return std::vector<std::string>{path};
  bool train = false, val = false;
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".bin") {
      const std::string name = entry.path().filename().string();
      train |= name.find("_train_") != std::string::npos;
      val |= name.find("_val_") != std::string::npos;
      files.push_back(entry.path().string());
    }
  }
  if (ec) return Status::NotFound(path + ": cannot list: " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.empty()) return Status::NotFound(path + ": directory holds no *.bin token shards");
  // llm.c's scripts write both kinds into one folder: reading it whole would
  // train on the validation data.
  if (train && val) {
    return Status::InvalidArgument(path + ": holds both training (*_train_*) and validation (*_val_*) shards; "
                                   "name one kind with a glob, e.g. " + (fs::path(path) / "*_train_*.bin").string());
  }
  return files;
}

Result<std::unique_ptr<TokenSource>> OpenTokenShards(const std::string& path, int64_t vocab_size) {
  PSTAR_ASSIGN_OR_RETURN(std::vector<std::string> files, ListTokenShards(path));
  std::vector<std::unique_ptr<MappedShard>> shards;
  for (const auto& f : files) {
    PSTAR_ASSIGN_OR_RETURN(auto shard, MappedShard::Open(f, vocab_size));
    shards.push_back(std::move(shard));
  }
  return std::unique_ptr<TokenSource>(new ShardTokenSource(std::move(shards)));
}

std::vector<int32_t> ByteTokenize(std::string_view text) {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteDetokenize(std::span<const int32_t> ids) {
  std::string text(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) text[i] = char(uint8_t(ids[i]));
  return text;
}

Result<std::unique_ptr<TokenSource>> OpenByteText(const std::string& path, int64_t vocab_size) {
  if (vocab_size < 256) {
    return Status::InvalidArgument("vocabulary mismatch: byte-level text needs model.vocab_size >= 256, got " +
                                   std::to_string(vocab_size));
  }
  PSTAR_ASSIGN_OR_RETURN(std::string text, ReadRegularFile(path));
  return std::unique_ptr<TokenSource>(new VectorTokenSource(ByteTokenize(text)));
}

}  // namespace pstar
