package overlay

import (
	"errors"
	"io"
	"path"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"stagefs/internal/contenthash"
	"stagefs/internal/fdio"
)

// beneath resolves directories under a root fd: no symlink is followed and
// nothing outside the root can be reached, whatever the tree holds.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// layer is one directory tree (the workspace or the upper tree) reached
// through a directory fd held open for the engine's life.
type layer struct {
	fd   int
	dirs *dirCache // descriptors of the tree's directories; nil: walk each time
}

// openDir opens the directory at rel ("" is the root) for *at calls.
func (l layer) openDir(rel string) (int, error) {
	return l.openDirFlags(rel, unix.O_PATH)
}

// openDirRead opens the directory at rel for reading its entries.
func (l layer) openDirRead(rel string) (int, error) {
	return l.openDirFlags(rel, unix.O_RDONLY)
}

func (l layer) openDirFlags(rel string, flags int) (int, error) {
	if rel == "" {
		rel = "."
	}
	for {
		fd, err := unix.Openat2(l.fd, rel, &unix.OpenHow{
			Flags:   uint64(flags | unix.O_DIRECTORY | unix.O_CLOEXEC),
			Resolve: beneath,
		})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err == unix.ELOOP || err == unix.EXDEV {
			// A symlink where a directory was expected: to the caller
			// that path is simply not a directory.
			err = syscall.ENOTDIR
		}
		return fd, err
	}
}

// withDir calls fn with a descriptor (O_PATH) of the directory at rel.
func (l layer) withDir(rel string, fn func(dirfd int) error) error {
	if rel == "" {
		return fn(l.fd)
	}
	if l.dirs != nil {
		d, err := l.dirs.get(l, rel)
		if err != nil {
			return err
		}
		defer l.dirs.put(d)
		return fn(d.fd)
	}
	fd, err := l.openDir(rel)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn(fd)
}

// withParent calls fn with a descriptor of rel's parent directory and rel's
// last name. rel must not be the root.
func (l layer) withParent(rel string, fn func(dirfd int, name string) error) error {
	dir, name := splitPath(rel)
	return l.withDir(dir, func(fd int) error { return fn(fd, name) })
}

// lstat returns rel's attributes without following a final symlink.
func (l layer) lstat(rel string) (*syscall.Stat_t, error) {
	var st unix.Stat_t
	var err error
	if rel == "" {
		err = unix.Fstat(l.fd, &st)
	} else {
		err = l.withParent(rel, func(dirfd int, name string) error {
			return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		})
	}
	if err != nil {
		return nil, err
	}
	return toSyscallStat(&st), nil
}

// open opens rel (no final symlink followed) with flags.
func (l layer) open(rel string, flags int, mode uint32) (int, error) {
	if rel == "" {
		return unix.Openat(l.fd, ".", flags|unix.O_CLOEXEC, mode)
	}
	var fd int
	err := l.withParent(rel, func(dirfd int, name string) error {
		var err error
		fd, err = openatRetry(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
		return err
	})
	return fd, err
}

func openatRetry(dirfd int, name string, flags int, mode uint32) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, flags, mode)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

func toSyscallStat(st *unix.Stat_t) *syscall.Stat_t {
	return &syscall.Stat_t{
		Dev: st.Dev, Ino: st.Ino, Nlink: st.Nlink, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid,
		Rdev: st.Rdev, Size: st.Size, Blksize: st.Blksize, Blocks: st.Blocks,
		Atim: syscall.Timespec(st.Atim), Mtim: syscall.Timespec(st.Mtim), Ctim: syscall.Timespec(st.Ctim),
	}
}

// splitPath splits a clean relative path into its parent and last name.
func splitPath(rel string) (dir, name string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "", rel
	}
	return rel[:i], rel[i+1:]
}

func joinPath(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// isUnder reports whether p is dir or below it ("" is the root, above all).
func isUnder(p, dir string) bool {
	return dir == "" || p == dir || strings.HasPrefix(p, dir+"/")
}

// CleanPath turns a workspace-relative path as a client gives it into the
// engine's form: slash separated, no ".", "..", empty or NUL components, ""
// for the root. A path that would leave the workspace is an error.
func CleanPath(p string) (string, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return "", errors.New("path contains a NUL byte")
	}
	if strings.HasPrefix(p, "/") {
		return "", errors.New("path must be relative to the workspace")
	}
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", errors.New("path leaves the workspace (..)")
		}
	}
	c := path.Clean("/" + p)
	return strings.TrimPrefix(c, "/"), nil
}

