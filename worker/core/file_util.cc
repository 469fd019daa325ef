#include "worker/core/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace pstar {

namespace {
Status Errno(const std::string& what, const std::string& path) {
  return Status::Internal(what + " " + path + ": " + std::strerror(errno));
}
}  // namespace

Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  PSTAR_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Open(path));
  PSTAR_RETURN_IF_ERROR(file.Append(contents));
  return file.Commit();
}

Result<AtomicFileWriter> AtomicFileWriter::Open(const std::string& path) {
  std::filesystem::path target(path);
  std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(path + ": exists and is not a regular file; pstar replaces only regular files");
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return Status::NotFound(path + ": the directory " + dir.string() + " does not exist");
  }
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EACCES || errno == EROFS || errno == EPERM) {
      return Status::FailedPrecondition("cannot create " + tmp + ": " + std::strerror(errno));
    }
    return Errno("cannot create", tmp);
  }
  return AtomicFileWriter(path, tmp, fd);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)), tmp_(std::move(other.tmp_)), fd_(other.fd_), buffer_(std::move(other.buffer_)) {
  other.fd_ = -1;
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

Status AtomicFileWriter::Append(std::string_view bytes) {
  constexpr size_t kBlock = size_t(1) << 20;
  if (fd_ < 0) return Status::Internal("append to a closed file " + tmp_);
  if (buffer_.size() + bytes.size() <= kBlock) {
    buffer_.append(bytes);
    return Status::Ok();
  }
  PSTAR_RETURN_IF_ERROR(Flush());
  if (bytes.size() <= kBlock) {
    buffer_.append(bytes);
    return Status::Ok();
  }
  return WriteAll(bytes.data(), bytes.size());
}

Status AtomicFileWriter::WriteAll(const char* p, size_t left) {
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot write", tmp_);
    }
    p += n;
    left -= size_t(n);
  }
  return Status::Ok();
}

Status AtomicFileWriter::Flush() {
  PSTAR_RETURN_IF_ERROR(WriteAll(buffer_.data(), buffer_.size()));
  buffer_.clear();
  return Status::Ok();
}

Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return Status::Internal("commit of a closed file " + tmp_);
  PSTAR_RETURN_IF_ERROR(Flush());
  const int fd = fd_;
  fd_ = -1;
  if (::fsync(fd) != 0) {
    Status s = Errno("cannot flush", tmp_);
    ::close(fd);
    ::unlink(tmp_.c_str());
    return s;
  }
  if (::close(fd) != 0) {
    Status s = Errno("cannot flush", tmp_);
    ::unlink(tmp_.c_str());
    return s;
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    Status s = Errno("cannot rename onto", path_);
    ::unlink(tmp_.c_str());
    return s;
  }
  std::filesystem::path target(path_);
  return SyncDirectory(target.has_parent_path() ? target.parent_path().string() : ".");
}

Status SyncDirectory(const std::string& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Errno("cannot open directory", dir);
  // Some filesystems refuse fsync on a directory (EINVAL); the data is still there.
  if (::fsync(dfd) != 0 && errno != EINVAL) {
    Status s = Errno("cannot sync directory", dir);
    ::close(dfd);
    return s;
  }
  ::close(dfd);
  return Status::Ok();
}

Status CheckRegularFile(const std::string& path) {
  // O_NONBLOCK: opening a FIFO without a writer returns at once.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  ::close(fd);
  if (!regular) {
    return Status::InvalidArgument(path + ": not a regular file (a directory, FIFO, device or socket cannot be read as data)");
  }
  return Status::Ok();
}

Status CheckWritableDirectory(const std::string& dir, const std::string& tag) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::FailedPrecondition(dir + ": cannot create the directory: " + ec.message());
  if (!std::filesystem::is_directory(dir, ec)) return Status::FailedPrecondition(dir + ": is not a directory");
  const std::string probe = (std::filesystem::path(dir) / (".pstar-write-test-" + tag)).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FailedPrecondition(dir + ": cannot write there: " + std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::Ok();
}

Result<RandomAccessFile> RandomAccessFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path + ": not a regular file (a directory, FIFO, device or socket cannot be read as data)");
  }
  return RandomAccessFile(path, fd, int64_t(st.st_size));
}

RandomAccessFile::RandomAccessFile(RandomAccessFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(other.fd_), size_(other.size_) {
  other.fd_ = -1;
}

RandomAccessFile& RandomAccessFile::operator=(RandomAccessFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    size_ = other.size_;
    other.fd_ = -1;
  }
  return *this;
}

RandomAccessFile::~RandomAccessFile() {
  if (fd_ >= 0) ::close(fd_);
}

Status RandomAccessFile::ReadAt(int64_t offset, int64_t n, char* dst) const {
  while (n > 0) {
    const ssize_t got = ::pread(fd_, dst, size_t(n), off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return Status::DataLoss(path_ + ": read error: " + std::strerror(errno));
    if (got == 0) return Status::DataLoss(path_ + ": ends before byte " + std::to_string(offset + n) + " (truncated?)");
    dst += got;
    offset += got;
    n -= got;
  }
  return Status::Ok();
}

Result<std::string> RandomAccessFile::ReadAll(int64_t max_bytes) const {
  if (size_ > max_bytes) {
    return Status::InvalidArgument(path_ + ": is " + std::to_string(size_) + " bytes, more than the " +
                                   std::to_string(max_bytes) + " such a file may be");
  }
  std::string text(size_t(size_), '\0');
  PSTAR_RETURN_IF_ERROR(ReadAt(0, size_, text.data()));
  return text;
}

Result<std::string> ReadRegularFile(const std::string& path) {
  PSTAR_RETURN_IF_ERROR(CheckRegularFile(path));
  return ReadFile(path);
}

Result<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::NotFound(path + ": no such file");
  if (std::filesystem::is_directory(path, ec)) return Status::InvalidArgument(path + ": is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::DataLoss(path + ": read error");
  return ss.str();
}

}  // namespace pstar
