// Package unidiff produces git-style unified diffs for the staged-changes
// view of a stagefs workspace.
//
// The output of Write is meant to be fed to "git apply" (or read by people
// who are used to "git diff"), so the format follows git closely:
//
//   - every file starts with a "diff --git a/P b/P" line;
//   - extended header lines ("new file mode", "deleted file mode",
//     "old mode"/"new mode", "rename from"/"rename to") describe
//     creations, deletions, permission changes and renames;
//   - text changes are written as "---"/"+++" lines followed by "@@" hunks
//     with three lines of context, and a line without a terminating newline
//     is followed by "\ No newline at end of file";
//   - content with a NUL byte in its first 8000 bytes is binary, and so is
//     content that is not valid UTF-8 anywhere (Latin-1 text, random
//     bytes), which git would show as text: the diff is carried in JSON
//     strings, where invalid bytes become U+FFFD, so showing such content
//     as text would make "git apply" write different bytes. A binary change
//     is written as "git diff --binary" writes it: a full "index OLD..NEW"
//     line (git apply checks the old object id and refuses binary patches
//     without one), "GIT binary patch", and forward and reverse "literal"
//     hunks of zlib-deflated content in git's base85. A side larger than
//     MaxBinaryPatch gets only a "Binary files ... differ" notice. Write's
//     output is therefore always valid UTF-8 and never lossy;
//   - symbolic links (mode 0120000) are diffed as their target text, which
//     has no trailing newline;
//   - paths are quoted the way git quotes them with core.quotePath enabled.
//
// Two things git writes are left out of text changes: "index" lines (git
// apply does not need them there) and "similarity index" lines.
//
// The line diff itself is Myers' O(ND) algorithm in its linear-space,
// divide-and-conquer form, run after common prefixes and suffixes and
// lines found in only one input have been set aside (none of these
// changes the shortest edit script). To bound the running time on large,
// very different inputs, each search for a middle snake gives up after a
// cost limit (the square root of the number of lines, at least 256 steps)
// and splits at the furthest point reached instead. The result is then
// possibly longer than the shortest edit script, but it is always a
// correct one: applying it to the old text reproduces the new text.
package unidiff