// procPath names rel's last component through its parent's descriptor, for
// the calls that have no *at form (the xattr family). The parent was opened
// without following symlinks and the l* calls do not follow the last name.
func procPath(dirfd int, name string) string {
	return "/proc/self/fd/" + itoa(dirfd) + "/" + name
}

// fdPath names an open file through /proc, for calls that take only paths.
func fdPath(fd int) string { return "/proc/self/fd/" + itoa(fd) }

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return string(b[i:])
}

func (l layer) getxattr(rel, attr string, buf []byte) (int, error) {
	if rel == "" {
		return unix.Getxattr(fdPath(l.fd), attr, buf)
	}
	var n int
	err := l.withParent(rel, func(dirfd int, name string) error {
		var err error
		n, err = unix.Lgetxattr(procPath(dirfd, name), attr, buf)
		return err
	})
	return n, err
}

func (l layer) setxattr(rel, attr string, val []byte, flags int) error {
	if rel == "" {
		return unix.Setxattr(fdPath(l.fd), attr, val, flags)
	}
	return l.withParent(rel, func(dirfd int, name string) error {
		return unix.Lsetxattr(procPath(dirfd, name), attr, val, flags)
	})
}

func (l layer) removexattr(rel, attr string) error {
	if rel == "" {
		return unix.Removexattr(fdPath(l.fd), attr)
	}
	return l.withParent(rel, func(dirfd int, name string) error {
		return unix.Lremovexattr(procPath(dirfd, name), attr)
	})
}

func (l layer) listxattr(rel string, buf []byte) (int, error) {
	if rel == "" {
		return unix.Listxattr(fdPath(l.fd), buf)
	}
	var n int
	err := l.withParent(rel, func(dirfd int, name string) error {
		var err error
		n, err = unix.Llistxattr(procPath(dirfd, name), buf)
		return err
	})
	return n, err
}

// Dirent is one directory entry of the merged view.
type Dirent struct {
	Name string
	Mode uint32 // file type bits only
	Ino  uint64
}

// readDirents reads all entries of an open directory (no "." and "..").
func readDirents(fd int) ([]Dirent, error) {
	var out []Dirent
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return out, nil
		}
		b := buf[:n]
		for len(b) >= 19 {
			ino := le64(b[0:])
			reclen := int(b[16]) | int(b[17])<<8
			typ := b[18]
			if reclen < 19 || reclen > len(b) {
				return nil, syscall.EIO
			}
			nameb := b[19:reclen]
			if i := indexZero(nameb); i >= 0 {
				nameb = nameb[:i]
			}
			name := string(nameb)
			b = b[reclen:]
			if name == "." || name == ".." {
				continue
			}
			out = append(out, Dirent{Name: name, Ino: ino, Mode: dtToMode(typ)})
		}
	}
}

func le64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

func dtToMode(t uint8) uint32 {
	switch t {
	case unix.DT_REG:
		return syscall.S_IFREG
	case unix.DT_DIR:
		return syscall.S_IFDIR
	case unix.DT_LNK:
		return syscall.S_IFLNK
	case unix.DT_FIFO:
		return syscall.S_IFIFO
	case unix.DT_SOCK:
		return syscall.S_IFSOCK
	case unix.DT_CHR:
		return syscall.S_IFCHR
	case unix.DT_BLK:
		return syscall.S_IFBLK
	}
	return 0
}

// hashOf returns the hash of what fd reads; the zero Hash when it cannot
// be read.
func hashOf(fd int) contenthash.Hash {
	h, err := contenthash.Of(fdio.Reader(fd))
	if err != nil {
		return contenthash.Hash{}
	}
	return h
}

func copyBuffer(w io.Writer, r io.Reader) (int64, error) {
	return io.CopyBuffer(w, r, make([]byte, 256<<10))
}

func parentOf(p string) string {
	dir, _ := splitPath(p)
	return dir
}
