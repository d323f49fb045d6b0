// Autotune choices kept across processes (SPEC §0 "cache the winner in-process and optionally on
// disk"). With RUDNN_AUTOTUNE_CACHE=<file> set, every winner an autotune search finds is appended
// to that file as one "key<TAB>choice" line, and the lines already there answer later searches,
// in this process and in others: a shape class is then timed once per machine, not once per
// process. The caller's key names everything the choice depends on (library build, device,
// candidates, shape class). Later lines win over earlier ones for the same key; lines that are
// not "key<TAB>choice" are skipped. Unset, nothing is read or written.
#pragma once

#include <string>

namespace rudnn::core {

// The choice recorded for `key`, or "" when there is none or RUDNN_AUTOTUNE_CACHE is unset.
// The file is read when the variable's value is first seen (and again if it changes).
std::string tune_cache_lookup(const std::string& key);

// Records `choice` for `key` (in memory and, appended, in the file). A file that cannot be
// written costs the cross-process cache, not the call: one warning on stderr per file.
// key and choice must not contain tabs or newlines.
void tune_cache_store(const std::string& key, const std::string& choice);

// "<version> <commit>" of this build (the commit the source tree was at when CMake configured
// it, "unknown" outside git): the first field of every key, so a rebuilt library times anew.
const char* build_id();

}  // namespace rudnn::core
