package sandbox

// The confined layout (Settings.Outside "ro"): everything outside the
// workspace read-only, with a few writable places put back on top.
//
// The writable places are made as detached mounts first, while the real
// tree is still in view (open_tree, fsmount): the workspace's staged view,
// the scratch dirs in the state dir, the real $HOME under the scratch
// layer, the --allow paths. Then every mount in the namespace is made
// read-only at once (mount_setattr AT_RECURSIVE), which cannot touch
// detached mounts, and they are attached in an order that puts the ones
// that must win on top: /tmp and /var/tmp first (the workspace, $HOME and
// the state dir may all be under /tmp, as in the tests), then $HOME, then
// the caller's exposed paths and the stagefs binary, then the --allow
// paths, then the staged view at the workspace and the mount point, and
// last (setupMounts) the tmpfs over the state dir. A place under /tmp is
// made in the private /tmp to attach on.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// confinement is what init needs to lay out a confined namespace.
type confinement struct {
	ws, mnt, state string
	allow          []string // writable for real
	expose         []string // the caller's, reachable at their paths (Spec.Expose)
	home           string   // $HOME as the command has it; "" for none
	tmpdir         string   // $TMPDIR as the command has it
	warn           func(format string, a ...any)
}

// held keeps the scratch layer's lock files open for as long as init
// runs: the kernel drops the locks when init exits. (An *os.File nobody
// refers to would be closed by its finalizer.)
var held []*os.File

// privateDirs are the places that get a directory of the mount's own.
var privateDirs = []struct{ at, dir string }{{"/tmp", scratchTmp}, {"/var/tmp", scratchVarTmp}}

