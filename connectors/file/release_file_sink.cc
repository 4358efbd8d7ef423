#include "connectors/file/release_file_sink.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "connectors/file/file_util.h"

namespace vipsd::connectors {
namespace {

namespace fs = std::filesystem;

bool IsTemporaryName(const std::string& name) {
  return name.size() > 5 && name.front() == '.' && name.ends_with(".tmp");
}

// Atomically makes `from` visible as `to`, refusing to replace anything.
// Returns 0 or an errno value.
int RenameNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  // The filesystem cannot do RENAME_NOREPLACE. rename(2) still refuses a
  // non-empty target directory (ENOTEMPTY/EEXIST), and Write checked that
  // the target did not exist just before; an empty directory is not a release.
  return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
}

}  // namespace

StatusOr<ReleaseFileSink> ReleaseFileSink::Open(std::string directory) {
  if (directory.empty()) return InvalidArgumentError("release directory is empty");
  std::error_code error;
  // A missing directory is created by the first Write, so that a run
  // refused at start-up leaves nothing behind.
  const fs::file_status status = fs::status(directory, error);
  if (!fs::exists(status)) return ReleaseFileSink(std::move(directory));
  if (!fs::is_directory(status)) {
    return UnavailableError("cannot use release directory " + directory +
                            ": it exists and is not a directory");
  }
  for (fs::directory_iterator it(directory, error), end; !error && it != end;
       it.increment(error)) {
    const std::string name = it->path().filename().string();
    std::error_code ignored;
    if (IsTemporaryName(name) && it->is_directory(ignored)) fs::remove_all(it->path(), ignored);
  }
  if (error) {
    return UnavailableError("cannot list release directory " + directory + ": " +
                            error.message());
  }
  return ReleaseFileSink(std::move(directory));
}

Status ReleaseFileSink::Write(const release::Release& release) {
  VIPSD_ASSIGN_OR_RETURN(release::EncodedRelease encoded, release::EncodeRelease(release));
  const std::string& id = encoded.release_id;
  std::error_code created;
  fs::create_directories(directory_, created);
  if (created) {
    return UnavailableError("cannot create release directory " + directory_ + ": " +
                            created.message());
  }
  const std::string final_dir = directory_ + "/" + id;
  const std::string temp_dir = directory_ + "/." + id + ".tmp";
  auto already_exists = [&] {
    return FailedPreconditionError("release " + id + " already exists in " + directory_ +
                                   "; releases are never overwritten");
  };
  struct stat info;
  if (::lstat(final_dir.c_str(), &info) == 0) return already_exists();
  if (errno != ENOENT) {
    return UnavailableError("cannot stat " + final_dir + ": " + std::strerror(errno));
  }

  std::error_code error;
  fs::remove_all(temp_dir, error);  // a leftover from a crash
  if (error || ::mkdir(temp_dir.c_str(), 0755) != 0) {
    return UnavailableError("cannot create " + temp_dir + ": " +
                            (error ? error.message() : std::strerror(errno)));
  }
  auto fail = [&temp_dir](Status status) {
    std::error_code ignored;
    fs::remove_all(temp_dir, ignored);
    return status;
  };
  // Arrays first, manifest last (EncodeRelease's order).
  for (const release::ReleaseFile& file : encoded.files) {
    Status written = WriteFileDurably(temp_dir + "/" + file.name, file.bytes, /*exclusive=*/true,
                                      /*mode=*/0644);
    if (!written.ok()) return fail(std::move(written));
  }
  if (Status synced = SyncDirectory(temp_dir); !synced.ok()) return fail(std::move(synced));
  if (const int rename_errno = RenameNoReplace(temp_dir, final_dir); rename_errno != 0) {
    if (rename_errno == EEXIST || rename_errno == ENOTEMPTY) return fail(already_exists());
    return fail(UnavailableError("cannot rename " + temp_dir + " to " + final_dir + ": " +
                                 std::strerror(rename_errno)));
  }
  if (Status synced = SyncDirectory(directory_); !synced.ok()) {
    return UnavailableError("release " + id + " is visible but may not survive a crash: " +
                            synced.message());
  }
  return Status::Ok();
}

}  // namespace vipsd::connectors
