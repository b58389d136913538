// Transparent huge pages for the broker's malloc.
//
// Every batch costs the broker fresh heap memory (its payload, its retained
// result), and on a VM a page fault is a trip to the hypervisor: measured
// on the benchmark machine, the broker spent 25-30% less CPU per 100 B batch
// and about half as much per 10 KiB batch once malloc's heap was backed by
// 2 MiB pages. glibc (2.35 and later) does that when started with
// GLIBC_TUNABLES=glibc.malloc.hugetlb=1, which it reads only at start, so
// the broker re-executes itself once with it set.
//
// Not for workers or producers: their CPU per batch did not change
// measurably, and a worker's start (two execs, huge pages zeroed for each
// thread's arena) took the first result from zero workers from about 85 to
// 155 ms in the scaling benchmark.
//
// Left alone when: FLEET_MALLOC_HUGEPAGES=0; GLIBC_TUNABLES already names
// glibc.malloc.hugetlb (the user's choice); the kernel's THP mode is
// "never" (nothing to gain) or "always" (already in effect); not glibc or
// an older one; a sanitizer build (its own malloc). After the re-exec,
// GLIBC_TUNABLES is put back as it was, so that anything the process
// starts does not inherit the choice.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace fleet {

// The GLIBC_TUNABLES value to re-execute with, or nullopt to run as is.
// `tunables`: the current GLIBC_TUNABLES (null: unset); `thp_mode`: the
// contents of /sys/kernel/mm/transparent_hugepage/enabled ("" if
// unreadable); `opt_out`: FLEET_MALLOC_HUGEPAGES (null: unset).
std::optional<std::string> HugePageTunables(const char* tunables, std::string_view thp_mode,
                                            const char* opt_out);

// The kernel's THP mode line (/sys/kernel/mm/transparent_hugepage/enabled,
// e.g. "always [madvise] never"), or "" when it cannot be read.
std::string ThpMode();

// True in a sanitizer build (its own malloc; nothing is done there).
bool SanitizerBuild();
// True for glibc 2.35 and later, which know the tunable (older ones ignore
// it: nothing is done there).
bool GlibcHasTunable();

// Call first thing in main(), before any thread, socket or signal handler
// exists. Returns at once when nothing is to be done (or when it was done:
// the re-executed run); otherwise re-executes this program with the same
// arguments and does not return, unless exec fails (then the program runs
// on without huge pages).
void UseHugePageMalloc(char** argv);

}  // namespace fleet