// confine lays out the namespace; it runs in init's new mount namespace,
// with the caller's mounts private to it, before the capabilities drop.
// It returns the places it replaced with the mount's own (/tmp, /var/tmp).
func confine(c confinement) (private []string, err error) {
	scratch := ScratchDir(c.state)
	if err := os.MkdirAll(scratch, 0o700); err != nil {
		return nil, fmt.Errorf("make the scratch layer %s: %v", scratch, err)
	}
	// Shared by every run; `stagefs scratch --drop` takes it alone, and a
	// run waits for a drop to end rather than mount a half-deleted layer.
	lk, err := openLock(scratch, scratchLock)
	if err != nil {
		return nil, fmt.Errorf("open the scratch layer's lock: %v", err)
	}
	held = append(held, lk)
	if _, err := lock(lk, unix.F_RDLCK, true); err != nil {
		return nil, fmt.Errorf("lock the scratch layer: %v", err)
	}

	// Detached mounts, made while the real tree is in view.
	type pending struct {
		fd     int
		at     string
		isFile bool   // a file to attach on, not a directory
		why    string // for messages
		must   bool   // a failure to attach fails the run
	}
	var stack []pending
	defer func() {
		for _, p := range stack {
			if p.fd >= 0 {
				unix.Close(p.fd)
			}
		}
	}()

	for _, p := range privateDirs {
		if st, err := os.Lstat(p.at); err != nil || !st.IsDir() {
			// Missing, or a symlink (to /tmp, say): nothing to replace.
			continue
		}
		dir := filepath.Join(scratch, p.dir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("make the private %s: %v", p.at, err)
		}
		// As /tmp is: every user may make files, and remove only theirs.
		if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
			return nil, fmt.Errorf("make the private %s: %v", p.at, err)
		}
		fd, err := noDevClone(dir)
		if err != nil {
			return nil, fmt.Errorf("the private %s: %v", p.at, err)
		}
		stack = append(stack, pending{fd: fd, at: p.at, why: "the private " + p.at, must: true})
	}

	// $TMPDIR is often a directory under /tmp that the caller made; the
	// private /tmp gets one of the same name and mode.
	tmpdirMode := os.FileMode(0o700)
	if st, err := os.Stat(c.tmpdir); err == nil && st.IsDir() {
		tmpdirMode = st.Mode() & (os.ModePerm | os.ModeSticky)
	}

	if home, ok := c.usableHome(); ok {
		fd, err := homeLayer(c.state, home, c.warn)
		if err != nil {
			// Never the real $HOME writable without a word: it is shown
			// read-only where the layer would be (it may be under /tmp),
			// so the command still reads its settings.
			c.warn("$HOME (%s) is read-only in this sandbox: the scratch layer could not be put over it: %v", home, err)
			if fd, err = readOnlyClone(home); err != nil {
				return nil, fmt.Errorf("$HOME (%s): %v", home, err)
			}
		}
		stack = append(stack, pending{fd: fd, at: home, why: "the scratch layer over $HOME", must: true})
	}
	// The caller's own paths (the agent's settings layer) and this binary,
	// which the agents' hooks run: both may be in the host's /tmp.
	for _, p := range c.expose {
		fd, err := noDevClone(p)
		if err != nil {
			return nil, fmt.Errorf("%s, which the command needs: %v", p, err)
		}
		stack = append(stack, pending{fd: fd, at: p, why: p, must: true})
	}
	if exe, err := os.Executable(); err == nil {
		if fd, err := readOnlyClone(exe); err == nil {
			stack = append(stack, pending{fd: fd, at: exe, isFile: true, why: "the stagefs binary"})
		}
		// Else the binary stays where it is, unless that is under /tmp:
		// only the agents' hooks, which run it, would miss it.
	}
	for _, p := range c.allow {
		fd, err := clone(p)
		if err != nil {
			c.warn("--allow %s: %v; it stays read-only", p, err)
			continue
		}
		st, _ := os.Stat(p)
		stack = append(stack, pending{fd: fd, at: p, isFile: st != nil && !st.IsDir(), why: "--allow " + p})
	}
	// The staged view: at the workspace, and at the mount point too, as
	// it shows outside.
	for _, at := range []string{c.ws, c.mnt} {
		fd, err := clone(c.mnt)
		if err != nil {
			return nil, fmt.Errorf("the staged view %s: %v%s", c.mnt, err, userNSHint(err))
		}
		stack = append(stack, pending{fd: fd, at: at, why: "the staged view", must: true})
	}

	// Everything in view becomes read-only, at once and below. A device
	// node is written on a read-only mount as well, so outside /dev no
	// device node opens either (a copy of a disk's node, say); /dev itself
	// then works as usual (writableDev).
	devMount := mountRoot("/dev")
	ro := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if devMount {
		ro.Attr_set |= unix.MOUNT_ATTR_NODEV
	}
	if err := unix.MountSetattr(unix.AT_FDCWD, "/", unix.AT_RECURSIVE, ro); err != nil {
		return nil, fmt.Errorf("make the file system outside the workspace read-only: %v%s", err, userNSHint(err))
	}
	if err := writableDev(devMount); err != nil {
		return nil, err
	}

	for i := range stack {
		p := &stack[i]
		err := attach(p.fd, p.at, p.isFile)
		p.fd = -1 // attach closed it
		if err != nil && p.must {
			return nil, fmt.Errorf("%s at %s: %v", p.why, p.at, err)
		}
		if err != nil {
			c.warn("%s: %v", p.why, err)
		}
		if p.at == "/tmp" || p.at == "/var/tmp" {
			private = append(private, p.at)
			if err := makeTmpdir(c.tmpdir, p.at, tmpdirMode); err != nil {
				c.warn("$TMPDIR %s: %v", c.tmpdir, err)
			}
		}
	}
	return private, nil
}

// openLock opens the lock file name in dir through a detached copy of
// dir's mount. A file open for writing (as a write lock needs) keeps its
// mount from becoming read-only (EBUSY), and every mount in view is about
// to; the copy is no mount the command can reach.
func openLock(dir, name string) (*os.File, error) {
	m, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return nil, err
	}
	defer unix.Close(m)
	fd, err := unix.Openat(m, name, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(dir, name)), nil
}

// usableHome is the real path of the $HOME the scratch layer goes over,
// if there is one to go over: not /, nor a private /tmp itself, nor in
// the state dir.
func (c confinement) usableHome() (string, bool) {
	if c.home == "" || !filepath.IsAbs(c.home) {
		return "", false
	}
	home, err := filepath.EvalSymlinks(c.home)
	if err != nil {
		return "", false // no such directory: nothing there to protect or use
	}
	if st, err := os.Stat(home); err != nil || !st.IsDir() {
		return "", false
	}
	if home == "/" || home == "/tmp" || home == "/var/tmp" || within(home, c.state) {
		return "", false
	}
	return home, true
}

