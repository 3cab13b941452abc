// Package fdio reads, writes and copies files by raw descriptor, for the
// packages that hold descriptors they do not own as *os.File: the overlay
// engine (upper and workspace files, opened beneath a directory
// descriptor) and the snapshot store (pre-images it captures).
package fdio
