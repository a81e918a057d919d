package main

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
)

// mount(8) and /etc/fstab: `mount -t fuse.leasefs SERVER:PORT[,...] DIR -o
// token_file=FILE[,...]` runs mount.fuse3, which runs `leasefs SOURCE DIR
// -o OPTIONS`; linked as /sbin/mount.fuse.leasefs, mount(8) runs this
// binary directly as `mount.fuse.leasefs SOURCE DIR [-sfnv] [-o OPTIONS]`.
// Either way it mounts in the background and returns once the file system
// is there, as mount(8) expects of a helper.

// mountOptions maps a fstab option to the mount flag it sets; options
// with a value take it as the flag's.
var mountOptions = map[string]string{
	"token_file":       "--token-file",
	"cache_mib":        "--cache-mib",
	"soft_timeout":     "--soft-timeout",
	"failover_timeout": "--failover-timeout",
	"dial_timeout":     "--dial-timeout",
	"stop_timeout":     "--stop-timeout",
	"cpus":             "--cpus",
	"log_file":         "--log-file",
	"log_level":        "--log-level",
	"log_format":       "--log-format",
	"ro":               "--read-only",
	"allow_stacked":    "--allow-stacked",
	"metrics":          "--metrics",
	"subdir":           "--subdir",
}

// ignoredOptions are fstab options for mount(8), systemd or the kernel's
// defaults: a leasefs mount never honours set-user-id bits or device
// files (nosuid and nodev always).
var ignoredOptions = []string{"defaults", "rw", "auto", "noauto", "user", "users", "nouser", "owner", "group",
	"_netdev", "nofail", "dev", "nodev", "suid", "nosuid", "exec", "sync", "async", "atime", "noatime", "relatime"}

// isMountHelper reports whether the command line is mount(8)'s or
// mount.fuse3's rather than a leasefs command.
func isMountHelper(argv []string) bool {
	base := filepath.Base(argv[0])
	if strings.HasPrefix(base, "mount.") {
		return true
	}
	if len(argv) < 3 || strings.HasPrefix(argv[1], "-") {
		return false
	}
	return !slices.ContainsFunc(commands, func(c command) bool { return c.name == argv[1] }) && strings.Contains(argv[1], ":")
}

// mountHelperArgs turns a helper's command line (SOURCE DIR and options)
// into the arguments of `leasefs mount --background`; fake is mount -f's
// "do everything but mount".
func mountHelperArgs(args []string) (mountArgs []string, fake bool, err error) {
	var pos, opts []string
	for i := 0; i < len(args); i++ {
		switch a := args[i]; {
		case a == "-o" || a == "-t" || a == "-N":
			if i+1 == len(args) {
				return nil, false, fmt.Errorf("%s needs a value", a)
			}
			i++
			switch a {
			case "-o":
				opts = append(opts, strings.Split(args[i], ",")...)
			case "-N":
				return nil, false, fmt.Errorf("-N (another mount namespace) is not supported")
			}
		case strings.HasPrefix(a, "-o"):
			opts = append(opts, strings.Split(a[2:], ",")...)
		case a == "-f":
			fake = true
		case a == "-n" || a == "-s" || a == "-v":
		case strings.HasPrefix(a, "-"):
			return nil, false, fmt.Errorf("unknown option %s", a)
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return nil, false, fmt.Errorf("want SERVER:PORT[,SERVER:PORT...] MOUNTPOINT, got %q", pos)
	}
	mountArgs = []string{"--background", "--server", pos[0]}
	for _, o := range opts {
		key, val, hasVal := strings.Cut(o, "=")
		flag, ok := mountOptions[key]
		switch {
		case o == "" || slices.Contains(ignoredOptions, o) || strings.HasPrefix(key, "x-") || key == "comment":
		case !ok:
			return nil, false, fmt.Errorf("unknown mount option %q (leasefs takes %s, and ignores %s, x-* and comment=)",
				o, strings.Join(slices.Sorted(maps.Keys(mountOptions)), ", "), strings.Join(ignoredOptions, ", "))
		case hasVal:
			mountArgs = append(mountArgs, flag, val)
		default:
			mountArgs = append(mountArgs, flag)
		}
	}
	return append(mountArgs, pos[1]), fake, nil
}

// runMountHelper mounts as mount(8) asks.
func runMountHelper(args []string) error {
	mountArgs, fake, err := mountHelperArgs(args)
	if err != nil || fake {
		return err
	}
	quietBackground = true // mount(8) says nothing on success
	return runMount(mountArgs)
}