// homeLayer mounts the scratch layer over home, detached: overlayfs with
// the real home as its read-only lower layer and the mount's layer in the
// state dir as its upper. Only one run mounts that layer at a time: two
// overlay mounts of one upper dir do not see each other's new files (the
// kernel caches lookups per mount) and fail with ESTALE where they meet.
// A run that starts while another holds it gets a layer of its own on a
// tmpfs, which ends with it.
func homeLayer(state, home string, warn func(string, ...any)) (int, error) {
	st, err := os.Stat(home)
	if err != nil {
		return -1, err
	}
	dir := homeLayerDir(state, home)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return -1, err
	}
	lk, err := openLock(dir, "lock")
	if err != nil {
		return -1, err
	}
	held = append(held, lk)
	mine, err := lock(lk, unix.F_WRLCK, false)
	if err != nil {
		return -1, err
	}
	if !mine {
		warn("another run of this mount holds the scratch layer over $HOME: what this one writes under %s is kept only until it ends", home)
		return privateHomeLayer(home, st.Mode())
	}
	if err := os.WriteFile(filepath.Join(dir, homePathFile), []byte(home+"\n"), 0o600); err != nil {
		return -1, err
	}
	upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return -1, err
		}
	}
	// The layer's root is what the command sees as $HOME itself.
	if err := os.Chmod(upper, st.Mode().Perm()); err != nil {
		return -1, err
	}
	return overlay(home, upper, work)
}

// privateHomeLayer is a layer over home on a tmpfs of this run's own.
func privateHomeLayer(home string, mode os.FileMode) (int, error) {
	t, err := newMount("tmpfs", map[string]string{"mode": "0700"}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, err
	}
	defer unix.Close(t)
	for _, d := range []string{"upper", "work"} {
		if err := unix.Mkdirat(t, d, 0o700); err != nil {
			return -1, err
		}
	}
	if err := unix.Fchmodat(t, "upper", uint32(mode.Perm()), 0); err != nil {
		return -1, err
	}
	// The tmpfs has no path: reach it through this process's descriptor
	// (the host's /proc is still mounted).
	root := fmt.Sprintf("/proc/self/fd/%d", t)
	return overlay(home, root+"/upper", root+"/work")
}

// overlay makes a detached overlay mount of upper over lower. userxattr
// keeps overlayfs's marks in user.overlay.* xattrs, which a user namespace
// may write; every run uses it, so the marks read the same whoever mounts.
func overlay(lower, upper, work string) (int, error) {
	fd, err := newMount("overlay", map[string]string{
		"source":    "stagefs-scratch", // its name in mountinfo
		"lowerdir":  escapeLayer(lower),
		"upperdir":  escapeLayer(upper),
		"workdir":   escapeLayer(work),
		"userxattr": "",
	}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("overlayfs: %v%s", err, overlayHint(err))
	}
	return fd, nil
}

// escapeLayer escapes the characters overlayfs reads as separators in a
// layer's path.
func escapeLayer(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `:`, `\:`, `,`, `\,`)
	return r.Replace(p)
}

// overlayHint says what to do when overlayfs refuses.
func overlayHint(err error) string {
	switch {
	case errors.Is(err, unix.ENODEV):
		return " (this kernel has no overlayfs: load the overlay module)"
	case errors.Is(err, unix.EPERM) && os.Getuid() != 0:
		return " (this kernel does not let a user namespace mount overlayfs: that needs Linux 5.11 or later, and no policy (AppArmor, SELinux) that forbids it)"
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP):
		return " (the state dir's file system may not hold an overlayfs upper layer (it needs user xattrs: ext4, xfs, btrfs, tmpfs on Linux 6.6+): choose another --state)"
	}
	return ""
}

// newMount makes a detached mount of a new file system of type fstype
// with options opts ("" for a flag). The kernel's own words on a failure
// (read from the file system context) go in the error.
func newMount(fstype string, opts map[string]string, attrs int) (int, error) {
	fs, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, err
	}
	defer unix.Close(fs)
	// Options in a fixed order, so that a failure reads the same each time.
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if v := opts[k]; v == "" {
			err = unix.FsconfigSetFlag(fs, k)
		} else {
			err = unix.FsconfigSetString(fs, k, v)
		}
		if err != nil {
			return -1, fmt.Errorf("option %s: %w%s", k, err, fsLog(fs))
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("%w%s", err, fsLog(fs))
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("%w%s", err, fsLog(fs))
	}
	return m, nil
}

