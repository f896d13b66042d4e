#include "npz.h"

#include <zip.h>

#include <memory>

#include "polytile/error.h"
#include "polytile/npy.h"

namespace polytile {

namespace {

struct ArchiveCloser {
  void operator()(zip_t* z) const { zip_discard(z); }  // read only: nothing to write back
};
struct MemberCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

std::string zip_message(int code) {
  zip_error_t error;
  zip_error_init_with_code(&error, code);
  std::string message = zip_error_strerror(&error);
  zip_error_fini(&error);
  return message;
}

}  // namespace

std::map<std::string, Buffer> read_npz(const std::string& path) {
  int code = 0;
  std::unique_ptr<zip_t, ArchiveCloser> archive(zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &code));
  if (!archive) user_error(path, ": cannot read the .npz archive: ", zip_message(code));
  std::map<std::string, Buffer> arrays;
  const zip_int64_t members = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < members; ++i) {
    zip_stat_t stat;
    zip_stat_init(&stat);
    if (zip_stat_index(archive.get(), static_cast<zip_uint64_t>(i), 0, &stat) != 0 || !(stat.valid & ZIP_STAT_NAME) ||
        !(stat.valid & ZIP_STAT_SIZE))
      user_error(path, ": member ", i, ": ", zip_strerror(archive.get()));
    const std::string member = stat.name;
    const std::string where = path + ":" + member;
    if (member.size() < 5 || member.compare(member.size() - 4, 4, ".npy") != 0)
      user_error(where, ": not a .npy member (an .npz archive holds NAME.npy files)");
    std::unique_ptr<zip_file_t, MemberCloser> file(zip_fopen_index(archive.get(), static_cast<zip_uint64_t>(i), 0));
    if (!file) user_error(where, ": ", zip_strerror(archive.get()));
    std::string bytes(static_cast<size_t>(stat.size), '\0');
    zip_int64_t got = bytes.empty() ? 0 : zip_fread(file.get(), bytes.data(), stat.size);
    // One more read reaches the end of the member, where libzip compares its CRC.
    char past_end = 0;
    zip_int64_t more = got < 0 ? 0 : zip_fread(file.get(), &past_end, 1);
    if (got < 0 || more < 0)
      user_error(where, ": damaged member (", zip_file_strerror(file.get()), ")");
    if (static_cast<zip_uint64_t>(got) != stat.size || more != 0)
      user_error(where, ": damaged member (its size differs from the recorded one)");
    const std::string name = member.substr(0, member.size() - 4);
    if (arrays.count(name)) user_error(where, ": the archive holds two arrays named ", name);
    arrays.emplace(name, parse_npy(bytes, where));
  }
  return arrays;
}

}  // namespace polytile
