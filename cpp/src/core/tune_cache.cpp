#include "core/tune_cache.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#ifndef RUDNN_VERSION
#define RUDNN_VERSION "unknown"
#endif
#ifndef RUDNN_COMMIT
#define RUDNN_COMMIT "unknown"
#endif

namespace rudnn::core {

namespace {

std::mutex cache_mutex;
std::string loaded_path;                     // the file `entries` was read from
std::map<std::string, std::string> entries;  // key -> choice
std::set<std::string> warned;                // files already reported as unwritable

std::string cache_path() {
  const char* path = std::getenv("RUDNN_AUTOTUNE_CACHE");
  return path != nullptr ? path : "";
}

// Reads `path` into `entries` unless it is the file already read (caller holds cache_mutex).
void load(const std::string& path) {
  if (path == loaded_path) return;
  entries.clear();
  loaded_path = path;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const std::size_t tab = line.find('\t');
    if (tab == std::string::npos || tab == 0 || tab + 1 == line.size() || line.find('\t', tab + 1) != std::string::npos)
      continue;  // not "key<TAB>choice": a torn or foreign line
    entries[line.substr(0, tab)] = line.substr(tab + 1);
  }
}

}  // namespace

std::string tune_cache_lookup(const std::string& key) {
  const std::string path = cache_path();
  if (path.empty()) return {};
  std::lock_guard<std::mutex> lock(cache_mutex);
  load(path);
  const auto it = entries.find(key);
  return it != entries.end() ? it->second : std::string();
}

void tune_cache_store(const std::string& key, const std::string& choice) {
  const std::string path = cache_path();
  if (path.empty()) return;
  std::lock_guard<std::mutex> lock(cache_mutex);
  load(path);
  entries[key] = choice;
  // One fwrite of the whole line to a file opened for appending: processes sharing the file
  // add whole lines (O_APPEND). After a line a writer left unfinished (it died), a newline
  // first, so that the torn line and not this one is what readers skip.
  std::FILE* f = std::fopen(path.c_str(), "a+");
  bool at_line_start = true;
  if (f != nullptr && std::fseek(f, -1, SEEK_END) == 0) at_line_start = std::fgetc(f) == '\n';
  const std::string line = (at_line_start ? "" : "\n") + key + "\t" + choice + "\n";
  const bool written = f != nullptr && std::fseek(f, 0, SEEK_END) == 0 &&
                       std::fwrite(line.data(), 1, line.size(), f) == line.size();
  const bool closed = f != nullptr && std::fclose(f) == 0;
  if (!(written && closed) && warned.insert(path).second)
    std::fprintf(stderr, "rudnn: RUDNN_AUTOTUNE_CACHE=%s cannot be written; autotune choices stay in this process\n",
                 path.c_str());
}

const char* build_id() { return RUDNN_VERSION " " RUDNN_COMMIT; }

}  // namespace rudnn::core