// fsLog reads the messages the kernel left in a file system context.
func fsLog(fs int) string {
	var msgs []string
	buf := make([]byte, 512)
	for i := 0; i < 8; i++ {
		n, err := unix.Read(fs, buf)
		if err != nil || n <= 0 {
			break
		}
		// "e overlayfs: ..." for an error, "w ..." for a warning.
		msgs = append(msgs, strings.TrimSpace(string(buf[:n])))
	}
	if len(msgs) == 0 {
		return ""
	}
	return " [" + strings.Join(msgs, "; ") + "]"
}

// clone makes a detached copy of the mount tree at p (p and every mount
// below it), with the attributes they have now.
func clone(p string) (int, error) {
	return unix.OpenTree(unix.AT_FDCWD, p, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE)
}

// noDevClone is clone with no device node that opens: for the places a
// command writes, where root (with CAP_MKNOD where there is no user
// namespace) could make one.
func noDevClone(p string) (int, error) {
	fd, err := clone(p)
	if err != nil {
		return -1, err
	}
	nodev := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, nodev); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// readOnlyClone is clone, read-only.
func readOnlyClone(p string) (int, error) {
	fd, err := clone(p)
	if err != nil {
		return -1, err
	}
	ro := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, ro); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// attach puts the detached mount fd on at, making at first if it is
// missing (a directory, or an empty file for a file), and closes fd.
// at is reached without following any symlink: the private /tmp is kept
// between runs, and a link a command left there must not move where the
// next run's mounts go.
func attach(fd int, at string, isFile bool) error {
	defer unix.Close(fd)
	if _, err := os.Lstat(at); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(at), 0o755); err != nil {
			return err
		}
		if isFile {
			f, err := os.OpenFile(at, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
			if err != nil {
				return err
			}
			f.Close()
		} else if err := os.Mkdir(at, 0o755); err != nil {
			return err
		}
	}
	t, err := unix.Openat2(unix.AT_FDCWD, at, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return fmt.Errorf("reach %s without symlinks: %v", at, err)
	}
	defer unix.Close(t)
	return unix.MoveMount(fd, "", t, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
}

// writableDev keeps /dev working as usual: its device nodes open again
// (devMount: /dev is a mount of its own, made nodev with the rest), /dev/pts
// (terminals: grantpt, script) is writable, and /dev/shm (POSIX shared
// memory, which makes files) is a tmpfs of this namespace's own, not the
// host's. /dev stays read-only: no node can be made, removed or chmodded.
func writableDev(devMount bool) error {
	if devMount {
		clr := &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_NODEV}
		if err := unix.MountSetattr(unix.AT_FDCWD, "/dev", 0, clr); err != nil {
			return fmt.Errorf("let /dev's device nodes open: %v", err)
		}
	}
	if mountRoot("/dev/pts") {
		clr := &unix.MountAttr{Attr_clr: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NODEV}
		if err := unix.MountSetattr(unix.AT_FDCWD, "/dev/pts", 0, clr); err != nil {
			return fmt.Errorf("make /dev/pts writable: %v", err)
		}
	}
	if st, err := os.Lstat("/dev/shm"); err == nil && st.IsDir() {
		if err := unix.Mount("shm", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return fmt.Errorf("mount a /dev/shm of the sandbox's own: %v", err)
		}
	}
	return nil
}

// mountRoot reports whether p is the root of a mount.
func mountRoot(p string) bool {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, 0, &stx); err != nil {
		return false
	}
	return stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}

// makeTmpdir makes $TMPDIR in the private place at when it lies there.
func makeTmpdir(tmpdir, at string, mode os.FileMode) error {
	if tmpdir == "" || !filepath.IsAbs(tmpdir) || !within(filepath.Clean(tmpdir), at) {
		return nil
	}
	tmpdir = filepath.Clean(tmpdir)
	if _, err := os.Lstat(tmpdir); err == nil {
		return nil
	}
	if err := os.MkdirAll(tmpdir, 0o700); err != nil {
		return err
	}
	return os.Chmod(tmpdir, mode)
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// warnf writes a warning where the command's errors go.
func warnf(w io.Writer) func(string, ...any) {
	return func(format string, a ...any) {
		fmt.Fprintf(w, "stagefs run: warning: "+format+"\n", a...)
	}
}
