#!/usr/bin/env bash
# Plays an agent host end to end on a throwaway git repository: mount it,
# run three tool calls with `stagefs run --scope` (an edit with sed -i, a
# build with cc, a careless rm -rf), look at status and diff, undo the
# third tool call alone, commit the rest, and check with git that the
# workspace got exactly the edit and the build output. Exits non-zero with
# a message if it did not. It is the README's worked example, and CI runs
# it (TestAgentHostDemo).
#
# The stagefs binary is $STAGEFS; without it, one is built from this
# repository into the temp dir. Needs /dev/fuse, root (or unprivileged user
# namespaces and fusermount3), git, cc and sh.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/stagefs-demo.XXXXXX")
ws=$tmp/project # the agent's workspace, a git repository
mnt=$tmp/staged # where stagefs mounts the staged view
state=$tmp/state

cleanup() {
	if grep -qs " $mnt fuse" /proc/mounts; then
		"$STAGEFS" unmount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null || fusermount3 -u -z "$mnt" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

fail() {
	echo "agent-host-demo: FAILED: $*" >&2
	exit 1
}

step() { printf '\n== %s\n' "$*"; }

if [ -z "${STAGEFS:-}" ]; then
	export PATH=$PATH:/usr/local/go/bin
	(cd "$repo" && go build -o "$tmp/stagefs" ./cmd/stagefs)
	STAGEFS=$tmp/stagefs
fi

# Git must not depend on the caller's configuration.
export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 LC_ALL=C
export GIT_AUTHOR_NAME=demo GIT_AUTHOR_EMAIL=demo@example.com
export GIT_COMMITTER_NAME=demo GIT_COMMITTER_EMAIL=demo@example.com
unset STAGEFS_SOCKET
command -v cc >/dev/null || fail "no C compiler (cc) for the build step; scripts/setup installs gcc"

step "a small git repository"
mkdir -p "$ws/src" "$mnt"
printf '#define GREETING "hello"\n' >"$ws/src/greeting.h"
cat >"$ws/src/main.c" <<'C'
#include <stdio.h>
#include "greeting.h"

int main(void) { puts(GREETING ", world"); return 0; }
C
printf '# demo\n' >"$ws/README.md"
git -C "$ws" init -q
git -C "$ws" add -A
git -C "$ws" commit -q -m initial
git -C "$ws" log --oneline

step "mount the staged view"
"$STAGEFS" mount "$ws" "$mnt" --state "$state"

# Every tool call runs in the workspace's own path, staged.
cd "$ws"

step "tc1: an edit (sed -i)"
"$STAGEFS" run -m "$mnt" --scope tc1 -- sed -i 's/hello/hello, staged/' src/greeting.h

step "tc2: a build that writes output (cc), then runs it"
"$STAGEFS" run -m "$mnt" --scope tc2 -- sh -c 'mkdir -p out && cc -o out/hello src/main.c && out/hello'

step "tc3: a careless rm -rf src"
"$STAGEFS" run -m "$mnt" --scope tc3 -- rm -rf src

[ -f "$ws/src/main.c" ] || fail "the real workspace lost src/main.c before any commit"
[ ! -e "$ws/out" ] || fail "the build wrote into the real workspace before any commit"
[ "$(cat "$ws/src/greeting.h")" = '#define GREETING "hello"' ] || fail "the real workspace changed before any commit"

step "stagefs status"
"$STAGEFS" status -m "$mnt"

step "stagefs diff"
"$STAGEFS" diff -m "$mnt" --color never

step "stagefs restore tc3 (undo the rm -rf alone)"
"$STAGEFS" restore -m "$mnt" tc3
"$STAGEFS" status -m "$mnt"

step "stagefs commit"
"$STAGEFS" commit -m "$mnt"

step "git status --short in the real workspace"
status=$(git -C "$ws" status --short)
echo "$status"

cd /
"$STAGEFS" unmount "$mnt" >/dev/null

# The check: exactly the sed edit and the build output, src intact.
want=$(printf ' M src/greeting.h\n?? out/')
[ "$status" = "$want" ] || fail "git status --short is
$status
want
$want"
[ "$(cat "$ws/src/greeting.h")" = '#define GREETING "hello, staged"' ] ||
	fail "src/greeting.h = $(cat "$ws/src/greeting.h")"
# The committed program is the one built from the staged edit.
hello=$("$ws/out/hello") || fail "the committed out/hello does not run"
[ "$hello" = "hello, staged, world" ] || fail "out/hello prints $hello"
git -C "$ws" diff --quiet -- README.md src/main.c || fail "unrelated files changed"

printf '\nagent-host-demo: OK\n'
